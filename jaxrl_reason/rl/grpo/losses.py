"""GRPO-family policy loss (pure jnp): clipped ratio with decoupled clip range, token- or
sequence-level aggregation, KL to a reference (k1/k2/k3), entropy bonus (DAPO's overlong penalty is the
``overlong`` reward function of ``jaxrl_reason.rewards``).

All per-token inputs are [B, N] over response tokens with ``mask`` [B, N] (1 on real tokens);
advantages are per sequence [B].

    loss, metrics = grpo_loss(logp, old_logp, adv, mask, ref_logp=ref, entropy=ent, config=LossConfig())

Aggregations: "token_mean" (DAPO: mean over all tokens in the batch), "seq_mean" (GRPO: mean over
each sequence's tokens, then over sequences), "seq_sum_norm" (Dr.GRPO: each sequence's token sum
divided by the constant ``norm_len``, then mean over sequences).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxrl_reason.utils.validation import check_hyperparameters

AGGREGATIONS = ("token_mean", "seq_mean", "seq_sum_norm")
KL_ESTIMATORS = ("k1", "k2", "k3")


@dataclasses.dataclass(frozen=True)
class LossConfig:
    eps_low: float = 0.2
    eps_high: float = 0.2  # ProRL / DAPO clip-higher: 0.28 - 0.4
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
            raise ValueError(f"LossConfig: aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
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


def aggregate(x: jax.Array, mask: jax.Array, aggregation: str = "token_mean", norm_len: int = 0) -> jax.Array:
    """x, mask [B, N] -> scalar, by the chosen aggregation."""
    mask = mask.astype(x.dtype)
    if aggregation == "token_mean":
        return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    if aggregation == "seq_mean":
        per_seq = jnp.sum(x * mask, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
        return jnp.mean(per_seq)
    if aggregation == "seq_sum_norm":
        return jnp.mean(jnp.sum(x * mask, axis=-1) / norm_len)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


def grpo_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    ref_logp: jax.Array | None = None,
    entropy: jax.Array | None = None,
    config: LossConfig = LossConfig(),
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """-(clipped surrogate) + kl_coef * KL - ent_coef * entropy, each aggregated the same way."""
    adv = advantages[:, None]
    ratio = jnp.exp(logp - old_logp)
    clipped = jnp.clip(ratio, 1.0 - config.eps_low, 1.0 + config.eps_high)
    surrogate = jnp.minimum(ratio * adv, clipped * adv)
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
    is_clipped = ((ratio < 1.0 - config.eps_low) & (adv < 0)) | ((ratio > 1.0 + config.eps_high) & (adv > 0))
    metrics["clip_fraction"] = aggregate(is_clipped.astype(jnp.float32), mask)
    metrics["ratio"] = aggregate(ratio, mask)
    metrics["loss"] = loss
    return loss, metrics
