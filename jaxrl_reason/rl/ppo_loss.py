"""The clipped PPO objective as one pure function (masked mean over any batch shape)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def masked_mean(x: jax.Array, mask: jax.Array | None) -> jax.Array:
    if mask is None:
        return x.mean()
    mask = mask.astype(x.dtype)
    return (x * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def ppo_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    values: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    entropy: jax.Array,
    *,
    clip_eps: float = 0.2,
    vf_coef: float = 0.5,
    ent_coef: float = 0.01,
    clip_value: bool = True,
    mask: jax.Array | None = None,
    value_mask: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped surrogate + value loss - entropy bonus; every input has one shape.

    ``mask`` (same shape, bool) excludes entries from the policy and entropy
    terms, e.g. turns where an agent did not act; ``value_mask`` does the same
    for the value term (defaults to ``mask``). Returns ``(loss, metrics)``.
    """
    value_mask = mask if value_mask is None else value_mask
    ratio = jnp.exp(logp - old_logp)
    surrogate = jnp.minimum(
        ratio * advantages, jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    )
    policy_loss = -masked_mean(surrogate, mask)
    value_err = jnp.square(values - returns)
    if clip_value:
        clipped = old_values + jnp.clip(values - old_values, -clip_eps, clip_eps)
        value_err = jnp.maximum(value_err, jnp.square(clipped - returns))
    value_loss = 0.5 * masked_mean(value_err, value_mask)
    ent = masked_mean(entropy, mask)
    loss = policy_loss + vf_coef * value_loss - ent_coef * ent
    metrics = {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": ent,
        "approx_kl": masked_mean((ratio - 1.0) - jnp.log(ratio), mask),
        "clip_fraction": masked_mean((jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32), mask),
    }
    return loss, metrics
