"""The learner core of the LM RL trainers (GRPO, SPIRAL, MemAgent, JoyAgents, RALLY's intent model): one
policy update from a ``Rollout``, built from a log-prob function, a loss and an optimiser.

    update = make_update(logp_fn, loss_fn, optimizer, UpdateConfig(epochs=1, minibatches=1))
    (params, opt_state), metrics = update(params, opt_state, rollout, key)      # pure: call it inside jit

    logp_fn(params, rows: Rollout) -> (logp [b, N], entropy [b, N] or None)     (e.g. ``rl.lm.logp.lm_logp_fn``)
    loss_fn(logp, old_logp, advantages, mask, ref_logp, entropy) -> (loss, metrics)
                                                     (e.g. ``partial(rl.lm.loss.grpo_loss, config=LossConfig())``)

The update takes ``epochs`` passes over the rows, each a fresh shuffle split into ``minibatches`` gradient
steps (``rl.update.minibatch_epochs``), or the steps of a custom ``batches(key, rows) -> idx [S, b]``.
Old-policy log-probs (``UpdateConfig.old_logp``):

    "auto"       ``rollout.old_logp`` if given; else, with one epoch of one minibatch and a deterministic
                 ``logp_fn`` (no dropout), the loss forward's own log-probs under ``stop_gradient`` (the
                 ratio is 1 with its true gradient; no extra forward pass); else "recompute"
    "recompute"  ``rollout.old_logp`` if given, else one forward pass of ``params`` over every row first
    "sampler"    ``rollout.sample_logp``: the log-probs the tokens were sampled with (SPIRAL)

``metrics``: the loss's metrics and ``grad_norm`` stacked over the steps ([E, M], or [S]), plus
``logp_mismatch`` (mean |old - sampler log-prob| over trained tokens, when both are known) and
``sample_entropy`` (token-mean entropy of the old policy, when known), scalars.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from jaxrl_reason.rl.lm.rollout import Rollout
from jaxrl_reason.rl.update import gradient_step, minibatch_epochs
from jaxrl_reason.utils.validation import at_least, check_hyperparameters, one_of

OLD_LOGP = ("auto", "recompute", "sampler")


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
    epochs: int = 1
    minibatches: int = 1
    wrap: bool = False  # rows need not divide into minibatches (the last rows of an epoch repeat a few)
    old_logp: str = "auto"  # auto | recompute | sampler (module docstring)
    group: int = 1  # rows come in groups of this many consecutive rows that minibatches keep whole (GRPO's
    # samples of one prompt, for a logp_fn that runs each group's prompt once: ``lm_logp_fn(..., group=)``)

    CHECKS = ((("epochs", "minibatches", "group"), at_least(1)), ("old_logp", one_of(OLD_LOGP)))  # utils.validation

    def __post_init__(self):
        check_hyperparameters(self)

    def fused(self, deterministic: bool = True, custom_batches: bool = False) -> bool:
        """Whether the old log-probs are the loss forward's own (no pass of their own)."""
        return (self.old_logp == "auto" and self.epochs == 1 and self.minibatches == 1 and deterministic
                and not custom_batches)

    def needs_old_pass(self, deterministic: bool = True, custom_batches: bool = False) -> bool:
        """Whether old log-probs must come from a forward pass of their own (ahead, or inside the update)."""
        return self.old_logp != "sampler" and not self.fused(deterministic, custom_batches)


def _masked_mean(x, mask):
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def make_update(logp_fn: Callable, loss_fn: Callable, optimizer: optax.GradientTransformation,
                config: UpdateConfig = UpdateConfig(), *, deterministic: bool = True,
                batches: Callable | None = None) -> Callable:
    """-> ``update(params, opt_state, rollout, key) -> ((params, opt_state), metrics)`` (module docstring).
    ``deterministic``: False when ``logp_fn`` draws dropout (then old log-probs are never fused)."""
    fused = config.fused(deterministic, batches is not None)

    def update(params, opt_state, rollout: Rollout, key):
        extras = {}
        if config.old_logp == "sampler":
            if rollout.sample_logp is None:
                raise ValueError("UpdateConfig(old_logp='sampler') needs rollout.sample_logp")
            rollout = rollout.replace(old_logp=rollout.sample_logp)
        elif rollout.old_logp is None and not fused:
            old, ent = jax.lax.stop_gradient(logp_fn(params, rollout))
            rollout = rollout.replace(old_logp=old, old_entropy=rollout.old_entropy if ent is None else ent)
        mask = rollout.token_mask
        if not fused:
            if rollout.sample_logp is not None and config.old_logp != "sampler":
                extras["logp_mismatch"] = _masked_mean(jnp.abs(rollout.old_logp - rollout.sample_logp), mask)
            if rollout.old_entropy is not None:
                extras["sample_entropy"] = _masked_mean(rollout.old_entropy, mask)

        def loss(params, rows: Rollout):
            logp, ent = logp_fn(params, rows)
            m = rows.token_mask
            old = jax.lax.stop_gradient(logp) if fused else rows.old_logp
            value, metrics = loss_fn(logp, old, rows.advantages, m, rows.ref_logp, ent)
            if fused:  # one step over every row: the old policy's statistics come with the loss forward
                if rows.sample_logp is not None:
                    metrics = {**metrics, "logp_mismatch": _masked_mean(jnp.abs(old - rows.sample_logp), m)}
                if ent is not None:
                    metrics = {**metrics, "sample_entropy": _masked_mean(jax.lax.stop_gradient(ent), m)}
            return value, metrics

        if batches is None:
            (params, opt_state), m = minibatch_epochs(loss, optimizer, params, opt_state, rollout, key, config.epochs,
                                                      config.minibatches, wrap=config.wrap, group=config.group)
        else:
            idx = batches(key, rollout)
            step = gradient_step(loss, optimizer)
            (params, opt_state), m = jax.lax.scan(lambda c, i: step(c, rollout.take(i)), (params, opt_state), idx)
        if fused:
            extras.update({k: m.pop(k).mean() for k in ("logp_mismatch", "sample_entropy") if k in m})
        return (params, opt_state), {**m, **extras}

    return update


__all__ = ["OLD_LOGP", "UpdateConfig", "make_update"]
