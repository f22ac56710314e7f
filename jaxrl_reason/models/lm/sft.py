"""Supervised fine-tuning: (prompt, response) pairs -> masked token arrays, and the one SFT loop, ``fit``.

    data = sft_examples(prompts, responses, seq_len, tokenizer)   # {"tokens" [N, T], "loss_mask" [N, T-1]}
    params, losses = fit(model, data, steps=300, batch_size=32, lr=3e-3, seed=0)   # model updated in place

``fit`` runs the LM stack's jitted train step (``train.make_train_step``: masked next-token NLL, MTP and
MoE terms when configured) under AdamW with a warmup-cosine schedule (``train.make_optimizer``, warmup
``min(20, steps // 10)``), each step on ``batch_size`` rows drawn with replacement (``draw_rows``). What
differs between its users is an option: the row stream (a numpy seed, or a jax key), the head chunk, the
trained variables (``wrt``: LoRA adapters only), logging and a progress bar. The loss mask is the data's.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Iterator, Sequence

import jax
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from jaxrl_reason.models.lm.train import init_train_state, make_optimizer, make_train_step
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.utils.guard import check_trained
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """A supervised warm start: ``problems`` generated examples (problems, requests, ...), then ``fit`` for
    ``steps`` steps of ``batch_size`` rows at peak learning rate ``lr``."""

    problems: int = 512
    steps: int = 300
    batch_size: int = 64
    lr: float = 3e-3

    def __post_init__(self):
        check_hyperparameters(self)
        if self.problems < 1 or self.steps < 1 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError(f"SFTConfig: problems, steps, batch_size must be >= 1 and lr > 0, got {self}")


def sft_examples(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], seq_len: int,
                 tokenizer: Tokenizer) -> dict:
    """(prompt ids, response ids) pairs -> {"tokens" [N, seq_len] int32 (prompt + response, right-padded with the
    tokenizer's pad), "loss_mask" [N, seq_len-1] float32: 1 where the target tokens[:, t+1] is a response token}."""
    tokens, lens = tokenizer.pad_batch([list(q) + list(r) for q, r in zip(prompts, responses)], seq_len)
    t = np.arange(seq_len - 1)[None]
    starts = np.asarray([len(q) for q in prompts])[:, None]
    mask = (t + 1 >= starts) & (t + 1 < lens[:, None])
    return {"tokens": tokens, "loss_mask": mask.astype(np.float32)}


def draw_rows(seed, n: int, batch_size: int, steps: int) -> Iterator:
    """Each step's row indices [batch_size] into n rows, drawn with replacement: from
    ``np.random.default_rng(seed)`` for an int (or int sequence) seed, from ``jax.random`` (the key split into
    ``steps``) for a jax key."""
    if isinstance(seed, jax.Array):
        for k in jax.random.split(seed, steps):
            yield jax.random.randint(k, (batch_size,), 0, n)
    else:
        rng = np.random.default_rng(seed)
        for _ in range(steps):
            yield rng.integers(0, n, batch_size)


@functools.lru_cache(maxsize=16)
def _train_step(graphdef, lr: float, steps: int, chunk: int, wrt):
    """(optimizer, jitted train step), cached: repeated fits with equal settings compile once."""
    optimizer = make_optimizer(lr, steps, warmup_steps=min(20, steps // 10))
    return optimizer, make_train_step(graphdef, optimizer, chunk=chunk, wrt=wrt)


def fit(model, data: dict, steps: int, batch_size: int, lr: float, seed=0, wrt=nnx.Param, *, chunk: int | None = None,
        name: str = "fit", log: Callable[[int, dict], None] | None = None, progress: str | None = None):
    """Masked next-token training of ``model`` on ``data`` ({"tokens" [N, T] int32, "loss_mask" [N, T-1]}).

    seed: the row stream (``draw_rows``: numpy seed or jax key). wrt: the variables trained (``nnx.Param``, or
    ``lora.LoRAParam`` for adapters only). chunk: positions per head chunk (default T). name: the step's
    label in a ``NonFiniteError``. log(step, metrics): called after every step. progress: a tqdm label.
    -> (trained state of ``wrt``, per-step NLL float32 [steps]); the model is updated in place.
    """
    n = len(data["tokens"])
    if steps < 1 or batch_size < 1 or n == 0:
        raise ValueError(f"{name}: need steps >= 1, batch_size >= 1 and at least one example")
    optimizer, step = _train_step(nnx.graphdef(model), lr, steps, chunk or data["tokens"].shape[1], wrt)
    _, state = init_train_state(model, optimizer, wrt)
    losses = []
    rows = draw_rows(seed, n, batch_size, steps)
    for i, idx in enumerate(tqdm(rows, total=steps, desc=progress, leave=False) if progress else rows):
        state, metrics = step(state, {k: v[idx] for k, v in data.items()})
        losses.append(metrics["nll"])
        if log is not None:
            log(i, metrics)
    check_trained(name, state, losses)
    nnx.update(model, state.params, state.rest)
    return state.params, np.asarray(jax.device_get(losses))


__all__ = ["SFTConfig", "draw_rows", "fit", "sft_examples"]
