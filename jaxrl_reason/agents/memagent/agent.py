"""MemAgent as one jitted transform: read a document chunk by chunk, overwriting a bounded memory.

    tok = CharTokenizer()                                   # models.tokenizer; the presets' vocabulary
    agent = MemAgent(MemAgentConfig(chunk_tokens=28, memory_tokens=8, question_tokens=8, answer_tokens=6), tok)
    out = run_agent(graphdef, state, batch, key, agent=agent)                  # greedy
    out.answer [B, A], out.answer_lens [B], out.memory [B, M], out.overflow [B] (truncated updates)
    out = run_agent(..., temperature=1.0, record=True)   # + out.turns: every conversation, for Multi-Conv RL

``MemAgentConfig`` holds the hyperparameters (shapes, template strings: a preset field); ``MemAgent``
binds it to a tokenizer and holds, as static Python ints and tuples, every id the jitted agent uses
(pad, bos, eos, the templates' literal ids, the initial memory), so it is the jit static argument: two
agents with equal ids share compiled programs whichever tokenizer object built them.

The document [B, L] is cut into n = ceil(L / C) chunks of C tokens (at least one; an empty or short
document gives one partial chunk). The reading is a text environment of the multi-turn protocol
(``MemoryEnv``, a ``rl.lm.multiturn.TextEnv``) driven by ``make_turn_rollout``: its ``lax.scan`` over the
n + 1 turns runs one *memory-update conversation* per chunk with the LM sampler: prompt = ``update_template`` filled with (question, chunk, previous
memory), response = new memory + <eos>. The new memory (at most M tokens) overwrites the old one;
a response that reaches M tokens without <eos> is truncated to M and counted in ``overflow``.
Chunks past a document's end (batches of ragged documents) leave the memory unchanged. The memory
starts as the fixed ``initial_memory`` text. A last *final-answer conversation* answers from
``final_template`` (question, memory) alone. Every conversation starts at position 0 and has a
static shape (prompts padded to the wider template, P = max of the two; the update turns sample at
most M + 1 tokens, the final one A + 1: ``TextStep.max_new``), turn keys are chained (``chain_keys``)
and nothing is recorded per turn unless ``record``, so memory and compute per chunk are constant: the
working set does not grow with the document and time is linear in its length.

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
from jaxrl_reason.rl.lm.multiturn import TextEnv, TextStep, Turns, lm_responder, make_turn_rollout
from jaxrl_reason.tasks.longcontext import encode_plain, exact_match
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
    turns: Turns | None = None  # record=True: every conversation, [n + 1, B, ...] (n updates, then the final answer;
    #   prompts [.., P], tokens [.., N] with N = max(M, A) + 1; reward: exact match at the last; info["active"])


def _respond(graphdef, state, prompts, prompt_lens, key, limit: int, temperature: float, *, pad_id: int,
             eos_id: int):
    """One conversation turn for every row (the reader's single turn): sample up to ``limit`` content tokens + <eos>.

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


class MemoryEnv(TextEnv):
    """MemAgent's reading as a ``rl.lm.multiturn.TextEnv`` (for ``make_turn_rollout``), bound to one ``DocBatch``.

    Turn t < n: the memory-update conversation of chunk t (observation: ``update_template`` of question, chunk,
    memory; limit M + 1 tokens); turn n: the final answer (``final_template`` of question, memory; limit A + 1;
    reward: exact match of the answer's ids with ``batch.answer``; done). Observations are right-padded to
    P = max(update, final prompt length). The document is read in place from the batch held here (each turn gathers
    its chunk; nothing of the document is carried or copied per chunk). State: {"i" [B] (turns taken), "memory"
    [B, M], "memory_lens", "overflow" [B] int32, "answer" [B, A], "answer_lens", "answer_overflow" [B] bool};
    ``info["active"]`` [B]: the turn is trained (an update of a chunk past the document's end is not)."""

    chain_keys = True  # a document of thousands of chunks: no [T] key array

    def __init__(self, agent: MemAgent, batch: DocBatch, mesh=None):
        b, width = batch.doc.shape
        self.agent, self.batch, self.mesh = agent, batch, mesh
        self.doc = batch.doc if width else jnp.full((b, 1), agent.pad_id, jnp.int32)  # empty: one empty chunk
        self.n = num_chunks(width, agent)
        self.max_turns = self.n + 1
        self.prompt_tokens = self.obs_tokens = max(agent.update_prompt_len, agent.final_prompt_len)

    def _chunk_lens(self, i):
        c = self.agent.config.chunk_tokens
        return jnp.clip(self.batch.doc_lens - i * c, 0, c).astype(jnp.int32)  # i [B]

    def _observe(self, i, state, reward, done, info) -> TextStep:
        """Turn i's prompt: chunk i's update conversation (i < n), else the final one."""
        agent, c, p = self.agent, self.agent.config.chunk_tokens, self.prompt_tokens
        ids = dict(bos_id=agent.bos_id, pad_id=agent.pad_id)
        question, memory = (self.batch.question, self.batch.question_lens), (state["memory"], state["memory_lens"])
        # gather the chunk in place (no [n, B, C] copy of the document: the working set stays flat)
        chunk = jnp.take_along_axis(self.doc, i[:, None] * c + jnp.arange(c), axis=1, mode="fill",
                                    fill_value=agent.pad_id)
        up = prompt_from_parts(agent.update_parts, {"question": question, "chunk": (chunk, self._chunk_lens(i)),
                                                    "memory": memory}, agent.update_prompt_len, **ids)
        fin = prompt_from_parts(agent.final_parts, {"question": question, "memory": memory}, agent.final_prompt_len,
                                **ids)
        widen = lambda x: jnp.pad(x, ((0, 0), (0, p - x.shape[1])), constant_values=agent.pad_id)
        update = i < self.n
        obs, obs_len = jnp.where(update[:, None], widen(up[0]), widen(fin[0])), jnp.where(update, up[1], fin[1])
        cfg = self.agent.config
        limit = jnp.where(update, cfg.memory_tokens, cfg.answer_tokens).astype(jnp.int32) + 1
        return TextStep(obs, obs_len, reward, done, info, max_new=limit)

    def reset(self, key, data=None):
        agent, cfg, b = self.agent, self.agent.config, self.doc.shape[0]
        mem, mem_lens = initial_memory(agent, b)
        state = {"i": jnp.zeros((b,), jnp.int32), "memory": mem, "memory_lens": mem_lens, "overflow": jnp.zeros((b,), jnp.int32),
                 "answer": jnp.full((b, cfg.answer_tokens), agent.pad_id, jnp.int32),
                 "answer_lens": jnp.zeros((b,), jnp.int32), "answer_overflow": jnp.zeros((b,), bool)}
        state = split_along(state, self.mesh, 0)
        return state, self._observe(state["i"], state, jnp.zeros((b,), jnp.float32), jnp.zeros((b,), bool),
                                    {"active": jnp.zeros((b,), bool)})

    def step(self, key, state, turn, turn_len):
        """turn [B, N] (the memory or the answer, <eos> included), turn_len [B] -> (state, the next TextStep)."""
        state = split_along(state, self.mesh, 0)
        cfg, i = self.agent.config, state["i"]
        m, a = cfg.memory_tokens, cfg.answer_tokens
        update, final = i < self.n, i >= self.n
        # a response that reaches its limit without <eos> is truncated to it: overflow
        content, lens, ended = cut_at_eos(turn, turn_len, jnp.where(update, m, a), self.agent.eos_id,
                                          self.agent.pad_id)
        active = update & (self._chunk_lens(i) > 0)
        answer = jnp.where(final[:, None], content[:, :a], state["answer"])
        state = {"i": i + 1,
                 "memory": jnp.where(active[:, None], content[:, :m], state["memory"]),
                 "memory_lens": jnp.where(active, lens, state["memory_lens"]),
                 "overflow": state["overflow"] + (active & ~ended).astype(jnp.int32),
                 "answer": answer, "answer_lens": jnp.where(final, lens, state["answer_lens"]),
                 "answer_overflow": jnp.where(final, ~ended, state["answer_overflow"])}
        reward = jnp.where(final, exact_match(content[:, :a], lens, self.batch.answer, self.batch.answer_lens), 0.0)
        return state, self._observe(i + 1, state, reward, final, {"active": active | final})


@functools.partial(jax.jit, static_argnames=("graphdef", "agent", "temperature", "record", "mesh"))
def run_agent(graphdef, state, batch: DocBatch, key, *, agent: MemAgent, temperature: float = 0.0,
              record: bool = False, mesh=None) -> AgentOutput:
    """The whole agent (all chunks + final answer) for a batch of documents: ``MemoryEnv`` in
    ``rl.lm.multiturn.make_turn_rollout``; see the module docstring. ``record``: ``out.turns``, every
    conversation. ``mesh``: the documents are split over its ``data`` axis (each device reads its slice)."""
    batch = split_along(batch, mesh, 0)
    config = agent.config
    if batch.question.shape[1] > config.question_tokens:
        raise ValueError(f"questions are {batch.question.shape[1]} tokens wide > question_tokens {config.question_tokens}")
    env = MemoryEnv(agent, batch, mesh)
    n_new = max(config.memory_tokens, config.answer_tokens) + 1  # each turn's own limit: TextStep.max_new
    respond = lm_responder(graphdef, SamplerConfig(max_new_tokens=n_new, temperature=temperature, pad_id=agent.pad_id),
                           stop_tokens=[agent.eos_id])
    turns, st = make_turn_rollout(env, respond, record=record)(state, key, None)
    return AgentOutput(answer=st["answer"], answer_lens=st["answer_lens"], answer_overflow=st["answer_overflow"],
                       memory=st["memory"], memory_lens=st["memory_lens"], overflow=st["overflow"], turns=turns)


def model_state(model) -> tuple:
    """NNX model -> (graphdef, state) for ``run_agent``."""
    return nnx.split(model)


def decode_rows(tokens, lens, tokenizer: Tokenizer) -> list[str]:
    """Right-padded rows -> text (control tokens spelled out)."""
    tokens, lens = np.asarray(tokens), np.asarray(lens)
    return [tokenizer.decode(t[: int(n)].tolist()) for t, n in zip(tokens, lens)]


__all__ = ["AgentOutput", "DocBatch", "FINAL_FIELDS", "MemAgent", "MemAgentConfig", "MemoryEnv", "UPDATE_FIELDS", "build_prompt",
           "decode_rows", "initial_memory", "model_state", "num_chunks", "pack", "parse_template", "prompt_from_parts",
           "render", "render_parts", "run_agent", "template_parts"]
