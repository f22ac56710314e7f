"""MemAgent as one jitted transform: read a document chunk by chunk, overwriting a bounded memory.

    cfg = MemAgentConfig(chunk_tokens=28, memory_tokens=8, question_tokens=8, answer_tokens=6)
    out = run_agent(graphdef, state, batch, key, config=cfg)                    # greedy
    out.answer [B, A], out.answer_lens [B], out.memory [B, M], out.overflow [B] (truncated updates)
    out = run_agent(..., temperature=1.0, record=True)   # + every conversation, for Multi-Conv RL

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

Templates are plain strings (vocabulary characters only) with ``{question}``, ``{chunk}``, ``{memory}`` fields (special tags
like ``<think>`` allowed); each prompt starts with <bos>. ``render`` builds the same prompt on the
host (SFT data); ``pack`` builds it inside jit from right-padded segments.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_reason.models.lm.sampler import SamplerConfig, generate
from jaxrl_reason.tasks.vocab import VOCAB
from jaxrl_reason.utils.validation import check_hyperparameters

_FIELD = re.compile(r"\{(\w+)\}")


def parse_template(template: str, fields: tuple[str, ...]) -> tuple:
    """'{question}|{chunk}>' -> (("field", "question"), ("lit", (ids...)), ...); each field exactly once."""
    parts, names = [], []
    for i, piece in enumerate(_FIELD.split(template)):
        if i % 2:
            if piece not in fields:
                raise ValueError(f"template {template!r}: unknown field {{{piece}}}; allowed: {fields}")
            names.append(piece)
            parts.append(("field", piece))
        elif piece:
            ids = tuple(VOCAB.encode(piece))
            if VOCAB.unk in ids:
                raise ValueError(f"template {template!r}: {piece!r} has characters outside the vocabulary")
            parts.append(("lit", ids))
    for f in fields:
        if names.count(f) != 1:
            raise ValueError(f"template {template!r} must contain {{{f}}} exactly once (found {names.count(f)})")
    return tuple(parts)


@dataclasses.dataclass(frozen=True)
class MemAgentConfig:
    """Static shapes and templates of the agent (hashable: a jit static argument)."""

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
        parse_template(self.update_template, ("question", "chunk", "memory"))
        parse_template(self.final_template, ("question", "memory"))
        n = len(VOCAB.encode(self.initial_memory))
        if n > self.memory_tokens:
            raise ValueError(f"MemAgentConfig: initial_memory {self.initial_memory!r} has {n} tokens > "
                             f"memory_tokens {self.memory_tokens}")

    def _prompt_len(self, template: str, fields: tuple[str, ...]) -> int:
        width = {"question": self.question_tokens, "chunk": self.chunk_tokens, "memory": self.memory_tokens}
        return 1 + sum(len(p[1]) if p[0] == "lit" else width[p[1]] for p in parse_template(template, fields))

    @property
    def update_prompt_len(self) -> int:
        return self._prompt_len(self.update_template, ("question", "chunk", "memory"))

    @property
    def final_prompt_len(self) -> int:
        return self._prompt_len(self.final_template, ("question", "memory"))

    @property
    def seq_len(self) -> int:
        """Longest conversation (prompt + response + <eos>) the model must hold."""
        return max(self.update_prompt_len + self.memory_tokens + 1, self.final_prompt_len + self.answer_tokens + 1)

    def check_model(self, model_cfg) -> None:
        VOCAB.check_model(model_cfg, self.seq_len, "MemAgentConfig")


@flax.struct.dataclass
class DocBatch:
    """Right-padded token arrays. doc [B, L], question [B, Q], answer [B, A'] (expected), lens [B]."""

    doc: jax.Array
    doc_lens: jax.Array
    question: jax.Array
    question_lens: jax.Array
    answer: jax.Array
    answer_lens: jax.Array

    def __len__(self) -> int:
        return self.doc.shape[0]

    def repeat(self, g: int) -> "DocBatch":
        """Each document ``g`` times in a row ([B] -> [B*g], group-major)."""
        return jax.tree.map(lambda x: jnp.repeat(x, g, axis=0), self)


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


def render(template: str, fields: tuple[str, ...], values: dict[str, list[int]]) -> list[int]:
    """Host-side prompt: <bos> + template with each field replaced by its token ids."""
    out = [VOCAB.bos]
    for kind, x in parse_template(template, fields):
        out.extend(x if kind == "lit" else values[x])
    return out


def pack(segments: list[tuple[jax.Array, jax.Array]], width: int) -> tuple[jax.Array, jax.Array]:
    """Concatenate right-padded segments [(tokens [B, Ls], lens [B]), ...] -> (tokens [B, width], lens [B])."""
    b = segments[0][0].shape[0]
    out = jnp.full((b, width), VOCAB.pad, jnp.int32)
    offset = jnp.zeros((b,), jnp.int32)
    rows = jnp.arange(b)[:, None]
    for toks, lens in segments:
        pos = jnp.arange(toks.shape[1])[None]
        idx = jnp.where(pos < lens[:, None], offset[:, None] + pos, width)  # out of range -> dropped
        out = out.at[rows, idx].set(toks.astype(jnp.int32), mode="drop")
        offset = offset + lens
    return out, offset


def build_prompt(template: str, fields: tuple[str, ...], values: dict, width: int):
    """values: {field: (tokens [B, L], lens [B])} -> prompt (tokens [B, width], lens [B]), <bos> first."""
    b = next(iter(values.values()))[0].shape[0]
    const = lambda ids: (jnp.broadcast_to(jnp.asarray(ids, jnp.int32), (b, len(ids))), jnp.full((b,), len(ids), jnp.int32))
    segs = [const((VOCAB.bos,))]
    for kind, x in parse_template(template, fields):
        segs.append(const(x) if kind == "lit" else values[x])
    return pack(segs, width)


def _respond(graphdef, state, prompts, prompt_lens, key, limit: int, temperature: float):
    """One conversation turn for every row: sample up to ``limit`` content tokens + <eos>.

    -> (content [B, limit], content_lens [B], overflow [B] bool, raw tokens [B, limit+1], raw lengths [B]).
    """
    b = prompts.shape[0]
    scfg = SamplerConfig(max_new_tokens=limit + 1, temperature=temperature, pad_id=VOCAB.pad)
    out = generate(graphdef, state, prompts, prompt_lens, key, jnp.full((b, 1), VOCAB.eos, jnp.int32),
                   jnp.full((b,), limit + 1, jnp.int32), config=scfg)
    pos = jnp.arange(limit + 1)[None]
    is_eos = (out.tokens == VOCAB.eos) & (pos < out.lengths[:, None])
    has_eos = jnp.any(is_eos, axis=1)
    n = jnp.where(has_eos, jnp.argmax(is_eos, axis=1), out.lengths)
    overflow = n > limit
    n = jnp.minimum(n, limit)
    content = jnp.where(pos[:, :limit] < n[:, None], out.tokens[:, :limit], VOCAB.pad)
    return content, n.astype(jnp.int32), overflow, out.tokens, out.lengths


def initial_memory(config: MemAgentConfig, b: int) -> tuple[jax.Array, jax.Array]:
    ids = VOCAB.encode(config.initial_memory)
    mem = jnp.zeros((b, config.memory_tokens), jnp.int32).at[:, : len(ids)].set(jnp.asarray(ids, jnp.int32))
    return mem, jnp.full((b,), len(ids), jnp.int32)


def num_chunks(doc_width: int, config: MemAgentConfig) -> int:
    return max(1, -(-doc_width // config.chunk_tokens))


@functools.partial(jax.jit, static_argnames=("graphdef", "config", "temperature", "record"))
def run_agent(graphdef, state, batch: DocBatch, key, *, config: MemAgentConfig, temperature: float = 0.0,
              record: bool = False) -> AgentOutput:
    """The whole agent (all chunks + final answer) for a batch of documents; see the module docstring."""
    b, width = batch.doc.shape
    c, m = config.chunk_tokens, config.memory_tokens
    if batch.question.shape[1] > config.question_tokens:
        raise ValueError(f"questions are {batch.question.shape[1]} tokens wide > question_tokens {config.question_tokens}")
    n = num_chunks(width, config)
    doc = batch.doc if width else jnp.zeros((b, 1), jnp.int32)  # the empty document: one empty chunk
    question = (batch.question, batch.question_lens)
    fields = ("question", "chunk", "memory")

    def update(carry, _):
        i, key, mem, mem_lens, overflow = carry
        key, sub = jax.random.split(key)
        # gather the chunk in place (no [n, B, C] copy of the document: the working set stays flat)
        chunk = jnp.take(doc, i * c + jnp.arange(c), axis=1, mode="fill", fill_value=VOCAB.pad)
        chunk_lens = jnp.clip(batch.doc_lens - i * c, 0, c).astype(jnp.int32)
        prompts, plens = build_prompt(config.update_template, fields, {
            "question": question, "chunk": (chunk, chunk_lens), "memory": (mem, mem_lens)}, config.update_prompt_len)
        new, new_lens, over, toks, lens = _respond(graphdef, state, prompts, plens, sub, m, temperature)
        active = chunk_lens > 0
        mem = jnp.where(active[:, None], new, mem)
        mem_lens = jnp.where(active, new_lens, mem_lens)
        overflow = overflow + (active & over).astype(jnp.int32)
        rec = dict(prompts=prompts, prompt_lens=plens, tokens=toks, lengths=lens, active=active) if record else None
        return (i + 1, key, mem, mem_lens, overflow), rec

    key, k_final = jax.random.split(key)
    mem, mem_lens = initial_memory(config, b)
    (_, _, mem, mem_lens, overflow), updates = jax.lax.scan(  # counter in the carry: no [n] inputs
        update, (jnp.int32(0), key, mem, mem_lens, jnp.zeros((b,), jnp.int32)), None, length=n)
    fprompts, fplens = build_prompt(config.final_template, ("question", "memory"),
                                    {"question": question, "memory": (mem, mem_lens)}, config.final_prompt_len)
    ans, ans_lens, ans_over, ftoks, flens = _respond(graphdef, state, fprompts, fplens, k_final,
                                                     config.answer_tokens, temperature)
    final = dict(prompts=fprompts, prompt_lens=fplens, tokens=ftoks, lengths=flens) if record else None
    return AgentOutput(answer=ans, answer_lens=ans_lens, answer_overflow=ans_over, memory=mem, memory_lens=mem_lens,
                       overflow=overflow, updates=updates, final=final)


def model_state(model) -> tuple:
    """NNX model -> (graphdef, state) for ``run_agent``."""
    return nnx.split(model)


def decode_rows(tokens, lens) -> list[str]:
    tokens, lens = np.asarray(tokens), np.asarray(lens)
    return [VOCAB.decode(t[: int(n)], stop_at_pad=False) for t, n in zip(tokens, lens)]


__all__ = ["AgentOutput", "DocBatch", "MemAgentConfig", "build_prompt", "decode_rows", "initial_memory", "model_state",
           "num_chunks", "pack", "parse_template", "render", "run_agent"]
