"""Supervised warm start on task traces (the "small SFT start" of the R1-Zero-style experiments).

    params = sft_warm_start(model, problems, steps=200, batch_size=32, seq_len=64, lr=1e-3, tokenizer=tok)

The SFT loop is the LM stack's ``models.lm.sft.fit`` (masked next-token loss, batches drawn with
replacement from ``problems``). ``prompt_loss=True`` also trains on the prompt text (a
pre-training-like objective; used to build a deliberately contaminated model for the probe).
``skip_spans`` (see ``tasks.base.sft_batch``) leaves trace character spans out of the loss.
Returns the trained nnx.Param state; the model object is updated in place as well.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxrl_reason.models.lm.sft import fit
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.tasks.base import Problem, sft_batch


def sft_warm_start(model, problems: Sequence[Problem], steps: int, batch_size: int, seq_len: int, lr: float,
                   seed: int = 0, prompt_loss: bool = False, with_trace: bool = True, skip_spans=None, *,
                   tokenizer: Tokenizer, trace_special: bool = False):
    if steps < 1 or batch_size < 1 or not problems:
        raise ValueError("sft_warm_start: need steps >= 1, batch_size >= 1 and a non-empty problem list")
    tokenizer.check_model(model.cfg, seq_len, "sft_warm_start")
    data = sft_batch(problems, seq_len, with_trace, skip_spans, tokenizer=tokenizer, trace_special=trace_special)
    if prompt_loss:
        data["loss_mask"] = (data["tokens"][:, 1:] != tokenizer.pad_id).astype(np.float32)
    return fit(model, data, steps, batch_size, lr, seed, name="sft_train")[0]
