"""Episode statistics of any swarm policy (return, coverage, captures, served targets) and
one recorded episode for rendering; each a single jitted scan."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_reason.envs.swarm import Swarm
from jaxrl_reason.rl.evaluate import PolicyFn


def play(env: Swarm, policy_fn: PolicyFn, init_carry, key: jax.Array, num_episodes: int,
         with_state: bool = False) -> dict:
    """``num_episodes`` parallel episodes (each until it ends). Returns ``[num_episodes]`` arrays:
    ``return`` (mean over agents), ``coverage`` (mean per-step urgency-weighted coverage),
    ``served`` and ``captured`` at the end, ``length``. Jit with env/policy_fn/num_episodes static.
    ``with_state``: a privileged policy, called ``policy_fn(carry, key, ts, env_state)``."""
    k_reset, k_play = jax.random.split(key)
    state, ts = jax.vmap(env.reset)(jax.random.split(k_reset, num_episodes))
    carry = jax.tree.map(lambda x: jnp.broadcast_to(x, (num_episodes, *jnp.shape(x))), init_carry)
    zeros = jnp.zeros((num_episodes,))
    acc = dict(ret=zeros, cov=zeros, length=zeros, alive=jnp.ones((num_episodes,), bool),
               served=zeros, captured=zeros)

    def body(c, key):
        state, ts, carry, acc = c
        k_act, k_step = jax.random.split(key)
        extra = (state,) if with_state else ()
        carry, action = jax.vmap(policy_fn)(carry, jax.random.split(k_act, num_episodes), ts, *extra)
        state, nts = jax.vmap(env.step)(jax.random.split(k_step, num_episodes), state, action)
        a = acc["alive"]
        acc = dict(ret=acc["ret"] + a * nts.reward.mean(-1), cov=acc["cov"] + a * nts.info["coverage"],
                   length=acc["length"] + a, alive=a & ~nts.done,
                   served=jnp.where(a, nts.info["num_served"], acc["served"]),
                   captured=jnp.where(a, nts.info["num_captured"], acc["captured"]))
        return (state, nts, carry, acc), None

    (_, _, _, acc), _ = jax.lax.scan(body, (state, ts, carry, acc), jax.random.split(k_play, env.max_episode_steps))
    return {"return": acc["ret"], "coverage": acc["cov"] / jnp.maximum(acc["length"], 1.0),
            "served": acc["served"], "captured": acc["captured"], "length": acc["length"]}


def record(env: Swarm, policy_fn: PolicyFn, init_carry, key: jax.Array):
    """One episode of ``max_episode_steps`` steps: ``(states, actions, done)`` stacked over time
    (``states`` includes the initial state; steps after the end repeat the final state)."""
    k_reset, k_play = jax.random.split(key)
    state, ts = env.reset(k_reset)

    def body(c, key):
        state, ts, carry, alive = c
        k_act, k_step = jax.random.split(key)
        carry, action = policy_fn(carry, k_act, ts)
        new_state, new_ts = env.step(k_step, state, action)
        keep = lambda n, o: jax.tree.map(lambda x, y: jnp.where(alive, x, y), n, o)
        state, ts = keep(new_state, state), keep(new_ts, ts)
        return (state, ts, carry, alive & ~new_ts.done), (state, action, alive)

    _, (states, actions, alive) = jax.lax.scan(body, (state, ts, init_carry, jnp.bool_(True)),
                                               jax.random.split(k_play, env.max_episode_steps))
    states = jax.tree.map(lambda s0, s: jnp.concatenate([s0[None], s]), state, states)
    return states, actions, alive
