"""Long-context key-value retrieval (RULER-/HotpotQA-like, synthetic) for memory agents.

A document is a run of fixed-width *fact slots* (``slot_chars`` characters each, space padded):

    value fact   "KQ=417;"    key KQ holds value 417
    link fact    "KQ>MZ; "    key KQ points to key MZ (multi-hop only)

Every other slot is a distractor: with ``haystack="facts"`` a fact with a different key (the hard,
RULER multi-key kind), with ``haystack="noise"`` random lowercase filler (RULER's single needle in a
noise haystack: no digits, so only the needle can be copied). Two kinds of question:

    "needle"    question "KQ=?"     answer: the value of KQ                    (single needle)
    "multihop"  question "KQ>?=?"   answer: the value of the key KQ points to  (two hops; the
                a distractor "KQ=ddd" is planted as a one-hop trap, the link comes before the value)

Length is counted in facts (``num_facts``); with ``chunk_chars = facts_per_chunk * slot_chars`` a
document is ``num_facts / facts_per_chunk`` chunks (1 chunk .. >= 1,000 chunks) and no fact
straddles a chunk boundary. ``answer_position`` in [0, 1] places the answer fact (None: uniform).
With probability ``p_no_answer`` the answer fact is left out (or, for multi-hop, the link): the
expected answer is then ``no_answer`` ("none"), the same text as the agent's initial memory.
``num_facts = 0`` is the empty document (expected answer ``no_answer``).

Text becomes ids through the tokenizer handed in (``encode_plain(texts, tokenizer=tok)``), one token
per character: with our character-level tokenizers (``models.tokenizer.CharTokenizer``, the presets',
and ``ByteTokenizer``) that is their own encoding; with a checkpoint tokenizer (``HFTokenizer``) in
which every printable ASCII character is one token (byte-level BPE: Qwen2/3, Llama 3, DeepSeek-V3)
the text is *spelled* one single-character token per character -- a valid id sequence that decodes
back to the text, but not the canonical (merged) tokenization of it (``byte_table``). Rewards are
exact match on token ids (``exact_match``, jit-able: a multi-character token a checkpoint model emits
never equals the spelled target) or, for evaluation, on the decoded text (``exact_match_text``, host:
``tokenizer.decode`` reads multi-character tokens). ``oracle_update`` is the ideal
memory-overwrite rule (SFT targets for a memory agent): memory is ``no_answer`` until evidence is
seen, then the bridge key (multi-hop, after the link) and finally the answer value.

Why our own: RULER/HotpotQA need word tokenisers and real text; this keeps the same structure
(needle in distractors, two-hop bridge, controlled position and length) with a character tokenizer.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import jax.numpy as jnp
import numpy as np

from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.utils.validation import UNIT, Range, Rule, at_least, check_hyperparameters, one_of, or_none, require

KINDS = ("needle", "multihop")
HAYSTACKS = ("facts", "noise")
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _name(tokenizer: Tokenizer) -> str:
    return f"{type(tokenizer).__name__} (vocab_size {tokenizer.vocab_size})"


@functools.lru_cache(maxsize=16)
def byte_table(tokenizer: Tokenizer) -> np.ndarray:
    """ASCII byte -> id lookup [256] int32: plain text spelled one token per character (bytes >= 128
    never occur: ``encode_plain`` maps them to '?').

    Our own tokenizers (anything but ``HFTokenizer``: ``CharTokenizer``, ``ByteTokenizer``) must be
    character-level: every ASCII character one token and ``encode`` of a string equal to its characters
    encoded one by one, so ``encode_plain`` is exactly their ``encode``. A checkpoint tokenizer
    (``HFTokenizer``) needs every printable ASCII character to be one token whose spelling decodes back
    to the text (true for byte-level BPE); its merges are not applied, so the ids are valid but not the
    canonical tokenization. Other ASCII characters (control characters, never in the tasks' text) that
    are not one token map to '?'. The single-token ids are ``Tokenizer.char_ids``. ValueError naming the
    tokenizer and the first offending character."""
    from jaxrl_reason.models.tokenizer import HFTokenizer

    checkpoint = isinstance(tokenizer, HFTokenizer)
    table = np.full(256, -1, np.int32)
    table[:128] = tokenizer.char_ids()
    for b in np.flatnonzero(table[:128] < 0).tolist():
        ids = tokenizer.encode(chr(b))
        if not checkpoint and len(ids) == 1:  # ours: encode_plain is exactly encode (CharTokenizer's <unk> too)
            table[b] = ids[0]
        elif not checkpoint or chr(b).isprintable():
            raise ValueError(f"encode_plain needs one token per ASCII character; {_name(tokenizer)} encodes "
                             f"{chr(b)!r} as {len(ids)} tokens {ids}, not a single token that decodes back to it")
    table[table < 0] = table[ord("?")]
    sample = "".join(chr(b) for b in range(32, 127)) * 2
    spelled = table[np.frombuffer(sample.encode("ascii"), np.uint8)].tolist()
    if not checkpoint and tokenizer.encode(sample) != spelled:
        raise ValueError(f"encode_plain needs a character-level tokenizer; {_name(tokenizer)} encodes a "
                         "string differently from its characters one by one")
    if checkpoint and tokenizer.decode(spelled) != sample:
        raise ValueError(f"encode_plain: {_name(tokenizer)} does not decode text spelled one token per "
                         f"character back to the text (got {tokenizer.decode(spelled)[:40]!r}...; e.g. a "
                         "SentencePiece tokenizer whose single characters carry a word-start marker)")
    table.flags.writeable = False
    return table


def encode_plain(texts: list[str], length: int | None = None, *, tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Fast vectorised encoding of plain ASCII text (data: control-token strings stay characters; other
    characters become '?'), one token per character (``byte_table``) -> (ids [B, L] right-padded with
    ``tokenizer.pad_id``, lens [B])."""
    table = byte_table(tokenizer)
    lens = np.asarray([len(t) for t in texts], np.int32)
    length = int(lens.max(initial=0)) if length is None else length
    if (lens > length).any():
        raise ValueError(f"text of {int(lens.max())} characters does not fit the padded length {length}")
    out = np.full((len(texts), length), tokenizer.pad_id, np.int32)
    for i, t in enumerate(texts):
        if t:
            out[i, : len(t)] = table[np.frombuffer(t.encode("ascii", "replace"), np.uint8)]
    return out, lens


@dataclasses.dataclass(frozen=True)
class LongContextProblem:
    question: str
    document: str
    answer: str
    evidence: tuple[int, ...]  # slot indices of the facts needed (empty if the answer is absent)
    kind: str


@dataclasses.dataclass(frozen=True)
class LongContextTask:
    kind: str = "needle"
    haystack: str = "facts"
    num_facts: int = 16  # document length in fact slots
    facts_per_chunk: int = 4
    key_len: int = 2
    value_len: int = 3
    answer_position: float | None = None  # fraction of the document; None = uniform
    p_no_answer: float = 0.0
    no_answer: str = "none"

    # rules of one field (utils.validation; p_no_answer: its name's range [0, 1]); between fields, in __post_init__
    CHECKS = (("kind", one_of(KINDS)),
              ("haystack", one_of(HAYSTACKS)),
              ("num_facts", at_least(0), "0 = empty document"),
              ("facts_per_chunk", at_least(1)),
              ("key_len", Range(1, 3)),
              ("value_len", Range(1, 6)),
              ("answer_position", or_none(UNIT, "uniform")),
              ("no_answer", Rule(lambda s: bool(s) and not any(c.isdigit() for c in s), "non-empty, without digits")))

    def __post_init__(self):
        check_hyperparameters(self)
        require(self, self.kind == "needle" or self.num_facts != 1,
                "a multi-hop document needs >= 2 fact slots (link + value), or 0 (empty)")

    # ------------------------------------------------------------------ sizes
    @property
    def slot_chars(self) -> int:
        return max(self.key_len + 1 + self.value_len, 2 * self.key_len + 1) + 1

    @property
    def chunk_chars(self) -> int:
        """Chunk size (characters = tokens) that keeps whole facts in every chunk."""
        return self.facts_per_chunk * self.slot_chars

    @property
    def num_chunks(self) -> int:
        return -(-self.num_facts // self.facts_per_chunk)

    @property
    def doc_chars(self) -> int:
        return self.num_facts * self.slot_chars

    @property
    def question_chars(self) -> int:
        return self.key_len + (2 if self.kind == "needle" else 4)

    @property
    def answer_chars(self) -> int:
        return max(self.value_len, len(self.no_answer))

    def with_length(self, num_facts: int) -> "LongContextTask":
        return dataclasses.replace(self, num_facts=num_facts)

    # ------------------------------------------------------------------ text
    def _slot(self, text: str) -> str:
        return text.ljust(self.slot_chars)

    def question_text(self, key: str) -> str:
        return f"{key}=?" if self.kind == "needle" else f"{key}>?=?"

    def _key(self, rng) -> str:
        return "".join(LETTERS[i] for i in rng.integers(0, 26, self.key_len))

    def _value(self, rng) -> str:
        return "".join(str(d) for d in rng.integers(0, 10, self.value_len))

    def generate(self, rng: np.random.Generator) -> LongContextProblem:
        n = self.num_facts
        key = self._key(rng)
        bridge = self._key(rng)
        while bridge == key:
            bridge = self._key(rng)
        reserved = {key, bridge}
        slots = []
        for _ in range(n):  # distractors: value facts (and link facts for multi-hop) with other keys
            k = self._key(rng)
            while k in reserved:
                k = self._key(rng)
            if self.haystack == "noise":
                w = self.slot_chars - 1
                slots.append("".join(" " if r < 0.2 else chr(97 + int(r * 100) % 26) for r in rng.random(w)))
            elif self.kind == "multihop" and rng.random() < 0.5:
                k2 = self._key(rng)
                while k2 in reserved:
                    k2 = self._key(rng)
                slots.append(f"{k}>{k2};")
            else:
                slots.append(f"{k}={self._value(rng)};")
        value = self._value(rng)
        absent = n == 0 or rng.random() < self.p_no_answer
        if self.answer_position is None:
            pos = int(rng.integers(0, max(n, 1)))
        else:
            pos = int(round(self.answer_position * (n - 1))) if n else 0
        evidence: tuple[int, ...] = ()
        if self.kind == "needle":
            if not absent:
                slots[pos] = f"{key}={value};"
                evidence = (pos,)
        elif n:
            pos = max(pos, 1)
            link = int(rng.integers(0, pos))
            trap_choices = [i for i in range(n) if i not in (pos, link)]
            if trap_choices and self.haystack == "facts":  # one-hop trap: the question key itself with a wrong value
                trap_val = self._value(rng)
                while trap_val == value:
                    trap_val = self._value(rng)
                slots[int(rng.choice(trap_choices))] = f"{key}={trap_val};"
            slots[pos] = f"{bridge}={value};"
            if not absent:
                slots[link] = f"{key}>{bridge};"
                evidence = (link, pos)
        doc = "".join(self._slot(s) for s in slots)
        answer = self.no_answer if absent else value
        return LongContextProblem(question=self.question_text(key), document=doc, answer=answer,
                                  evidence=evidence, kind=self.kind)

    def generate_batch(self, rng: np.random.Generator, n: int) -> list[LongContextProblem]:
        return [self.generate(rng) for _ in range(n)]

    # ------------------------------------------------------------------ oracle memory
    def oracle_update(self, question: str, chunk: str, memory: str) -> str:
        """The ideal new memory after reading ``chunk`` (memory-overwrite rule, host-side)."""
        key = question.split("=")[0].split(">")[0]
        val = r"=(\d+);"
        if self.kind == "needle":
            m = re.search(re.escape(key) + val, chunk)
            return m.group(1) if m else memory
        if memory.isdigit():
            return memory
        bridge = memory if memory != self.no_answer else None
        for fact in chunk.replace(" ", "").split(";"):
            if bridge is None and fact.startswith(key + ">"):
                bridge = fact[len(key) + 1:]
            elif bridge is not None and fact.startswith(bridge + "=") and fact[len(bridge) + 1:].isdigit():
                return fact[len(bridge) + 1:]
        return bridge if bridge is not None else memory

    def oracle_answer(self, question: str, memory: str) -> str:
        """The ideal final answer from question + memory."""
        return memory if memory.isdigit() else self.no_answer

    def oracle_memories(self, p: LongContextProblem, chunk_chars: int | None = None) -> list[str]:
        """Memory after each chunk ([] for an empty document), starting from ``no_answer``."""
        c = chunk_chars or self.chunk_chars
        mem, out = self.no_answer, []
        for i in range(0, len(p.document), c):
            mem = self.oracle_update(p.question, p.document[i:i + c], mem)
            out.append(mem)
        return out


def exact_match(pred: jnp.ndarray, pred_lens: jnp.ndarray, target: jnp.ndarray, target_lens: jnp.ndarray) -> jnp.ndarray:
    """Exact string match on token ids: pred [B, A], target [B, A'] (right-padded), lens [B] -> [B] float32."""
    a = max(pred.shape[1], target.shape[1])
    pad = lambda x: jnp.pad(x, ((0, 0), (0, a - x.shape[1])))
    pos = jnp.arange(a)[None]
    p = jnp.where(pos < pred_lens[:, None], pad(pred), -1)
    t = jnp.where(pos < target_lens[:, None], pad(target), -1)
    return (jnp.all(p == t, axis=1) & (pred_lens == target_lens)).astype(jnp.float32)


def exact_match_text(pred, pred_lens, target, target_lens, tokenizer: Tokenizer) -> np.ndarray:
    """Exact string match of the decoded rows (host): pred [B, A], target [B, A'] right-padded ids,
    lens [B] -> [B] float32. ``tokenizer.decode`` reads any token, so a checkpoint model's answer in
    multi-character tokens ("417" as one token) matches its target spelled one token per character;
    control tokens decode spelled out and a row with an id outside the tokenizer's vocabulary (a model
    head larger than it) never matches. With a character-level tokenizer and plain-text targets this
    equals ``exact_match`` on ids."""
    def decode(ids, lens):
        rows = [r[: int(n)] for r, n in zip(np.asarray(ids), np.asarray(lens))]
        return [tokenizer.decode(r.tolist()) if ((r >= 0) & (r < tokenizer.vocab_size)).all() else None
                for r in rows]

    return np.asarray([a is not None and a == b for a, b in zip(decode(pred, pred_lens), decode(target, target_lens))],
                      np.float32)


__all__ = ["KINDS", "LongContextProblem", "LongContextTask", "byte_table", "encode_plain", "exact_match",
           "exact_match_text"]
