"""Token layout of the SPIRAL language model, shared by the games and the reasoning tasks.

Ids ``0..7`` are the special tokens of ``tasks.vocab`` (``<pad>``, ``<bos>``, ``<eos>``,
``<think>``, ...), ids ``8..263`` are bytes (byte ``b`` -> ``b + OFFSET``): game prompts are the
text interface's byte ids with ``offset=OFFSET`` (``envs/games/text.py``). Task prompts, written in
the task character vocabulary, are translated with ``to_lm`` / ``from_lm`` (a table lookup, so
``tasks.rewards.score`` scores the LM's output unchanged). Why an adapter: the game text needs
characters (``\\``, ``{``, ``|``, newline) that the task vocabulary does not have.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxrl_reason.tasks.vocab import CHARS, SPECIALS, VOCAB

OFFSET = len(SPECIALS)  # 8
VOCAB_SIZE = OFFSET + 256  # 264
PAD, BOS, EOS = VOCAB.pad, VOCAB.bos, VOCAB.eos

# task id -> LM id
_TO_LM = np.asarray(list(range(OFFSET)) + [ord(c) + OFFSET for c in CHARS], np.int32)
# LM id -> task id (bytes outside the task characters -> <unk>)
_FROM_LM = np.full(VOCAB_SIZE, VOCAB.unk, np.int32)
_FROM_LM[_TO_LM] = np.arange(len(_TO_LM), dtype=np.int32)


def to_lm(task_ids):
    """Task-vocabulary ids (any shape) -> LM ids."""
    return jnp.asarray(_TO_LM)[jnp.asarray(task_ids)]


def from_lm(lm_ids):
    """LM ids (any shape) -> task-vocabulary ids (``<unk>`` for bytes the tasks do not use)."""
    return jnp.asarray(_FROM_LM)[jnp.clip(jnp.asarray(lm_ids), 0, VOCAB_SIZE - 1)]


def encode(text: str) -> np.ndarray:
    """ASCII text -> LM byte ids ``[len]``."""
    return np.frombuffer(text.encode("ascii"), np.uint8).astype(np.int32) + OFFSET


def decode(ids) -> str:
    """LM ids -> text; specials are written as their tag (``<eos>``), padding is dropped."""
    out = []
    for t in np.asarray(ids).reshape(-1).tolist():
        if t == PAD:
            continue
        out.append(SPECIALS[t] if t < OFFSET else chr(t - OFFSET))
    return "".join(out)
