"""Supervised warm start on task traces (the "small SFT start" of the R1-Zero-style experiments).

    params = sft_warm_start(model, problems, steps=200, batch_size=32, seq_len=64, lr=1e-3, key=key)

Uses the LM stack's masked next-token loss and jitted train step; batches are drawn (with
replacement) from ``problems``. ``prompt_loss=True`` also trains on the prompt text (a
pre-training-like objective; used to build a deliberately contaminated model for the probe).
``skip_spans`` (see ``tasks.base.sft_batch``) leaves trace character spans out of the loss.
Returns the trained nnx.Param state; the model object is updated in place as well.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
from flax import nnx

from jaxrl_reason.models.lm.train import init_train_state, make_optimizer, make_train_step
from jaxrl_reason.tasks.base import Problem, sft_batch
from jaxrl_reason.utils.guard import check_trained


@functools.lru_cache(maxsize=16)
def _sft_step(graphdef, lr: float, steps: int, seq_len: int):
    """(optimizer, jitted train step), cached so repeated warm starts with equal settings compile once."""
    optimizer = make_optimizer(lr, steps, warmup_steps=min(20, steps // 10))
    return optimizer, make_train_step(graphdef, optimizer, chunk=seq_len)


def sft_warm_start(model, problems: Sequence[Problem], steps: int, batch_size: int, seq_len: int, lr: float,
                   seed: int = 0, prompt_loss: bool = False, with_trace: bool = True, skip_spans=None):
    if steps < 1 or batch_size < 1 or not problems:
        raise ValueError("sft_warm_start: need steps >= 1, batch_size >= 1 and a non-empty problem list")
    data = sft_batch(problems, seq_len, with_trace, skip_spans)
    if prompt_loss:
        data["loss_mask"] = (data["tokens"][:, 1:] != 0).astype(np.float32)
    graphdef = nnx.graphdef(model)
    optimizer, train_step = _sft_step(graphdef, lr, steps, seq_len)
    _, state = init_train_state(model, optimizer)
    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(steps):
        idx = rng.integers(0, len(problems), batch_size)
        state, metrics = train_step(state, {k: v[idx] for k, v in data.items()})
        losses.append(metrics["nll"])
    check_trained("sft_warm_start", state, losses)
    nnx.update(model, state.params, state.rest)
    return state.params
