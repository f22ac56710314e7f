"""Supervised warm start on task traces (the "small SFT start" of the R1-Zero-style experiments).

    params = sft_warm_start(model, problems, steps=200, batch_size=32, seq_len=64, lr=1e-3, tokenizer=tok)

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

from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.models.lm.train import init_train_state, make_optimizer, make_train_step
from jaxrl_reason.tasks.base import Problem, sft_batch
from jaxrl_reason.utils.guard import check_trained


@functools.lru_cache(maxsize=16)
def _sft_step(graphdef, lr: float, steps: int, seq_len: int, wrt=nnx.Param):
    """(optimizer, jitted train step), cached so repeated warm starts with equal settings compile once."""
    optimizer = make_optimizer(lr, steps, warmup_steps=min(20, steps // 10))
    return optimizer, make_train_step(graphdef, optimizer, chunk=seq_len, wrt=wrt)


def sft_warm_start(model, problems: Sequence[Problem], steps: int, batch_size: int, seq_len: int, lr: float,
                   seed: int = 0, prompt_loss: bool = False, with_trace: bool = True, skip_spans=None, *,
                   tokenizer: Tokenizer, trace_special: bool = False):
    if steps < 1 or batch_size < 1 or not problems:
        raise ValueError("sft_warm_start: need steps >= 1, batch_size >= 1 and a non-empty problem list")
    tokenizer.check_model(model.cfg, seq_len, "sft_warm_start")
    data = sft_batch(problems, seq_len, with_trace, skip_spans, tokenizer=tokenizer, trace_special=trace_special)
    if prompt_loss:
        data["loss_mask"] = (data["tokens"][:, 1:] != tokenizer.pad_id).astype(np.float32)
    return sft_train(model, data, steps, batch_size, lr, seed)


def sft_train(model, data: dict, steps: int, batch_size: int, lr: float, seed: int = 0, wrt=nnx.Param):
    """Masked next-token training on ``data`` ({"tokens" [N, T] int32, "loss_mask" [N, T-1]}, e.g. from
    ``tasks.base.sft_examples``), batches drawn with replacement; the model is updated in place and its
    trained state returned (``wrt``: the variables trained, e.g. ``LoRAParam`` for adapters only)."""
    if steps < 1 or batch_size < 1 or len(data["tokens"]) == 0:
        raise ValueError("sft_train: need steps >= 1, batch_size >= 1 and at least one example")
    graphdef = nnx.graphdef(model)
    optimizer, train_step = _sft_step(graphdef, lr, steps, data["tokens"].shape[1], wrt)
    _, state = init_train_state(model, optimizer, wrt)
    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(steps):
        idx = rng.integers(0, len(data["tokens"]), batch_size)
        state, metrics = train_step(state, {k: v[idx] for k, v in data.items()})
        losses.append(metrics["nll"])
    check_trained("sft_train", state, losses)
    nnx.update(model, state.params, state.rest)
    return state.params
