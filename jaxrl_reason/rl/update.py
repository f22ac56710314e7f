"""The policy-update loop shared by the LM learner core (``rl.lm``: GRPO, SPIRAL, MemAgent, RALLY's LLM) and the
on-policy trainer (``rl.onpolicy``).

    step = gradient_step(loss_fn, optimizer)          # loss_fn(params, batch) -> (loss, metrics)
    (params, opt_state), metrics = step((params, opt_state), batch)
    (params, opt_state), metrics = minibatch_epochs(loss_fn, optimizer, params, opt_state, data, key,
                                                    epochs=2, minibatches=4)

Both are pure and meant to be called inside a jitted update; ``metrics`` gains ``grad_norm`` (before
clipping) and comes back stacked over the steps taken.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax


def gradient_step(loss_fn: Callable, optimizer: optax.GradientTransformation) -> Callable:
    """-> ``step((params, opt_state), batch) -> ((params, opt_state), metrics)``, scan-compatible."""

    def step(carry, batch):
        params, opt_state = carry
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        metrics = {**metrics, "grad_norm": optax.tree.norm(grads)}
        return (optax.apply_updates(params, updates), opt_state), metrics

    return step


def minibatch_epochs(loss_fn: Callable, optimizer: optax.GradientTransformation, params, opt_state, data, key,
                     epochs: int, minibatches: int, *, wrap: bool = False, group: int = 1):
    """``epochs`` passes over ``data`` (pytree of [N, ...] rows), each a fresh shuffle split into
    ``minibatches`` gradient steps. -> ((params, opt_state), metrics [E, M]).

    N must divide into ``minibatches`` unless ``wrap``: then each shuffle draws ``ceil(N / M) * M``
    positions modulo N, so the last few rows of an epoch are ones already seen (SPIRAL's turn counts).
    ``group`` > 1: the rows are N / group groups of consecutive rows that stay together, in order: the shuffle
    permutes groups and a minibatch holds whole groups (for a log-prob function that shares each group's
    prompt, ``models.lm.sequences.response_logprobs``)."""
    n = jax.tree.leaves(data)[0].shape[0]
    if group > 1 and (n % group or (n // group) % minibatches or wrap):
        raise ValueError(f"minibatch_epochs: {n} rows in groups of {group} do not split into {minibatches} "
                         f"minibatches of whole groups")
    if n % minibatches and not wrap:
        raise ValueError(f"minibatch_epochs: {n} rows do not split into {minibatches} minibatches")
    size = -(-n // minibatches)
    step = gradient_step(loss_fn, optimizer)

    def epoch(carry, k):
        if group > 1:
            groups = jax.random.permutation(k, n // group)
            perm = (groups[:, None] * group + jnp.arange(group)[None]).reshape(minibatches, size)
        else:
            perm = (jax.random.permutation(k, size * minibatches) % n).reshape(minibatches, size)
        return jax.lax.scan(step, carry, jax.tree.map(lambda x: x[perm], data))

    return jax.lax.scan(epoch, (params, opt_state), jax.random.split(key, epochs))
