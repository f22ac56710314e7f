"""Throughput: our Hanabi vs JaxMARL's, side by side in one process (see docs/benchmarks.md).

Both run a jitted ``lax.scan`` of T steps over a vmapped batch of B games
taking uniformly random legal actions, with auto-reset, consuming a checksum
of observations and rewards (the whole obs is summed, so nothing is dead code).
Ours: the headline is the public path, ``jax.vmap(envs.AutoReset(env).step)`` over split keys
(AutoReset's batched program); with ``"batch"`` in ``stepping`` also ``AutoReset.batch_step``
(one key per step).
Every implementation is compiled and warmed up first, then all are timed in turn
(ours and JaxMARL alternately, ``repeats`` rounds) and the median call is reported:
timing one after the other on a shared machine makes the ratio depend on the load.
steps/s = B*T / median seconds. JaxMARL is optional (the ``bench`` extra).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxrl_reason import envs
from jaxrl_reason.utils import timing
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Config:
    batch_sizes: tuple[int, ...] = (4096,)
    steps: int = 100
    num_players: int = 2
    obs_modes: tuple[str, ...] = ("canonical", "belief", "compact")
    stepping: tuple[str, ...] = ("vmap", "batch")  # vmap(AutoReset.step) (the headline) and batch_step
    repeats: int = 5  # interleaved timed rounds (the median call is reported)
    jaxmarl: bool = True

    def __post_init__(self):
        check_hyperparameters(self)
        if not self.batch_sizes or min(self.batch_sizes) < 1 or self.steps < 1 or self.repeats < 1:
            raise ValueError("batch_sizes must be non-empty and positive; steps, repeats >= 1")
        if not self.obs_modes:
            raise ValueError("obs_modes must name at least one observation mode")
        if "vmap" not in self.stepping or not set(self.stepping) <= {"vmap", "batch"}:
            raise ValueError(f"stepping must contain 'vmap' (the headline) and may add 'batch', got {self.stepping}")


PRESETS = {
    "cpu": Config(),
    "gpu": Config(batch_sizes=(4096, 65536), steps=100, repeats=5),
}


def ours_rollout(env, batch: int, steps: int, stepping: str = "vmap"):
    """Carries (state, legal mask, current player) like the anchor carries its state; the
    observation is consumed through the checksum every step. ``stepping``: ``"vmap"``
    (``jax.vmap(step)`` over split keys) or ``"batch"`` (``batch_step``, one key per step)."""
    wrapped = envs.AutoReset(env)

    def body(carry, _):
        key, state, legal, player = carry
        key, k_act, k_step = jax.random.split(key, 3)
        mine = jnp.take_along_axis(legal, player[:, None, None], axis=1)[:, 0]
        act = jax.random.categorical(k_act, jnp.where(mine, 0.0, -1e9)).astype(jnp.int32)
        if stepping == "vmap":
            state, ts = jax.vmap(wrapped.step)(jax.random.split(k_step, batch), state, act)
        else:
            state, ts = wrapped.batch_step(k_step, state, act)
        chk = ts.obs.sum() + ts.reward.sum()
        return (key, state, ts.legal_action_mask, ts.current_player), (ts.done.sum(), chk)

    @jax.jit
    def rollout(key):
        if stepping == "vmap":
            state, ts = jax.vmap(wrapped.reset)(jax.random.split(key, batch))
        else:
            state, ts = wrapped.batch_reset(key, batch)
        carry = (key, state, ts.legal_action_mask, ts.current_player)
        _, (dones, chk) = jax.lax.scan(body, carry, None, steps)
        return dones.sum(), chk.sum()

    return rollout


def jaxmarl_rollout(num_players: int, batch: int, steps: int):
    import jaxmarl

    env = jaxmarl.make("hanabi", num_agents=num_players)
    agents = env.agents

    def body(carry, _):
        key, state = carry
        key, k_act, k_step = jax.random.split(key, 3)
        avail = jax.vmap(env.get_legal_moves)(state)
        acts = {}
        for a, k in zip(agents, jax.random.split(k_act, len(agents))):
            acts[a] = jax.random.categorical(k, jnp.where(avail[a], 0.0, -1e9))
        obs, state, rew, done, _ = jax.vmap(env.step)(jax.random.split(k_step, batch), state, acts)
        chk = sum(o.sum() for o in obs.values()) + sum(r.sum() for r in rew.values())
        return (key, state), (done["__all__"].sum(), chk)

    @jax.jit
    def rollout(key):
        _, state = jax.vmap(env.reset)(jax.random.split(key, batch))
        _, (dones, chk) = jax.lax.scan(body, (key, state), None, steps)
        return dones.sum(), chk.sum()

    return rollout


def run(config: Config, run_dir: RunDir | None = None) -> dict:
    rows, summary = [], {"device": jax.devices()[0].platform, "repeats": config.repeats}
    for batch in config.batch_sizes:
        rollouts = {}
        if config.jaxmarl:
            try:
                rollouts["jaxmarl"] = jaxmarl_rollout(config.num_players, batch, config.steps)
            except ImportError:
                print("jaxmarl is not installed (pip install '.[bench]'): measuring ours only")
        for mode in config.obs_modes:
            env = envs.make("hanabi", num_players=config.num_players, obs_mode=mode)
            for stepping in config.stepping:
                rollouts[(mode, stepping)] = ours_rollout(env, batch, config.steps, stepping)
        times = timing.interleaved({k: (lambda i, ro=ro: ro(jax.random.key(i))) for k, ro in rollouts.items()},
                                   config.repeats)
        sps = {name: batch * config.steps / t.median for name, t in times.items()}
        ref = sps.get("jaxmarl")
        for name, value in sps.items():
            ratio = value / ref if ref else float("nan")
            if name == "jaxmarl":
                impl, obs, key = "jaxmarl", "belief", f"jaxmarl_B{batch}"
            else:  # the headline keeps the keys ours_{obs}_B / ratio_{obs}_B
                obs, stepping = name
                impl, tag = ("ours", "") if stepping == "vmap" else ("ours batch_step", "batch_step_")
                key = f"ours_{tag}{obs}_B{batch}"
                summary[f"ratio_{tag}{obs}_B{batch}"] = ratio
            rows.append({"impl": impl, "obs": obs, "B": batch, "steps_per_s": value, "ratio": ratio,
                         "min_s": times[name].best, "max_s": max(times[name].wall)})
            summary[key] = value
    for r in rows:
        print(f"{r['impl']:15s} {r['obs']:9s} B={r['B']:6d} {r['steps_per_s']:14,.0f} steps/s (median)  "
              f"ratio {r['ratio']:.2f}  call {r['min_s']:.2f}-{r['max_s']:.2f} s")
    if run_dir is not None:
        run_dir.write_table("throughput", rows)
    return summary



def record(summary: dict) -> list[dict]:
    """The figures ``--record PATH`` writes: each ratio to JaxMARL (whose observation is the belief one, so the
    belief row is the like-for-like comparison), n = the timed rounds."""
    return [{"name": f"ours / JaxMARL, {k.removeprefix('ratio_')}", "value": v, "se": None, "n": summary["repeats"],
             "unit": "x"} for k, v in summary.items() if k.startswith("ratio_")]

if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
