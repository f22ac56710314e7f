"""The optimiser of every LM RL trainer: global-norm clipping, then Adam, under the NaN guard.

    tx = lm_optimizer(lr, max_grad_norm=1.0, b2=ADAM_B2)

Default ``b2 = 0.999`` (Adam's). Before issue 41 the trainers differed: GRPO, MemAgent and JoyAgents used
b2 = 0.99, SPIRAL and RALLY's intent model 0.999; each keeps its value through its config (``adam_b2``).
"""

from __future__ import annotations

import optax

from jaxrl_reason.utils.guard import guard_optimizer

ADAM_B2 = 0.999


def lm_optimizer(lr: float, max_grad_norm: float = 1.0, b2: float = ADAM_B2) -> optax.GradientTransformation:
    """clip_by_global_norm(max_grad_norm) -> adam(lr, b2=b2), skipping non-finite updates (``guard_optimizer``)."""
    if not (lr > 0 and max_grad_norm > 0 and 0 < b2 < 1):
        raise ValueError(f"lm_optimizer: need lr > 0, max_grad_norm > 0, 0 < b2 < 1; got {lr}, {max_grad_norm}, {b2}")
    return guard_optimizer(optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(lr, b2=b2)))


__all__ = ["ADAM_B2", "lm_optimizer"]
