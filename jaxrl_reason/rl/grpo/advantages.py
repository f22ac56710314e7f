"""Advantage estimators (pure jnp), registered by name. Rewards come in groups (the samples of one prompt,
the episodes of one (game, role)).

Every estimator has one signature (``Estimator``):

    adv, carry = ESTIMATORS[name](rewards [S], group_ids [S] int, num_groups, valid [S] bool | None, carry)

    "grpo"     (r - mean_g) / (std_g + eps)                  (DeepSeekMath / R1; std with ddof=0)
    "dr_grpo"  r - mean_g                                    (Dr.GRPO: no std normalisation)
    "rloo"     r - mean of the other samples of the group    (RLOO)
    "rae"      r - b[g], then b[g] <- (1 - alpha) b[g] + alpha r, in row order (SPIRAL's role-conditioned
               EMA baseline, ``rl.rae``); ``carry`` = the baselines [num_groups], returned updated

The stateless ones ignore ``carry`` (pass None). Invalid rows get advantage 0 and take no part in their
group's statistics; groups of size 1 get 0 (no baseline without the sample itself). A new estimator is one
function of this signature under ``@register_estimator("name")``. Dense helpers for equal-size groups:

    group_advantages(r [P, G], method)      -> [P, G]   (grpo_advantages, dr_grpo_advantages, rloo_advantages)
    segment_advantages(r [S], group_ids [S], num_groups, method)   ragged groups, stateless estimators
    broadcast_advantages(adv [S], index [M]) -> adv[index]: one reward shared by several sequences
        (MemAgent's memory-update turns, JoyAgents' agent nodes)
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxrl_reason.rl.rae import DEFAULT_ALPHA, rae_advantages

Estimator = Callable[[jax.Array, jax.Array, int, "jax.Array | None", Any], "tuple[jax.Array, Any]"]
ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str):
    """Decorator: add an ``Estimator`` to ``ESTIMATORS`` under ``name``."""

    def add(fn: Estimator) -> Estimator:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ESTIMATORS[name] = fn
        return fn

    return add


def _segment_stats(rewards, group_ids, num_groups, valid):
    """-> (centred [S] (0 on invalid rows and groups of one), count of the row's group [S], segment sum fn)."""
    w = jnp.ones_like(rewards) if valid is None else valid.astype(rewards.dtype)
    seg = lambda x: jax.ops.segment_sum(x, group_ids, num_segments=num_groups)
    n = seg(w)
    mean = (seg(rewards * w) / jnp.maximum(n, 1.0))[group_ids]
    cnt = n[group_ids]
    centred = jnp.where((cnt > 1) & (w > 0), rewards - mean, 0.0)
    return centred, cnt, seg, n


@register_estimator("grpo")
def _grpo(rewards, group_ids, num_groups, valid=None, carry=None, eps: float = 1e-6):
    centred, _, seg, n = _segment_stats(rewards, group_ids, num_groups, valid)
    var = (seg(centred**2) / jnp.maximum(n, 1.0))[group_ids]
    return centred / (jnp.sqrt(var) + eps), carry


@register_estimator("dr_grpo")
def _dr_grpo(rewards, group_ids, num_groups, valid=None, carry=None):
    return _segment_stats(rewards, group_ids, num_groups, valid)[0], carry


@register_estimator("rloo")
def _rloo(rewards, group_ids, num_groups, valid=None, carry=None):
    centred, cnt, _, _ = _segment_stats(rewards, group_ids, num_groups, valid)
    return centred * cnt / jnp.maximum(cnt - 1, 1.0), carry


@register_estimator("rae")
def _rae(rewards, group_ids, num_groups, valid=None, carry=None, alpha: float = DEFAULT_ALPHA):
    """carry: baselines [num_groups] (None: zeros); rows are processed in order."""
    base = jnp.zeros((num_groups,), jnp.float32) if carry is None else carry
    adv, new = rae_advantages(base[:, None], rewards[:, None], group_ids, valid, alpha)
    return adv[:, 0], new[:, 0]


#: the stateless group estimators (a trainer's ``advantage`` config field)
METHODS = ("grpo", "dr_grpo", "rloo")


def estimate(name: str, rewards, group_ids, num_groups: int, valid=None, carry=None):
    """``ESTIMATORS[name]`` with a clear error for an unknown name."""
    if name not in ESTIMATORS:
        raise ValueError(f"advantage estimator must be one of {tuple(ESTIMATORS)}, got {name!r}")
    return ESTIMATORS[name](rewards, group_ids, num_groups, valid, carry)


def _check_group(rewards: jax.Array):
    if rewards.ndim != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [num_groups, group_size >= 2], got shape {rewards.shape}")


def grpo_advantages(rewards: jax.Array, eps: float = 1e-6) -> jax.Array:
    """rewards [P, G] -> [P, G]."""
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


_DENSE = {"grpo": grpo_advantages, "dr_grpo": dr_grpo_advantages, "rloo": rloo_advantages}


def group_advantages(rewards: jax.Array, method: str = "grpo", eps: float = 1e-6) -> jax.Array:
    """Equal-size groups: rewards [P, G] -> advantages [P, G] (the stateless ``METHODS``)."""
    if method not in METHODS:
        raise ValueError(f"advantage method must be one of {METHODS}, got {method!r}")
    return grpo_advantages(rewards, eps) if method == "grpo" else _DENSE[method](rewards)


def segment_advantages(rewards: jax.Array, group_ids: jax.Array, num_groups: int, method: str = "grpo",
                       eps: float = 1e-6) -> jax.Array:
    """Ragged groups: rewards [S], group_ids [S] in [0, num_groups) -> advantages [S] (stateless ``METHODS``)."""
    if method not in METHODS:
        raise ValueError(f"advantage method must be one of {METHODS}, got {method!r}")
    if method == "grpo":
        return _grpo(rewards, group_ids, num_groups, None, None, eps)[0]
    return estimate(method, rewards, group_ids, num_groups)[0]


def broadcast_advantages(advantages: jax.Array, index: jax.Array) -> jax.Array:
    """advantages [S] (one per rewarded sample), index [M] (sample of each sequence) -> [M]."""
    return jnp.take(advantages, index, axis=0)
