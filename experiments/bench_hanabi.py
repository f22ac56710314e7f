"""Throughput: our Hanabi vs JaxMARL's, side by side in one process (see shared BENCHMARKS.md).

Both run a jitted ``lax.scan`` of T steps over a vmapped batch of B games
taking uniformly random legal actions, with auto-reset, consuming a checksum
of observations and rewards; one warm-up call, then one timed call.
steps/s = B*T / seconds. JaxMARL is optional (the ``bench`` extra).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp

from jaxrl_reason import envs
from jaxrl_reason.utils.experiment import RunDir


@dataclasses.dataclass(frozen=True)
class Config:
    batch_sizes: tuple[int, ...] = (4096,)
    steps: int = 100
    num_players: int = 2
    obs_modes: tuple[str, ...] = ("canonical", "belief", "compact")
    repeats: int = 1  # timed calls per measurement (the best is kept)
    jaxmarl: bool = True

    def __post_init__(self):
        if not self.batch_sizes or min(self.batch_sizes) < 1 or self.steps < 1 or self.repeats < 1:
            raise ValueError("batch_sizes must be non-empty and positive; steps, repeats >= 1")
        if not self.obs_modes:
            raise ValueError("obs_modes must name at least one observation mode")


PRESETS = {
    "cpu": Config(),
    "gpu": Config(batch_sizes=(4096, 65536), steps=100, repeats=3),
}


def ours_rollout(env, batch: int, steps: int):
    """Carries (state, legal mask, current player) like the anchor carries its state; the
    observation is consumed through the checksum every step."""
    wrapped = envs.AutoReset(env)

    def body(carry, _):
        key, state, legal, player = carry
        key, k_act, k_step = jax.random.split(key, 3)
        mine = jnp.take_along_axis(legal, player[:, None, None], axis=1)[:, 0]
        act = jax.random.categorical(k_act, jnp.where(mine, 0.0, -1e9)).astype(jnp.int32)
        state, ts = jax.vmap(wrapped.step)(jax.random.split(k_step, batch), state, act)
        chk = ts.obs.sum() + ts.reward.sum()
        return (key, state, ts.legal_action_mask, ts.current_player), (ts.done.sum(), chk)

    @jax.jit
    def rollout(key):
        state, ts = jax.vmap(wrapped.reset)(jax.random.split(key, batch))
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


def time_rollout(rollout, batch: int, steps: int, repeats: int) -> tuple[float, int]:
    jax.block_until_ready(rollout(jax.random.key(0)))  # compile + warm-up
    best, episodes = float("inf"), 0
    for i in range(repeats):
        t = time.perf_counter()
        n, _ = jax.block_until_ready(rollout(jax.random.key(i + 1)))
        best = min(best, time.perf_counter() - t)
        episodes = int(n)
    return batch * steps / best, episodes


def run(config: Config, run_dir: RunDir | None = None) -> dict:
    rows, summary = [], {"device": jax.devices()[0].platform}
    for batch in config.batch_sizes:
        ref = None
        if config.jaxmarl:
            try:
                ref, _ = time_rollout(jaxmarl_rollout(config.num_players, batch, config.steps),
                                      batch, config.steps, config.repeats)
                rows.append({"impl": "jaxmarl", "obs": "belief", "B": batch, "steps_per_s": ref, "ratio": 1.0})
            except ImportError:
                print("jaxmarl is not installed (pip install '.[bench]'): measuring ours only")
        for mode in config.obs_modes:
            env = envs.make("hanabi", num_players=config.num_players, obs_mode=mode)
            sps, _ = time_rollout(ours_rollout(env, batch, config.steps), batch, config.steps, config.repeats)
            ratio = sps / ref if ref else float("nan")
            rows.append({"impl": "ours", "obs": mode, "B": batch, "steps_per_s": sps, "ratio": ratio})
            summary[f"ours_{mode}_B{batch}"] = sps
            summary[f"ratio_{mode}_B{batch}"] = ratio
        if ref:
            summary[f"jaxmarl_B{batch}"] = ref
    for r in rows:
        print(f"{r['impl']:8s} {r['obs']:9s} B={r['B']:6d} {r['steps_per_s']:14,.0f} steps/s  ratio {r['ratio']:.2f}")
    if run_dir is not None:
        run_dir.write_table("throughput", rows)
    return summary


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
