"""Batched evaluation of any policy on any environment, as one jitted scan."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_reason import envs
from jaxrl_reason.rl.base import Policy

PolicyFn = Policy  # policy_fn(carry, key, ts) -> (carry, action) for ONE environment (vmapped here)


def random_policy(env: envs.Environment) -> tuple[PolicyFn, Any]:
    """Uniform over legal actions; returns ``(policy_fn, initial_carry)``."""
    return (lambda carry, key, ts: (carry, envs.random_legal_action(key, env, ts))), jnp.zeros(())


def evaluate(env: envs.Environment, policy_fn: PolicyFn, init_carry: Any, key: jax.Array,
             num_episodes: int) -> dict[str, jax.Array]:
    """Play ``num_episodes`` episodes in parallel until all end (at most max_episode_steps).

    Returns ``{"return": [num_episodes, num_agents], "length": [num_episodes]}``.
    Jit it with ``env``/``policy_fn``/``num_episodes`` static (e.g. via functools.partial).
    """
    k_reset, k_play = jax.random.split(key)
    state, ts = jax.vmap(env.reset)(jax.random.split(k_reset, num_episodes))
    carry = jax.tree.map(lambda x: jnp.broadcast_to(x, (num_episodes, *jnp.shape(x))), init_carry)
    total = jnp.zeros((num_episodes, env.num_agents))
    alive = jnp.ones((num_episodes,), bool)
    length = jnp.zeros((num_episodes,), jnp.int32)

    def body(c, key):
        state, ts, carry, total, alive, length = c
        k_act, k_step = jax.random.split(key)
        carry, action = jax.vmap(policy_fn)(carry, jax.random.split(k_act, num_episodes), ts)
        new_state, new_ts = jax.vmap(env.step)(jax.random.split(k_step, num_episodes), state, action)
        keep = lambda new, old: jax.tree.map(
            lambda n, o: jnp.where(alive.reshape(-1, *([1] * (n.ndim - 1))), n, o), new, old)
        total = total + jnp.where(alive[:, None], new_ts.reward, 0.0)
        length = length + alive
        state, ts = keep(new_state, state), keep(new_ts, ts)
        alive = alive & ~new_ts.done
        return (state, ts, carry, total, alive, length), None

    (_, _, _, total, _, length), _ = jax.lax.scan(
        body, (state, ts, carry, total, alive, length), jax.random.split(k_play, env.max_episode_steps)
    )
    return {"return": total, "length": length}
