"""Matplotlib rendering of swarm episodes (2-D, or the x-y projection of 3-D)."""

from __future__ import annotations

import numpy as np

from jaxrl_reason.envs.swarm.dynamics import NUM_ROLES, ROLE_NAMES

ROLE_COLORS = ("tab:purple", "tab:orange", "tab:blue")


def draw(ax, env, state, action=None, trail=None, title: str = "") -> None:
    """Draw one state (numpy/jax ``SwarmState``, unbatched) on ``ax``."""
    c = env.config
    pos, alive = np.asarray(state.pos), np.asarray(state.alive)
    tp, urg, served = np.asarray(state.target_pos), np.asarray(state.urgency), np.asarray(state.served)
    for j in range(len(tp)):
        ax.add_patch(_circle(tp[j], c.cover_radius, "tab:green" if served[j] else "tab:red", 0.15 + 0.4 * urg[j]))
        ax.annotate(f"T{j}", tp[j, :2], fontsize=7, ha="center", va="center")
    for o in np.asarray(state.obstacles):
        ax.add_patch(_circle(o, c.obstacle_radius, "gray", 0.6))
    if trail is not None:
        for i in range(pos.shape[0]):
            ax.plot(trail[:, i, 0], trail[:, i, 1], lw=0.6, color="k", alpha=0.3)
    roles = (np.asarray(action) % NUM_ROLES) if action is not None else np.full(len(pos), 2)
    for i in range(len(pos)):
        ax.scatter(pos[i, 0], pos[i, 1], s=30, marker="^" if alive[i] else "x", color=ROLE_COLORS[roles[i]])
    adv = np.asarray(state.adv_pos)
    ax.scatter(adv[:, 0], adv[:, 1], s=50, marker="D", color="k")
    ax.set(xlim=(-1, 1), ylim=(-1, 1), aspect="equal", xticks=[], yticks=[])
    ax.set_title(title, fontsize=8)


def _circle(xy, r, color, alpha):
    import matplotlib.patches as mpatches

    return mpatches.Circle(tuple(np.asarray(xy)[:2]), r, color=color, alpha=alpha)


def frame_strip(env, states, actions, path, num_frames: int = 6, alive=None, title: str = "") -> None:
    """Save a PNG strip of ``num_frames`` evenly spaced frames of a recorded episode
    (``states`` stacked over time with the initial state first, ``actions`` ``[T, N]``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.lines as mlines
    import matplotlib.pyplot as plt

    T = int(np.asarray(alive).sum()) if alive is not None else np.asarray(actions).shape[0]
    idx = np.linspace(0, max(T, 1), num_frames).astype(int)
    pos = np.asarray(states.pos)
    fig, axes = plt.subplots(1, num_frames, figsize=(2.2 * num_frames, 2.5))
    for ax, t in zip(np.atleast_1d(axes), idx):
        s = type(states)(*[np.asarray(getattr(states, f))[t] for f in states.__dataclass_fields__])
        a = np.asarray(actions)[max(t - 1, 0)] if t > 0 else None
        draw(ax, env, s, a, trail=pos[: t + 1], title=f"t={t}")
    handles = [mlines.Line2D([], [], color=col, marker="^", ls="", label=name)
               for col, name in zip(ROLE_COLORS, ROLE_NAMES)]
    handles.append(mlines.Line2D([], [], color="k", marker="D", ls="", label="pursuer"))
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
