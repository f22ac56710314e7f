"""The RALLY comparison of ``experiments/rally.py`` (its config, presets and run stay there): each learner trained in
its own sub-run, RMIX from a prior, the LLM intent policy's LM, every method played on the same episodes with paired
differences to the baselines, and the figures. ``config`` is the experiment's config (duck-typed).

    state = train(run_dir, "qmix", trainer, key, num_chunks, steps_per_chunk)    # <run>/qmix/: metrics, resume
    (policy_fn, carry), env_steps = train_rmix(config, settings, run_dir, "rmix", env, prior, key)
    rows = compare(config, env, policies, env_steps, key, privileged=("prior_lookahead",))
    plot_curves(run_dir, learners, budget); plot_bars(run_dir, rows); show_best(run_dir, env, rows, policies, key)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.agents.rally import evaluate as rally_eval
from jaxrl_reason.agents.rally import rmix
from jaxrl_reason.agents.rally.intent import act
from jaxrl_reason.envs.swarm import render
from jaxrl_reason.models.tokenizer import ByteTokenizer
from jaxrl_reason.utils.experiment import RunDir, read_metrics
from jaxrl_reason.utils.loop import run_chunks


def train(run_dir: RunDir, name: str, trainer, key, num_chunks: int, steps_per_chunk: int):
    """A chunked trainer run in ``run_dir/<name>`` (metrics, checkpoints, exact resume) -> its final state."""
    sub = run_dir.child(name)
    state = run_chunks(sub, jax.jit(trainer.init)(key), jax.jit(trainer.update), num_chunks,
                       steps_per_chunk=steps_per_chunk, desc=name)
    sub.close()
    return state


def train_rmix(config, settings, run_dir: RunDir, name: str, env, prior, key):
    """RMIX from ``prior``'s transitions -> ((greedy policy_fn, carry), env steps taken)."""
    cfg = settings.qmix_config(config.qmix)
    trainer = rmix.make_chunked(cfg, env, prior, roles_only=settings.roles_only)
    state = train(run_dir, name, trainer, key, cfg.num_chunks, cfg.iters_per_chunk)
    policy = rmix.greedy_policy(cfg, env, trainer.graphdef, state.params, prior, roles_only=settings.roles_only)
    return policy, int(state.env_steps)


def intent_lm(config) -> dict:
    """The LLM intent policy's ``tokenizer`` (and ``model``, with ``--model``): a checkpoint's own (its tokenizer
    must spell the digits and letters a-z as single tokens), else the byte tokenizer (prompts are ASCII, answers
    one letter) for a fresh small LM."""
    if config.model is None:
        return {"tokenizer": ByteTokenizer()}
    from jaxrl_reason.models.lm import load_model, load_tokenizer

    return {"tokenizer": load_tokenizer(config.model), "model": load_model(config.model)}


def intent_fn(policy):
    """An intent policy (``act``) as a swarm policy: (policy_fn, init carry)."""
    return (lambda carry, key, ts: (carry, act(policy, key, ts))), jnp.zeros(())


def compare(config, env, policies: dict, env_steps: dict, key, privileged: tuple = ()) -> list[dict]:
    """Every policy ({name: (policy_fn, carry)}) plays the same ``config.eval_episodes`` episodes (same key) -> rows:
    env steps, mean return and its SEM, coverage, served, captured, and the paired return differences (and SEM) to
    each of ``config.baselines`` that ran. ``privileged``: policies that read the environment state."""
    rows, returns = [], {}
    sem = lambda x: float(x.std() / np.sqrt(x.size))
    for name, (fn, carry) in policies.items():
        stats = jax.jit(functools.partial(rally_eval.play, env, fn, num_episodes=config.eval_episodes,
                                          with_state=name in privileged))(carry, key)
        stats = {k: np.asarray(v) for k, v in stats.items()}
        returns[name] = stats["return"]
        rows.append({"method": name, "env_steps": env_steps[name],
                     "mean_return": float(stats["return"].mean()), "return_sem": sem(stats["return"]),
                     "coverage": float(stats["coverage"].mean()), "served": float(stats["served"].mean()),
                     "captured": float(stats["captured"].mean())})
    # every method plays the same episodes (same key): paired differences to each baseline that ran
    for base in (b for b in config.baselines if b in returns):
        for row in rows:
            diff = returns[row["method"]] - returns[base]
            row.update({f"vs_{base}": float(diff.mean()), f"vs_{base}_sem": sem(diff)})
    return rows


def show_best(run_dir: RunDir, env, rows: list[dict], policies: dict, key, exclude: tuple = ()) -> str:
    """One episode of the best learned method (by mean return; the methods in ``exclude`` only when nothing else
    ran) drawn in ``episode_strip.png`` -> its name."""
    learned = [r for r in rows if r["method"] not in exclude] or rows
    best = max(learned, key=lambda r: r["mean_return"])["method"]
    fn, carry = policies[best]
    states, actions, alive = jax.jit(functools.partial(rally_eval.record, env, fn))(carry, key)
    render.frame_strip(env, jax.device_get(states), np.asarray(actions), run_dir.path / "episode_strip.png",
                       alive=np.asarray(alive), title=f"one episode, {best}")
    return best


def plot_curves(run_dir: RunDir, methods, budget):
    """``learning_curves.png``: each learner's training episode return (a moving mean) over environment steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for name in methods:
        rows = read_metrics(run_dir.path / name / "metrics.jsonl")
        pts = sorted((r["env_steps"], r["episode_return"]) for r in rows  # rows where episodes ended
                     if "episode_return" in r and r.get("episodes", 1) > 0)
        if pts:
            x, y = map(np.asarray, zip(*pts))
            k = max(1, len(y) // 20)
            ax.plot(x[k - 1:], np.convolve(y, np.ones(k) / k, "valid"), label=name)
    ax.set(xlabel="environment steps", ylabel="training episode return", xlim=(0, budget))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(run_dir.path / "learning_curves.png", dpi=120)
    plt.close(fig)


def plot_bars(run_dir: RunDir, rows):
    """``results.png``: each method's mean return (with SEM), coverage and captures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3))
    names = [r["method"] for r in rows]
    for ax, key in zip(axes, ("mean_return", "coverage", "captured")):
        ax.bar(names, [r[key] for r in rows],
               yerr=[r["return_sem"] for r in rows] if key == "mean_return" else None)
        ax.set_title(key)
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(run_dir.path / "results.png", dpi=120)
    plt.close(fig)
