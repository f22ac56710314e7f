"""Group-relative advantages (pure jnp). Rewards come in groups of samples of one prompt.

    grpo_advantages(r)      r [P, G] -> (r - mean_g) / (std_g + eps)          (DeepSeekMath / R1)
    dr_grpo_advantages(r)   r [P, G] -> r - mean_g              (Dr.GRPO: no std normalisation)
    rloo_advantages(r)      r [P, G] -> r - mean of the other G-1 samples            (RLOO)
    group_advantages(r, method)  dispatch on "grpo" | "dr_grpo" | "rloo"
    segment_advantages(r, group_ids, num_groups, method)  ragged groups (r [S], ids [S])
    broadcast_advantages(adv, index)  adv [S], index [M] -> adv[index]: one reward shared by several
        sequences (MemAgent's memory-update turns, JoyAgents' agent nodes)

std is the population std (ddof=0). A zero-variance group gets advantage 0 everywhere.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

METHODS = ("grpo", "dr_grpo", "rloo")


def _check_group(rewards: jax.Array):
    if rewards.ndim != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [num_groups, group_size >= 2], got shape {rewards.shape}")


def grpo_advantages(rewards: jax.Array, eps: float = 1e-6) -> jax.Array:
    _check_group(rewards)
    mean = rewards.mean(axis=1, keepdims=True)
    std = rewards.std(axis=1, keepdims=True)
    return (rewards - mean) / (std + eps)


def dr_grpo_advantages(rewards: jax.Array) -> jax.Array:
    _check_group(rewards)
    return rewards - rewards.mean(axis=1, keepdims=True)


def rloo_advantages(rewards: jax.Array) -> jax.Array:
    _check_group(rewards)
    g = rewards.shape[1]
    return (rewards - rewards.mean(axis=1, keepdims=True)) * g / (g - 1)


def group_advantages(rewards: jax.Array, method: str = "grpo", eps: float = 1e-6) -> jax.Array:
    if method == "grpo":
        return grpo_advantages(rewards, eps)
    if method == "dr_grpo":
        return dr_grpo_advantages(rewards)
    if method == "rloo":
        return rloo_advantages(rewards)
    raise ValueError(f"advantage method must be one of {METHODS}, got {method!r}")


def segment_advantages(rewards: jax.Array, group_ids: jax.Array, num_groups: int, method: str = "grpo",
                       eps: float = 1e-6) -> jax.Array:
    """Ragged groups: rewards [S], group_ids [S] in [0, num_groups) -> advantages [S].

    Groups of size 1 get advantage 0 (no baseline can be formed without the sample itself).
    """
    if method not in METHODS:
        raise ValueError(f"advantage method must be one of {METHODS}, got {method!r}")
    seg = lambda x: jax.ops.segment_sum(x, group_ids, num_segments=num_groups)
    n = seg(jnp.ones_like(rewards))
    mean = (seg(rewards) / jnp.maximum(n, 1.0))[group_ids]
    cnt = n[group_ids]
    centred = jnp.where(cnt > 1, rewards - mean, 0.0)
    if method == "dr_grpo":
        return centred
    if method == "rloo":
        return centred * cnt / jnp.maximum(cnt - 1, 1.0)
    var = (seg(centred**2) / jnp.maximum(n, 1.0))[group_ids]
    return centred / (jnp.sqrt(var) + eps)


def broadcast_advantages(advantages: jax.Array, index: jax.Array) -> jax.Array:
    """advantages [S] (one per rewarded sample), index [M] (sample of each sequence) -> [M]."""
    return jnp.take(advantages, index, axis=0)
