"""Advantage estimators (pure jnp), registered by name. Rewards come in groups (the samples of one prompt,
the episodes of one (game, role)).

Every estimator has one signature (``Estimator``):

    adv, carry = ESTIMATORS[name](rewards [S], group_ids [S] int, num_groups, valid [S] bool | None, carry)

    "grpo"     (r - mean_g) / (std_g + eps)                  (DeepSeekMath / R1; std with ddof=0)
    "dr_grpo"  r - mean_g                                    (Dr.GRPO: no std normalisation)
    "rloo"     r - mean of the other samples of the group    (RLOO)
    "rae"      r - b[g], then b[g] <- (1 - alpha) b[g] + alpha r, in row order (SPIRAL's role-conditioned
               EMA baseline, ``rl.rae``); ``carry`` = the baselines [num_groups], returned updated
    "none"     r: plain REINFORCE (SPIRAL's "w/o RAE" ablation); with a carry, the RAE baselines are still
               tracked (a diagnostic), never subtracted

The stateless ones ignore ``carry`` (pass None). A stateful one is registered with ``init=`` (num_groups ->
the first carry), which the learner (``rl.lm.Learner``) keeps in its state between steps. Invalid rows get
advantage 0 and take no part in their group's statistics; groups of size 1 get 0 (no baseline without the
sample itself). A new estimator is one function of this signature under ``@register_estimator("name")``,
usable by every agent (the learner looks the name up when it builds its step). SPIRAL's fixed-opponent
baseline is ``"rae"`` with an opponent in the rollout; JoyAgents' top-K node selection is a choice of trained
rows (the rollout's mask), not an estimator. Helpers:

    group_advantages(r [P, G], method)      -> [P, G]   equal-size groups, any stateless estimator
    segment_advantages(r [S], group_ids [S], num_groups, method)   ragged groups, stateless estimators
    select_groups(r [Q, G], keep, dynamic, valid)   DAPO's dynamic sampling (informative groups first)
    broadcast_advantages(adv [S], index [M]) -> adv[index]: one reward shared by several sequences
        (MemAgent's memory-update turns, JoyAgents' agent nodes)
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxrl_reason.rl.rae import DEFAULT_ALPHA, rae_advantages
from jaxrl_reason.utils.validation import Rule

Estimator = Callable[[jax.Array, jax.Array, int, "jax.Array | None", Any], "tuple[jax.Array, Any]"]
ESTIMATORS: dict[str, Estimator] = {}
#: the stateful estimators' first carry: ``CARRY_INIT[name](num_groups) -> carry``
CARRY_INIT: dict[str, Callable[[int], Any]] = {}


def register_estimator(name: str, init: Callable[[int], Any] | None = None):
    """Decorator: add an ``Estimator`` to ``ESTIMATORS`` under ``name``; ``init(num_groups) -> carry`` for one
    that keeps state between steps (the RAE baselines)."""

    def add(fn: Estimator) -> Estimator:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ESTIMATORS[name] = fn
        if init is not None:
            CARRY_INIT[name] = init
        return fn

    return add


def check_estimator(name: str, where: str = "advantage") -> None:
    """A clear ``ValueError`` unless ``name`` is a registered estimator (checked when a step is built, so an
    estimator registered after a config was made is accepted)."""
    if name not in ESTIMATORS:
        raise ValueError(f"{where} must be a registered advantage estimator, one of {tuple(ESTIMATORS)}; got {name!r}"
                         " (add one with rl.lm.advantages.register_estimator)")


def init_carry(name: str, num_groups: int) -> Any:
    """The first carry of estimator ``name`` for ``num_groups`` groups (None for a stateless one)."""
    check_estimator(name)
    return CARRY_INIT[name](num_groups) if name in CARRY_INIT else None


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


def _zeros(num_groups: int) -> jax.Array:
    return jnp.zeros((num_groups,), jnp.float32)


@register_estimator("rae", init=_zeros)
def _rae(rewards, group_ids, num_groups, valid=None, carry=None, alpha: float = DEFAULT_ALPHA):
    """carry: baselines [num_groups] (None: zeros); rows are processed in order."""
    base = jnp.zeros((num_groups,), jnp.float32) if carry is None else carry
    adv, new = rae_advantages(base[:, None], rewards[:, None], group_ids, valid, alpha)
    return adv[:, 0], new[:, 0]


@register_estimator("none", init=_zeros)
def _none(rewards, group_ids, num_groups, valid=None, carry=None, alpha: float = DEFAULT_ALPHA):
    """A = r (0 on invalid rows); a given carry (RAE baselines) is updated as ``"rae"`` would, never used."""
    adv = jnp.asarray(rewards, jnp.float32)
    if valid is not None:
        adv = jnp.where(valid, adv, 0.0)
    if carry is not None:
        carry = _rae(rewards, group_ids, num_groups, valid, carry, alpha)[1]
    return adv, carry


def estimate(name: str, rewards, group_ids, num_groups: int, valid=None, carry=None):
    """``ESTIMATORS[name]`` with a clear error for an unknown name."""
    check_estimator(name)
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


def _stateless(method: str) -> None:
    check_estimator(method)
    if method in CARRY_INIT:
        raise ValueError(f"advantage estimator {method!r} keeps state between steps: call it through the learner "
                         "(rl.lm.Learner) or ESTIMATORS[name] with its carry")


def group_advantages(rewards: jax.Array, method: str = "grpo", eps: float = 1e-6) -> jax.Array:
    """Equal-size groups: rewards [P, G] -> advantages [P, G] (any stateless registered estimator; grpo,
    dr_grpo and rloo in their dense form)."""
    _stateless(method)
    if method == "grpo":
        return grpo_advantages(rewards, eps)
    if method in _DENSE:
        return _DENSE[method](rewards)
    _check_group(rewards)
    p, g = rewards.shape
    return estimate(method, rewards.reshape(-1), jnp.repeat(jnp.arange(p), g), p)[0].reshape(p, g)


def segment_advantages(rewards: jax.Array, group_ids: jax.Array, num_groups: int, method: str = "grpo",
                       eps: float = 1e-6) -> jax.Array:
    """Ragged groups: rewards [S], group_ids [S] in [0, num_groups) -> advantages [S] (stateless estimators)."""
    _stateless(method)
    if method == "grpo":
        return _grpo(rewards, group_ids, num_groups, None, None, eps)[0]
    return estimate(method, rewards, group_ids, num_groups)[0]


def select_groups(rewards: jax.Array, keep: int, dynamic: bool, valid: jax.Array | None = None
                  ) -> tuple[jax.Array, jax.Array]:
    """rewards [Q, G] (valid [Q, G]: 0 on excluded samples) -> (indices of ``keep`` groups [keep], fraction of
    groups with zero variance among their valid samples).

    Dynamic sampling (DAPO) with static shapes: groups with non-zero reward variance come first (stable
    order), zero-variance groups only fill the remaining slots (their advantages are 0 anyway)."""
    if valid is None:
        informative = jnp.std(rewards, axis=1) > 0
    else:
        w = valid.astype(rewards.dtype)
        mean = (rewards * w).sum(1, keepdims=True) / jnp.maximum(w.sum(1, keepdims=True), 1.0)
        informative = ((rewards - mean) ** 2 * w).sum(1) > 0
    frac_filtered = 1.0 - jnp.mean(informative.astype(jnp.float32))
    order = jnp.argsort(~informative, stable=True) if dynamic else jnp.arange(rewards.shape[0])
    return order[:keep], frac_filtered


def broadcast_advantages(advantages: jax.Array, index: jax.Array) -> jax.Array:
    """advantages [S] (one per rewarded sample), index [M] (sample of each sequence) -> [M]."""
    return jnp.take(advantages, index, axis=0)


#: a config field naming an estimator (``utils.validation`` CHECKS): read when checked, so later registrations count
REGISTERED = Rule(lambda name: name in ESTIMATORS, "a registered advantage estimator (rl.lm.advantages.ESTIMATORS)")

__all__ = ["CARRY_INIT", "ESTIMATORS", "Estimator", "REGISTERED", "broadcast_advantages", "check_estimator",
           "dr_grpo_advantages", "estimate", "group_advantages", "grpo_advantages", "init_carry", "register_estimator",
           "rloo_advantages", "segment_advantages", "select_groups"]
