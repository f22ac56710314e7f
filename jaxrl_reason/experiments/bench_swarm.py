"""Throughput: our UAV swarm vs JaxMARL MPE simple_tag at equal agent counts, side by side.

Same method as docs/benchmarks.md / experiments/anchors/bench_jaxmarl_mpe.py: a jitted ``lax.scan``
of T steps over a vmapped batch of B environments taking uniformly random discrete
actions, with auto-reset (JaxMARL: its own), consuming a checksum of observations and rewards.
Ours: the headline is the public path, ``jax.vmap(envs.AutoReset(env).step)`` over ``split(k, B)``
keys (AutoReset's batched program), beside it ``AutoReset.batch_step`` (one key per step). One
warm-up call each, then ``repeats`` timed calls of ours and the anchor INTERLEAVED, so all see the
same machine load (the 2-core dev machine is shared); the MEDIAN call time of each gives steps/s,
and the ratio is ours / anchor. Our episodes last ``max_steps`` (100) unless every UAV is captured
or every target served (simple_tag's last 25 steps); JaxMARL computes a reset every step, ours only on
the steps where an episode ended.
Where the anchor fails at a size (error or out of memory) the row reports ours alone.
steps/s = B*T / seconds; agent-steps/s = N * steps/s. For N agents, simple_tag gets
N/4 evaders and 3N/4 pursuers (the default 1:3 ratio, 2 obstacles); ours N UAVs,
3 targets, 1 pursuer, neighbour messages from the 3 nearest UAVs.
"""

from __future__ import annotations

import dataclasses

import time

import jax
import numpy as np

from jaxrl_reason import envs
from jaxrl_reason.utils import timing
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Config:
    agent_counts: tuple[int, ...] = (4, 16, 64, 256)
    batch: int = 4096  # environments at N=4; larger N use batch * 4 // N (at least min_batch)
    min_batch: int = 64
    batches: tuple[int, ...] = ()  # explicit environments per agent count (overrides batch/min_batch)
    steps: int = 100
    repeats: int = 5
    jaxmarl: bool = True
    swarm_kwargs: tuple[tuple[str, object], ...] = ()  # extra SwarmConfig fields

    def __post_init__(self):
        check_hyperparameters(self)
        if not self.agent_counts or min(self.agent_counts) < 4 or any(n % 4 for n in self.agent_counts):
            raise ValueError(f"agent_counts must be multiples of 4 (>= 4), got {self.agent_counts}")
        if self.batch < 1 or self.min_batch < 1 or self.steps < 1 or self.repeats < 1:
            raise ValueError("batch, min_batch, steps, repeats must be >= 1")
        if self.batches and (len(self.batches) != len(self.agent_counts) or min(self.batches) < 1):
            raise ValueError(f"batches {self.batches} must give one positive batch per agent count "
                             f"{self.agent_counts}")


PRESETS = {
    # the 2-core CPU: B=4096 at 4 agents (the target's setting), fewer environments for large N so
    # that one timed call stays ~10-30 s; 3 interleaved calls each
    "cpu": Config(batches=(4096, 1024, 64, 16), repeats=3),
    "gpu": Config(agent_counts=(4, 16, 64, 256), batch=65536, min_batch=1024, repeats=3),
}


def batch_for(config: Config, n: int) -> int:
    if config.batches:
        return config.batches[config.agent_counts.index(n)]
    return max(config.min_batch, config.batch * 4 // n)


def ours_rollout(env: envs.Environment, batch: int, steps: int, stepping: str = "vmap"):
    """Random discrete actions on ``envs.AutoReset(env)``: ``jax.vmap(step)`` over split keys (``"vmap"``)
    or ``batch_step`` with one key per step (``"batch"``)."""
    wrapped = envs.AutoReset(env)
    if stepping not in ("vmap", "batch"):
        raise ValueError(f"stepping must be 'vmap' or 'batch', got {stepping!r}")

    def body(carry, _):
        key, state = carry
        key, k_act, k_step = jax.random.split(key, 3)
        act = jax.random.randint(k_act, (batch, env.num_agents), 0, env.num_actions)
        if stepping == "vmap":
            state, ts = jax.vmap(wrapped.step)(jax.random.split(k_step, batch), state, act)
        else:
            state, ts = wrapped.batch_step(k_step, state, act)
        return (key, state), ts.obs.sum() + ts.reward.sum()

    @jax.jit
    def rollout(key):
        if stepping == "vmap":
            state, _ = jax.vmap(wrapped.reset)(jax.random.split(key, batch))
        else:
            state, _ = wrapped.batch_reset(key, batch)
        _, chk = jax.lax.scan(body, (key, state), None, steps)
        return chk.sum()

    return rollout


def jaxmarl_rollout(num_agents: int, batch: int, steps: int):
    import jaxmarl

    env = jaxmarl.make("MPE_simple_tag_v3", num_good_agents=num_agents // 4,
                       num_adversaries=3 * num_agents // 4)

    def body(carry, _):
        key, state = carry
        key, k_act, k_step = jax.random.split(key, 3)
        ks = jax.random.split(k_act, env.num_agents)
        acts = {a: jax.random.randint(k, (batch,), 0, env.action_space(a).n) for a, k in zip(env.agents, ks)}
        obs, state, rew, done, info = jax.vmap(env.step)(jax.random.split(k_step, batch), state, acts)
        return (key, state), sum(o.sum() for o in obs.values()) + sum(r.sum() for r in rew.values())

    @jax.jit
    def rollout(key):
        _, state = jax.vmap(env.reset)(jax.random.split(key, batch))
        _, chk = jax.lax.scan(body, (key, state), None, steps)
        return chk.sum()

    return rollout


def time_rollout(rollout, batch: int, steps: int, repeats: int) -> float:
    """Best steps/s over ``repeats`` timed calls after one warm-up (notebook 06)."""
    rollout(jax.random.key(0)).block_until_ready()
    best = np.inf
    for r in range(repeats):
        t = time.perf_counter()
        rollout(jax.random.key(r + 1)).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return batch * steps / best


def time_pair(rollouts, batch: int, steps: int, repeats: int) -> list[float]:
    """Median steps/s of each rollout, timed calls interleaved after one warm-up each."""
    t = timing.interleaved({str(k): (lambda i, ro=ro: ro(jax.random.key(i))) for k, ro in enumerate(rollouts)}, repeats)
    return [batch * steps / t[str(k)].median for k in range(len(rollouts))]


def anchor_rollout(num_agents: int, batch: int, steps: int):
    """JaxMARL's rollout, or ``None`` (with the reason printed) where it cannot run at this size."""
    try:
        rollout = jaxmarl_rollout(num_agents, batch, steps)
        rollout(jax.random.key(0)).block_until_ready()  # compile and run once here
        return rollout
    except Exception as e:  # noqa: BLE001 - any failure of the optional anchor drops its column
        print(f"JaxMARL simple_tag with {num_agents} agents, B={batch}: not run ({type(e).__name__}: {e})")
        return None


def run(config: Config, run_dir: RunDir) -> dict:
    rows = []
    for n in config.agent_counts:
        b = batch_for(config, n)
        env = envs.make("swarm", num_agents=n, **dict(config.swarm_kwargs))
        rollouts = [ours_rollout(env, b, config.steps, "vmap"), ours_rollout(env, b, config.steps, "batch")]
        anchor = anchor_rollout(n, b, config.steps) if config.jaxmarl else None
        if anchor is not None:
            rollouts.append(anchor)
        rates = time_pair(rollouts, b, config.steps, config.repeats)
        ours, batched = rates[0], rates[1]
        row = {"agents": n, "B": b, "T": config.steps, "obs_dim": env.obs_shape[0],
               "swarm_steps_per_s": round(ours), "swarm_agent_steps_per_s": round(ours * n),
               "batch_step_steps_per_s": round(batched),
               "jaxmarl_steps_per_s": None, "jaxmarl_agent_steps_per_s": None, "ratio": None, "batch_step_ratio": None}
        if anchor is not None:
            row.update(jaxmarl_steps_per_s=round(rates[2]), jaxmarl_agent_steps_per_s=round(rates[2] * n),
                       ratio=round(ours / rates[2], 2), batch_step_ratio=round(batched / rates[2], 2))
        print(row, flush=True)
        rows.append(row)
        run_dir.log(n, row)
    print(run_dir.write_table("throughput", rows))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ns = [r["agents"] for r in rows]
    ax.plot(ns, [r["swarm_agent_steps_per_s"] for r in rows], "o-", label="ours (swarm, vmap(step))")
    anchored = [r for r in rows if r["jaxmarl_agent_steps_per_s"] is not None]
    if anchored:
        ax.plot([r["agents"] for r in anchored], [r["jaxmarl_agent_steps_per_s"] for r in anchored], "s--",
                label="JaxMARL simple_tag")
    ax.set(xscale="log", yscale="log", xlabel="agents per environment N", ylabel="agent-steps/s",
           title=f"random play, auto-reset ({jax.devices()[0].platform})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(run_dir.path / "agent_steps_vs_n.png", dpi=120)
    plt.close(fig)
    summary = {"rows": rows, "platform": jax.devices()[0].platform, "run_dir": str(run_dir.path)}
    run_dir.save_json("summary.json", summary)
    return summary


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
