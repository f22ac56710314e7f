"""Generalised advantage estimation as a reverse ``lax.scan``."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def compute_gae(
    rewards: jax.Array,
    values: jax.Array,
    dones: jax.Array,
    last_value: jax.Array,
    gamma: float,
    gae_lambda: float,
) -> tuple[jax.Array, jax.Array]:
    """GAE(gamma, lambda) over a time-major trajectory.

    Args:
      rewards: ``[T, *batch]``.
      values: ``[T, *batch]``.
      dones: ``[T, *batch]``; ``dones[t]`` marks that the
        episode ended at step ``t`` (no bootstrap from ``values[t + 1]``).
      last_value: ``[*batch]`` value of the state after the last step.
    Returns:
      ``(advantages, returns)``, both ``[T, *batch]``; returns = advantages + values.
    """
    not_done = 1.0 - dones.astype(values.dtype)

    def body(carry, xs):
        next_adv, next_value = carry
        reward, value, nd = xs
        delta = reward + gamma * next_value * nd - value
        adv = delta + gamma * gae_lambda * nd * next_adv
        return (adv, value), adv

    _, advantages = jax.lax.scan(
        body, (jnp.zeros_like(last_value), last_value), (rewards, values, not_done), reverse=True
    )
    return advantages, advantages + values
