"""Full-context reader baseline: the same kind of LM answering from question + the whole document.

    reader = Reader(ReaderConfig(window=160, question_tokens=8, answer_tokens=6), tokenizer)
    out = run_reader(graphdef, state, batch, key, reader=reader)   # (answer [B, A], answer_lens [B])
    fits(batch, reader)  # False when some document is longer than the window leaves room for

The reader has a fixed context window (``window`` = the model's ``max_seq_len``). A document that
does not fit is cut to its last ``doc_budget`` tokens (what a fixed-window model can see); its
accuracy then collapses with length, while the memory agent's does not. ``reader_conversations``
gives its SFT data (question + document -> answer). ``Reader`` binds the config to a tokenizer (the
static ids of the jitted reader, as ``agent.MemAgent`` does); text is encoded as the agent's is
(plain text one token per character, template literals canonically), and answers are token ids
(score them with ``tasks.longcontext.exact_match_text`` on decoded text).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp

from jaxrl_reason.agents.memagent.agent import DocBatch, _respond
from jaxrl_reason.agents.memagent.data import text_ids
from jaxrl_reason.models.lm.prompts import parse_template, prompt_from_parts, prompt_len, render_parts, template_parts
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.tasks.longcontext import LongContextProblem
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
        template_parts(self.template, _FIELDS)
        if self.question_tokens < 1 or self.answer_tokens < 1:
            raise ValueError("ReaderConfig: question_tokens and answer_tokens must be >= 1")


@dataclasses.dataclass(frozen=True)
class Reader:
    """A ``ReaderConfig`` bound to a tokenizer: static ids for the jitted reader (compared and hashed
    on the config and ids, not on the tokenizer object)."""

    config: ReaderConfig
    tokenizer: Tokenizer = dataclasses.field(compare=False, repr=False)
    pad_id: int = dataclasses.field(init=False)
    bos_id: int = dataclasses.field(init=False)
    eos_id: int = dataclasses.field(init=False)
    parts: tuple = dataclasses.field(init=False)  # parse_template of the template

    def __post_init__(self):
        tok = self.tokenizer
        for k, v in dict(pad_id=int(tok.pad_id), bos_id=int(tok.bos_id), eos_id=int(tok.eos_id),
                         parts=parse_template(self.config.template, _FIELDS, tok)).items():
            object.__setattr__(self, k, v)
        if self.doc_budget < 1:
            raise ValueError(f"Reader: window {self.config.window} leaves no room for the document")
        check_hyperparameters(self)  # the config's floats (no float of its own)

    @property
    def doc_budget(self) -> int:
        """Document tokens that fit: window - <bos> - template - question - answer - <eos>."""
        c = self.config
        return c.window - prompt_len(self.parts, {"question": c.question_tokens, "document": 0}) - c.answer_tokens - 1


def fits(batch: DocBatch, reader: Reader) -> bool:
    return int(jnp.max(batch.doc_lens)) <= reader.doc_budget


def reader_conversations(problems: Sequence[LongContextProblem], reader: Reader):
    """[(prompt ids, answer ids + <eos>)] for SFT; documents longer than the budget raise."""
    ids = lambda s: text_ids(s, reader.tokenizer)
    out = []
    for p in problems:
        if len(p.document) > reader.doc_budget:
            raise ValueError(f"document of {len(p.document)} tokens exceeds the reader's budget {reader.doc_budget}")
        prompt = render_parts(reader.parts, {"question": ids(p.question), "document": ids(p.document)}, reader.bos_id)
        out.append((prompt, ids(p.answer) + [reader.eos_id]))
    return out


@functools.partial(jax.jit, static_argnames=("graphdef", "reader"))
def run_reader(graphdef, state, batch: DocBatch, key, *, reader: Reader):
    """Greedy answer from question + the last ``doc_budget`` tokens of each document."""
    config, d = reader.config, reader.doc_budget
    doc = jnp.pad(batch.doc, ((0, 0), (0, max(0, d - batch.doc.shape[1]))), constant_values=reader.pad_id)
    start = jnp.maximum(batch.doc_lens - d, 0)
    tail = jax.vmap(lambda x, s: jax.lax.dynamic_slice(x, (s,), (d,)))(doc, start)
    tail_lens = jnp.minimum(batch.doc_lens, d)
    prompts, plens = prompt_from_parts(reader.parts, {
        "question": (batch.question, batch.question_lens), "document": (tail, tail_lens)},
        config.window - config.answer_tokens - 1, bos_id=reader.bos_id, pad_id=reader.pad_id)
    ans, lens, _, _, _ = _respond(graphdef, state, prompts, plens, key, config.answer_tokens, 0.0,
                                  pad_id=reader.pad_id, eos_id=reader.eos_id)
    return ans, lens


__all__ = ["Reader", "ReaderConfig", "fits", "reader_conversations", "run_reader"]
