"""Full-context reader baseline: the same kind of LM answering from question + the whole document.

    rcfg = ReaderConfig(window=160, question_tokens=8, answer_tokens=6)
    out = run_reader(graphdef, state, batch, key, config=rcfg)   # (answer [B, A], answer_lens [B])
    fits(batch, rcfg)  # False when some document is longer than the window leaves room for

The reader has a fixed context window (``window`` = the model's ``max_seq_len``). A document that
does not fit is cut to its last ``doc_budget`` tokens (what a fixed-window model can see); its
accuracy then collapses with length, while the memory agent's does not. ``reader_conversations``
gives its SFT data (question + document -> answer).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp

from jaxrl_reason.agents.memagent.agent import DocBatch, _respond, build_prompt, parse_template, render
from jaxrl_reason.tasks.longcontext import LongContextProblem, encode_plain
from jaxrl_reason.tasks.vocab import VOCAB
from jaxrl_reason.utils.validation import check_hyperparameters

_FIELDS = ("question", "document")


@dataclasses.dataclass(frozen=True)
class ReaderConfig:
    window: int = 160
    question_tokens: int = 8
    answer_tokens: int = 6
    template: str = "{question}:{document}>"

    def __post_init__(self):
        check_hyperparameters(self)
        parse_template(self.template, _FIELDS)
        if self.question_tokens < 1 or self.answer_tokens < 1:
            raise ValueError("ReaderConfig: question_tokens and answer_tokens must be >= 1")
        if self.doc_budget < 1:
            raise ValueError(f"ReaderConfig: window {self.window} leaves no room for the document")

    @property
    def doc_budget(self) -> int:
        """Document tokens that fit: window - <bos> - template - question - answer - <eos>."""
        lit = sum(len(x) for k, x in parse_template(self.template, _FIELDS) if k == "lit")
        return self.window - 1 - lit - self.question_tokens - self.answer_tokens - 1


def fits(batch: DocBatch, config: ReaderConfig) -> bool:
    return int(jnp.max(batch.doc_lens)) <= config.doc_budget


def reader_conversations(problems: Sequence[LongContextProblem], config: ReaderConfig):
    """[(prompt ids, answer ids + <eos>)] for SFT; documents longer than the budget raise."""
    out = []
    for p in problems:
        if len(p.document) > config.doc_budget:
            raise ValueError(f"document of {len(p.document)} tokens exceeds the reader's budget {config.doc_budget}")
        ids = lambda s: encode_plain([s])[0][0].tolist() if s else []
        prompt = render(config.template, _FIELDS, {"question": ids(p.question), "document": ids(p.document)})
        out.append((prompt, ids(p.answer) + [VOCAB.eos]))
    return out


@functools.partial(jax.jit, static_argnames=("graphdef", "config"))
def run_reader(graphdef, state, batch: DocBatch, key, *, config: ReaderConfig):
    """Greedy answer from question + the last ``doc_budget`` tokens of each document."""
    d = config.doc_budget
    doc = jnp.pad(batch.doc, ((0, 0), (0, max(0, d - batch.doc.shape[1]))))
    start = jnp.maximum(batch.doc_lens - d, 0)
    tail = jax.vmap(lambda x, s: jax.lax.dynamic_slice(x, (s,), (d,)))(doc, start)
    tail_lens = jnp.minimum(batch.doc_lens, d)
    prompts, plens = build_prompt(config.template, _FIELDS, {
        "question": (batch.question, batch.question_lens), "document": (tail, tail_lens)},
        config.window - config.answer_tokens - 1)
    ans, lens, _, _, _ = _respond(graphdef, state, prompts, plens, key, config.answer_tokens, 0.0)
    return ans, lens


__all__ = ["ReaderConfig", "fits", "reader_conversations", "run_reader"]
