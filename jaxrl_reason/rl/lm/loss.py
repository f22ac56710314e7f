"""GRPO-family policy loss (pure jnp): a registered policy objective (clipped token ratio, GSPO's
sequence ratio, CISPO's clipped importance weights), a registered aggregation (token- or sequence-level),
KL to a reference (k1/k2/k3), entropy bonus (DAPO's overlong penalty is the ``overlong`` reward function
of ``jaxrl_reason.rewards``).

All per-token inputs are [B, N] over response tokens with ``mask`` [B, N] (1 on the tokens trained on);
advantages are per sequence [B].

    loss, metrics = grpo_loss(logp, old_logp, adv, mask, ref_logp=ref, entropy=ent, config=LossConfig())

Objectives (``LossConfig.objective``; ``OBJECTIVES[name](logp, old_logp, adv, mask, config) -> (surrogate
[B, N] to maximise, clipped [B, N] bool, ratio [B, N])``; a new one is one function under
``@register_objective``):

    "clip"   PPO / GRPO: min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), r = pi / pi_old per token
             (eps_high > eps_low: DAPO's clip-higher)
    "gspo"   GSPO (arXiv 2507.18071): the same clip on the sequence ratio s = exp(mean_t log r_t), every
             token of a sequence carrying s (use aggregation "seq_mean"; GSPO's eps are ~3e-4 / 4e-4)
    "cispo"  CISPO (MiniMax-M1, arXiv 2506.13585): sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi: the
             importance weight is clipped and stopped, every token keeps its gradient (a large eps_low,
             e.g. 1 - 1e-6, leaves the weight unclipped below)

Aggregations (``AGGREGATIONS[name](x, mask, norm_len) -> scalar``): "token_mean" (DAPO: mean over all
tokens in the batch), "seq_mean" (GRPO: mean over each sequence's tokens, then over sequences),
"seq_sum_norm" (Dr.GRPO: each sequence's token sum divided by the constant ``norm_len``, then mean over
sequences).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from jaxrl_reason.utils.validation import check_hyperparameters

KL_ESTIMATORS = ("k1", "k2", "k3")
OBJECTIVES: dict[str, Callable] = {}
AGGREGATIONS: dict[str, Callable] = {}


def _registrar(table: dict, what: str):
    def register(name: str):
        def add(fn):
            if name in table:
                raise ValueError(f"{what} {name!r} is already registered")
            table[name] = fn
            return fn

        return add

    return register


register_objective = _registrar(OBJECTIVES, "policy objective")
register_aggregation = _registrar(AGGREGATIONS, "aggregation")


@dataclasses.dataclass(frozen=True)
class LossConfig:
    eps_low: float = 0.2
    eps_high: float = 0.2  # ProRL / DAPO clip-higher: 0.28 - 0.4
    objective: str = "clip"  # clip | gspo | cispo (OBJECTIVES)
    aggregation: str = "token_mean"
    norm_len: int = 0  # seq_sum_norm divisor (e.g. max_new_tokens); required > 0 for it
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    ent_coef: float = 0.0

    def __post_init__(self):
        check_hyperparameters(self)
        if self.eps_low < 0 or self.eps_high < 0 or self.eps_low >= 1:
            raise ValueError(f"LossConfig: need 0 <= eps_low < 1 and eps_high >= 0, got {self.eps_low}, {self.eps_high}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"LossConfig: aggregation must be one of {tuple(AGGREGATIONS)}, got {self.aggregation!r}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"LossConfig: objective must be one of {tuple(OBJECTIVES)}, got {self.objective!r}")
        if self.aggregation == "seq_sum_norm" and self.norm_len <= 0:
            raise ValueError("LossConfig: aggregation 'seq_sum_norm' needs norm_len > 0 (e.g. max_new_tokens)")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"LossConfig: kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        if self.kl_coef < 0:
            raise ValueError(f"LossConfig: kl_coef must be >= 0, got {self.kl_coef}")


def kl_estimate(logp: jax.Array, ref_logp: jax.Array, estimator: str = "k3") -> jax.Array:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's k1/k2/k3).

    k1 = log pi - log pi_ref;  k2 = (log pi - log pi_ref)^2 / 2;  k3 = r - log r - 1, r = pi_ref / pi.
    """
    d = logp - ref_logp
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d**2
    if estimator == "k3":
        return jnp.exp(-d) + d - 1.0
    raise ValueError(f"kl estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


@register_aggregation("token_mean")
def _token_mean(x, mask, norm_len=0):
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


@register_aggregation("seq_mean")
def _seq_mean(x, mask, norm_len=0):
    return jnp.mean(jnp.sum(x * mask, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1.0))


@register_aggregation("seq_sum_norm")
def _seq_sum_norm(x, mask, norm_len=0):
    if norm_len <= 0:
        raise ValueError("aggregation 'seq_sum_norm' needs norm_len > 0 (e.g. max_new_tokens)")
    return jnp.mean(jnp.sum(x * mask, axis=-1) / norm_len)


def aggregate(x: jax.Array, mask: jax.Array, aggregation: str = "token_mean", norm_len: int = 0) -> jax.Array:
    """x, mask [B, N] -> scalar, by the chosen aggregation."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {tuple(AGGREGATIONS)}, got {aggregation!r}")
    return AGGREGATIONS[aggregation](x, mask.astype(x.dtype), norm_len)


def _clip(ratio, adv, config):
    clipped = jnp.clip(ratio, 1.0 - config.eps_low, 1.0 + config.eps_high)
    is_clipped = ((ratio < 1.0 - config.eps_low) & (adv < 0)) | ((ratio > 1.0 + config.eps_high) & (adv > 0))
    return jnp.minimum(ratio * adv, clipped * adv), is_clipped


@register_objective("clip")
def clip_objective(logp, old_logp, adv, mask, config):
    """Token ratio r_t, PPO clip with (eps_low, eps_high)."""
    ratio = jnp.exp(logp - old_logp)
    surrogate, is_clipped = _clip(ratio, adv[:, None], config)
    return surrogate, is_clipped, ratio


@register_objective("gspo")
def gspo_objective(logp, old_logp, adv, mask, config):
    """Sequence ratio s = exp(sum_t mask (logp - old) / sum_t mask), clipped; broadcast over the tokens."""
    mask = mask.astype(logp.dtype)
    log_s = jnp.sum((logp - old_logp) * mask, -1) / jnp.maximum(jnp.sum(mask, -1), 1.0)
    ratio = jnp.exp(log_s)
    surrogate, is_clipped = _clip(ratio, adv, config)
    full = lambda x: jnp.broadcast_to(x[:, None], logp.shape)
    return full(surrogate), full(is_clipped), full(ratio)


@register_objective("cispo")
def cispo_objective(logp, old_logp, adv, mask, config):
    """sg(clip(r_t)) * A * log pi_t: REINFORCE with clipped, stopped importance weights."""
    ratio = jnp.exp(logp - old_logp)
    weight = jax.lax.stop_gradient(jnp.clip(ratio, 1.0 - config.eps_low, 1.0 + config.eps_high))
    is_clipped = (ratio < 1.0 - config.eps_low) | (ratio > 1.0 + config.eps_high)
    return weight * adv[:, None] * logp, is_clipped, ratio


def grpo_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    ref_logp: jax.Array | None = None,
    entropy: jax.Array | None = None,
    config: LossConfig = LossConfig(),
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """-(objective's surrogate) + kl_coef * KL - ent_coef * entropy, each aggregated the same way."""
    surrogate, is_clipped, ratio = OBJECTIVES[config.objective](logp, old_logp, advantages, mask, config)
    agg = lambda x: aggregate(x, mask, config.aggregation, config.norm_len)
    policy_loss = -agg(surrogate)
    loss = policy_loss
    metrics = {"policy_loss": policy_loss}
    if ref_logp is not None:
        kl = agg(kl_estimate(logp, ref_logp, config.kl_estimator))
        loss = loss + config.kl_coef * kl
        metrics["kl"] = kl
    if entropy is not None:
        ent = agg(entropy)
        loss = loss - config.ent_coef * ent
        metrics["entropy"] = ent
    metrics["clip_fraction"] = aggregate(is_clipped.astype(jnp.float32), mask)
    metrics["ratio"] = aggregate(ratio, mask)
    metrics["loss"] = loss
    return loss, metrics


def make_loss(config: LossConfig = LossConfig()):
    """-> ``loss(logp, old_logp, advantages, mask, ref_logp, entropy) -> (loss, metrics)``: ``grpo_loss`` with
    ``config``, in the signature of the learner (``rl.lm.make_update``)."""

    def loss(logp, old_logp, advantages, mask, ref_logp=None, entropy=None):
        return grpo_loss(logp, old_logp, advantages, mask, ref_logp=ref_logp, entropy=entropy, config=config)

    return loss
