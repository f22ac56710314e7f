"""MemAgent as one jitted transform: read a document chunk by chunk, overwriting a bounded memory.

    tok = CharTokenizer()                                   # models.tokenizer; the presets' vocabulary
    agent = MemAgent(MemAgentConfig(chunk_tokens=28, memory_tokens=8, question_tokens=8, answer_tokens=6), tok)
    out = run_agent(graphdef, state, batch, key, agent=agent)                  # greedy
    out.answer [B, A], out.answer_lens [B], out.memory [B, M], out.overflow [B] (truncated updates)
    out = run_agent(..., temperature=1.0, record=True)   # + every conversation, for Multi-Conv RL

``MemAgentConfig`` holds the hyperparameters (shapes, template strings: a preset field); ``MemAgent``
binds it to a tokenizer and holds, as static Python ints and tuples, every id the jitted agent uses
(pad, bos, eos, the templates' literal ids, the initial memory), so it is the jit static argument: two
agents with equal ids share compiled programs whichever tokenizer object built them.

The document [B, L] is cut into n = ceil(L / C) chunks of C tokens (at least one; an empty or short
document gives one partial chunk). A ``lax.scan`` over chunks runs one *memory-update conversation*
per chunk with the LM sampler: prompt = ``update_template`` filled with (question, chunk, previous
memory), response = new memory + <eos>. The new memory (at most M tokens) overwrites the old one;
a response that reaches M tokens without <eos> is truncated to M and counted in ``overflow``.
Chunks past a document's end (batches of ragged documents) leave the memory unchanged. The memory
starts as the fixed ``initial_memory`` text. A last *final-answer conversation* answers from
``final_template`` (question, memory) alone. Every conversation starts at position 0 and has a
static shape, so memory and compute per chunk are constant: the working set does not grow with the
document and time is linear in its length.

Templates are strings with ``{question}``, ``{chunk}``, ``{memory}`` fields; their literal text is our
own, encoded with control tokens allowed (``<think>`` is one token), and must not contain text the
tokenizer maps to <unk>; field values are data (plain text, one token per character:
``tasks.longcontext.encode_plain``; the initial memory too). With a checkpoint tokenizer (``HFTokenizer``,
byte-level BPE) the literals are its canonical tokens and the data are spelled one single-character
token per character (valid ids, not the canonical tokenization); the memory the model writes and
reads back is whatever tokens it emits, multi-character ones included, and answers are scored on
decoded text in evaluation (``trainer.evaluate_agent``), on ids in the RL reward. Each prompt starts with <bos>. ``render``
builds the same prompt on the host (SFT data); ``build_prompt`` builds it inside jit from right-padded
segments (both from ``models.lm.prompts``, the templating JoyAgents shares).
"""

from __future__ import annotations

import dataclasses
import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_reason.models.lm.prompts import (  # noqa: F401 (build_prompt, pack, render: importable here too)
    build_prompt, pack, parse_template, prompt_from_parts, prompt_len, render, render_parts, template_parts)
from jaxrl_reason.models.lm.sampler import SamplerConfig, generate
from jaxrl_reason.models.lm.sequences import RowBatch, cut_at_eos
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.parallel.mesh import split_along
from jaxrl_reason.tasks.longcontext import encode_plain
from jaxrl_reason.utils.validation import check_hyperparameters

UPDATE_FIELDS = ("question", "chunk", "memory")
FINAL_FIELDS = ("question", "memory")


@dataclasses.dataclass(frozen=True)
class MemAgentConfig:
    """Static shapes and templates of the agent (hyperparameters, no tokenizer: ``MemAgent`` binds one)."""

    chunk_tokens: int = 28  # C
    memory_tokens: int = 8  # M
    question_tokens: int = 8
    answer_tokens: int = 6  # A
    update_template: str = "{question}:{chunk}:{memory}>"
    final_template: str = "{question}:{memory}>"
    initial_memory: str = "none"

    def __post_init__(self):
        check_hyperparameters(self)
        for f in ("chunk_tokens", "memory_tokens", "question_tokens", "answer_tokens"):
            if getattr(self, f) < 1:
                raise ValueError(f"MemAgentConfig: {f} must be >= 1, got {getattr(self, f)}")
        template_parts(self.update_template, UPDATE_FIELDS)
        template_parts(self.final_template, FINAL_FIELDS)


def _static(obj, **values) -> None:
    for k, v in values.items():
        object.__setattr__(obj, k, v)


@dataclasses.dataclass(frozen=True)
class MemAgent:
    """A ``MemAgentConfig`` bound to a tokenizer: the ids the jitted agent uses, as static Python values.

    Hashable and compared on the config and these ids, not on the tokenizer object (a jit static
    argument). ``tokenizer`` stays available for host-side encoding and decoding."""

    config: MemAgentConfig
    tokenizer: Tokenizer = dataclasses.field(compare=False, repr=False)
    pad_id: int = dataclasses.field(init=False)
    bos_id: int = dataclasses.field(init=False)
    eos_id: int = dataclasses.field(init=False)
    update_parts: tuple = dataclasses.field(init=False)  # parse_template of update_template
    final_parts: tuple = dataclasses.field(init=False)  # parse_template of final_template
    initial_ids: tuple[int, ...] = dataclasses.field(init=False)  # initial_memory as plain text

    def __post_init__(self):
        cfg, tok = self.config, self.tokenizer
        # plain text like the oracle memories (one token per character); checks the tokenizer (byte_table)
        initial = tuple(encode_plain([cfg.initial_memory], tokenizer=tok)[0][0].tolist())
        if len(initial) > cfg.memory_tokens:
            raise ValueError(f"MemAgent: initial_memory {cfg.initial_memory!r} has {len(initial)} tokens > "
                             f"memory_tokens {cfg.memory_tokens}")
        _static(self, pad_id=int(tok.pad_id), bos_id=int(tok.bos_id), eos_id=int(tok.eos_id), initial_ids=initial,
                update_parts=parse_template(cfg.update_template, UPDATE_FIELDS, tok),
                final_parts=parse_template(cfg.final_template, FINAL_FIELDS, tok))
        check_hyperparameters(self)  # the config's floats (no float of its own)

    def _widths(self) -> dict[str, int]:
        c = self.config
        return {"question": c.question_tokens, "chunk": c.chunk_tokens, "memory": c.memory_tokens}

    @property
    def update_prompt_len(self) -> int:
        return prompt_len(self.update_parts, self._widths())

    @property
    def final_prompt_len(self) -> int:
        return prompt_len(self.final_parts, self._widths())

    @property
    def seq_len(self) -> int:
        """Longest conversation (prompt + response + <eos>) the model must hold."""
        c = self.config
        return max(self.update_prompt_len + c.memory_tokens + 1, self.final_prompt_len + c.answer_tokens + 1)

    def check_model(self, model_cfg) -> None:
        self.tokenizer.check_model(model_cfg, self.seq_len, "MemAgent")


@flax.struct.dataclass
class DocBatch(RowBatch):
    """Right-padded token arrays. doc [B, L], question [B, Q], answer [B, A'] (expected), lens [B]."""

    doc: jax.Array
    doc_lens: jax.Array
    question: jax.Array
    question_lens: jax.Array
    answer: jax.Array
    answer_lens: jax.Array


@flax.struct.dataclass
class AgentOutput:
    answer: jax.Array  # [B, A]
    answer_lens: jax.Array  # [B]
    answer_overflow: jax.Array  # [B] bool: the answer had no <eos> within A tokens
    memory: jax.Array  # [B, M] final memory
    memory_lens: jax.Array  # [B]
    overflow: jax.Array  # [B] int32: memory updates truncated to M tokens
    updates: dict | None = None  # record=True: {"prompts" [n,B,P], "prompt_lens", "tokens" [n,B,M+1], "lengths", "active"}
    final: dict | None = None  # record=True: {"prompts" [B,Pf], "prompt_lens", "tokens" [B,A+1], "lengths"}


def _respond(graphdef, state, prompts, prompt_lens, key, limit: int, temperature: float, *, pad_id: int,
             eos_id: int):
    """One conversation turn for every row: sample up to ``limit`` content tokens + <eos>.

    -> (content [B, limit], content_lens [B], overflow [B] bool, raw tokens [B, limit+1], raw lengths [B]).
    """
    b = prompts.shape[0]
    scfg = SamplerConfig(max_new_tokens=limit + 1, temperature=temperature, pad_id=pad_id)
    out = generate(graphdef, state, prompts, prompt_lens, key, jnp.full((b, 1), eos_id, jnp.int32),
                   jnp.full((b,), limit + 1, jnp.int32), config=scfg)
    # a response without <eos> has all limit + 1 tokens (the only stop is <eos>): not ended = overflow
    content, n, ended = cut_at_eos(out.tokens, out.lengths, limit, eos_id, pad_id)
    return content, n, ~ended, out.tokens, out.lengths


def initial_memory(agent: MemAgent, b: int) -> tuple[jax.Array, jax.Array]:
    ids = agent.initial_ids
    mem = jnp.full((b, agent.config.memory_tokens), agent.pad_id, jnp.int32)
    mem = mem.at[:, : len(ids)].set(jnp.asarray(ids, jnp.int32).reshape(-1))
    return mem, jnp.full((b,), len(ids), jnp.int32)


def num_chunks(doc_width: int, agent: MemAgent) -> int:
    return max(1, -(-doc_width // agent.config.chunk_tokens))


@functools.partial(jax.jit, static_argnames=("graphdef", "agent", "temperature", "record", "mesh"))
def run_agent(graphdef, state, batch: DocBatch, key, *, agent: MemAgent, temperature: float = 0.0,
              record: bool = False, mesh=None) -> AgentOutput:
    """The whole agent (all chunks + final answer) for a batch of documents; see the module docstring.
    ``mesh``: the documents are split over its ``data`` axis (each device reads its slice)."""
    batch = split_along(batch, mesh, 0)
    config = agent.config
    b, width = batch.doc.shape
    c, m = config.chunk_tokens, config.memory_tokens
    if batch.question.shape[1] > config.question_tokens:
        raise ValueError(f"questions are {batch.question.shape[1]} tokens wide > question_tokens {config.question_tokens}")
    n = num_chunks(width, agent)
    doc = batch.doc if width else jnp.full((b, 1), agent.pad_id, jnp.int32)  # the empty document: one empty chunk
    question = (batch.question, batch.question_lens)
    ids = dict(bos_id=agent.bos_id, pad_id=agent.pad_id)
    respond = functools.partial(_respond, temperature=temperature, pad_id=agent.pad_id, eos_id=agent.eos_id)

    def update(carry, _):
        i, key, mem, mem_lens, overflow = split_along(carry, mesh, 0)  # (i and key: scalars, replicated)
        key, sub = jax.random.split(key)
        # gather the chunk in place (no [n, B, C] copy of the document: the working set stays flat)
        chunk = jnp.take(doc, i * c + jnp.arange(c), axis=1, mode="fill", fill_value=agent.pad_id)
        chunk_lens = jnp.clip(batch.doc_lens - i * c, 0, c).astype(jnp.int32)
        prompts, plens = prompt_from_parts(agent.update_parts, {
            "question": question, "chunk": (chunk, chunk_lens), "memory": (mem, mem_lens)},
            agent.update_prompt_len, **ids)
        new, new_lens, over, toks, lens = respond(graphdef, state, prompts, plens, sub, m)
        active = chunk_lens > 0
        mem = jnp.where(active[:, None], new, mem)
        mem_lens = jnp.where(active, new_lens, mem_lens)
        overflow = overflow + (active & over).astype(jnp.int32)
        rec = dict(prompts=prompts, prompt_lens=plens, tokens=toks, lengths=lens, active=active) if record else None
        return (i + 1, key, mem, mem_lens, overflow), rec

    key, k_final = jax.random.split(key)
    mem, mem_lens = initial_memory(agent, b)
    (_, _, mem, mem_lens, overflow), updates = jax.lax.scan(  # counter in the carry: no [n] inputs
        update, (jnp.int32(0), key, mem, mem_lens, jnp.zeros((b,), jnp.int32)), None, length=n)
    fprompts, fplens = prompt_from_parts(agent.final_parts, {"question": question, "memory": (mem, mem_lens)},
                                         agent.final_prompt_len, **ids)
    ans, ans_lens, ans_over, ftoks, flens = respond(graphdef, state, fprompts, fplens, k_final, config.answer_tokens)
    final = dict(prompts=fprompts, prompt_lens=fplens, tokens=ftoks, lengths=flens) if record else None
    return AgentOutput(answer=ans, answer_lens=ans_lens, answer_overflow=ans_over, memory=mem, memory_lens=mem_lens,
                       overflow=overflow, updates=updates, final=final)


def model_state(model) -> tuple:
    """NNX model -> (graphdef, state) for ``run_agent``."""
    return nnx.split(model)


def decode_rows(tokens, lens, tokenizer: Tokenizer) -> list[str]:
    """Right-padded rows -> text (control tokens spelled out)."""
    tokens, lens = np.asarray(tokens), np.asarray(lens)
    return [tokenizer.decode(t[: int(n)].tolist()) for t, n in zip(tokens, lens)]


__all__ = ["AgentOutput", "DocBatch", "FINAL_FIELDS", "MemAgent", "MemAgentConfig", "UPDATE_FIELDS", "build_prompt",
           "decode_rows", "initial_memory", "model_state", "num_chunks", "pack", "parse_template", "prompt_from_parts",
           "render", "render_parts", "run_agent", "template_parts"]
