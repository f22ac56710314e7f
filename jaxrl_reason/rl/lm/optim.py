"""The optimiser of every LM RL trainer: global-norm clipping, then Adam, under the NaN guard.

    tx = lm_optimizer(lr, max_grad_norm=1.0, b2=ADAM_B2)

Default ``b2 = 0.999`` (Adam's). Before issue 41 the trainers differed: GRPO, MemAgent and JoyAgents used
b2 = 0.99, SPIRAL and RALLY's intent model 0.999; each keeps its value through its config (``adam_b2``).
"""

from __future__ import annotations

import jax
import optax

from jaxrl_reason.utils.guard import guard_optimizer

ADAM_B2 = 0.999


def lm_optimizer(lr, max_grad_norm: float = 1.0, b2: float = ADAM_B2,
                 weight_decay: float = 0.0) -> optax.GradientTransformation:
    """clip_by_global_norm(max_grad_norm) -> adam(lr, b2=b2), skipping non-finite updates (``guard_optimizer``).
    ``lr``: a float or an optax schedule (of the optimiser's update count); ``weight_decay`` > 0: AdamW's decoupled
    decay on matrices only (ndim >= 2: not norms or biases); with 0 and a float lr the chain is plain Adam."""
    if not ((callable(lr) or lr > 0) and max_grad_norm > 0 and 0 < b2 < 1 and weight_decay >= 0):
        raise ValueError(f"lm_optimizer: need lr > 0, max_grad_norm > 0, 0 < b2 < 1, weight_decay >= 0; got {lr}, "
                         f"{max_grad_norm}, {b2}, {weight_decay}")
    if weight_decay or callable(lr):
        matrices = lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)
        adam = optax.adamw(lr, b2=b2, weight_decay=weight_decay, mask=matrices)
    else:
        adam = optax.adam(lr, b2=b2)
    return guard_optimizer(optax.chain(optax.clip_by_global_norm(max_grad_norm), adam))


__all__ = ["ADAM_B2", "lm_optimizer"]
