"""The non-finite guard every training loop shares.

Two halves, one policy:

- inside jit, ``guard_optimizer(tx)`` wraps an optax optimizer with
  ``optax.apply_if_finite``: an update whose gradients hold a NaN or inf is not
  applied (parameters and optimizer moments stay as they were) and is counted in
  the optimizer state (``total_notfinite``);
- on the host, ``check_metrics`` (called by ``RunDir.log``) and ``check_state``
  (called by ``utils.loop.run_chunks`` before each checkpoint) look at what a
  loop produced.

``policy="raise"`` (the default) stops the run at the first non-finite loss,
gradient norm, parameter or skipped update with a ``NonFiniteError`` naming the
step and the metric; the last good checkpoint is kept, since nothing non-finite
is ever saved. ``policy="skip"`` lets the run go on past skipped updates (as
large-scale trainers do) and logs their running count as
``nonfinite_skipped_updates``; parameters that become non-finite still stop it.
The CLI sets the policy with ``--on-nonfinite``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

POLICIES = ("raise", "skip")
#: Metrics that must stay finite: names ending in ``loss`` or ``nll``, or holding ``grad_norm``.
WATCHED_METRIC = re.compile(r"(loss|nll)$|grad_norm")
#: Consecutive non-finite updates ``apply_if_finite`` skips before it applies one anyway
#: (the parameters then turn non-finite and ``check_state`` stops the run).
MAX_CONSECUTIVE_SKIPS = 1000
SKIPPED_METRIC = "nonfinite_skipped_updates"


class NonFiniteError(FloatingPointError):
    """A training loop produced a NaN or inf loss, gradient norm or parameter."""


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"on_nonfinite must be one of {POLICIES}, got {policy!r}")
    return policy


def guard_optimizer(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``tx`` that skips (and counts) updates with non-finite gradients; same updates otherwise."""
    return optax.apply_if_finite(tx, MAX_CONSECUTIVE_SKIPS)


def check_metrics(step: int, metrics: Mapping[str, Any], policy: str = "raise", where: str = "") -> None:
    """Raise ``NonFiniteError`` if a watched scalar metric at ``step`` is NaN or inf.

    Under ``policy="skip"`` nothing is raised here: the update that produced the
    metric was skipped by ``guard_optimizer`` and ``check_state`` watches the rest.
    """
    if policy == "skip":
        return
    bad = {name: value for name, value in metrics.items()
           if WATCHED_METRIC.search(name) and isinstance(value, float) and not np.isfinite(value)}
    if bad:
        shown = ", ".join(f"{name!r} is {value}" for name, value in bad.items())
        raise NonFiniteError(
            f"{where or 'training'}: at step {step} metric {shown}; the run stops here (the last "
            "checkpoint before it is kept). Lower the learning rate, check the data, or pass "
            "--on-nonfinite skip to skip such updates"
        )


def _path_name(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


@jax.jit
def _finite_flags(leaves: list) -> jax.Array:
    return jnp.stack([jnp.isfinite(x).all() for x in leaves]) if leaves else jnp.zeros((0,), bool)


def nonfinite_leaves(tree: Any) -> list[str]:
    """Paths of the floating-point leaves of ``tree`` that hold a NaN or inf (one device sync)."""
    items = [(p, x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
             if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)]
    flags = np.asarray(_finite_flags([x for _, x in items]))
    return [_path_name(p) for (p, _), ok in zip(items, flags) if not ok]


def skipped_updates(state: Any) -> int:
    """Total updates ``guard_optimizer`` skipped, summed over every guarded optimizer in ``state``."""
    counts = [x for p, x in jax.tree_util.tree_flatten_with_path(state)[0]
              if p and _path_name(p[-1:]) == "total_notfinite"]
    return int(sum(int(np.asarray(c).sum()) for c in counts))


def check_state(step: int, state: Any, where: str = "") -> None:
    """Raise ``NonFiniteError`` naming the leaves of ``state`` that are NaN or inf at ``step``."""
    bad = nonfinite_leaves(state)
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise NonFiniteError(
            f"{where or 'training'}: the state holds NaN or inf at step {step} ({shown}); "
            "the run stops here and this state is not checkpointed"
        )


def check_trained(where: str, state: Any, losses: Any = None) -> None:
    """For loops without a run directory (SFT warm starts): raise ``NonFiniteError`` at the
    first non-finite loss in ``losses`` ``[steps]`` (naming the step, counted from 1), on any
    update ``guard_optimizer`` skipped, or on a non-finite ``state``."""
    if losses is not None:
        bad = np.flatnonzero(~np.isfinite(np.asarray(jax.device_get(losses), np.float64).reshape(len(losses), -1)
                                          ).any(axis=1))
        if bad.size:
            raise NonFiniteError(f"{where}: the loss is NaN or inf at step {bad[0] + 1} of {len(losses)}")
    skipped = skipped_updates(state)
    if skipped:
        raise NonFiniteError(f"{where}: {skipped} update(s) had NaN or inf gradients and were skipped")
    check_state(len(losses) if losses is not None else -1, state, where)
