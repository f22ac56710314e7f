"""A verifiable multi-task assistant benchmark for routed multi-agent systems (JoyAgents-R1 style).

Four request types, each with an exact answer and the scripted route that solves it:

    type        request (difficulty 1)   route   sub-agent steps                    answer
    "math"      "3+4"                    m       math: "7"                          "7"
    "lookup"    "k=3,b=2 b?"             q       QA: "2"                            "2"
    "call"      "do g 3 4"               f       call: "g(3,4)" -> tool -> "13"     "13"
    "two_step"  "k=3,b=2 b+4"            t       QA: "2", then math: "6"            "6"

The knowledge table of lookup / two-step requests is given in the request (``key=value`` pairs,
lower-case one-letter keys). Function calls are executed by a pure-JAX tool (``execute_call``,
jittable): ``f(a,b) = a*b``, ``g(a,b) = a*a+b``, ``h(a,b) = a*b+a+b``; a malformed call returns
``None``-like invalid results. Difficulty d in [1, 3] widens the operand range to [0, 5*d) and the
table to d+1 pairs.

Splits: a request belongs to the held-out split iff ``crc32(request) % heldout_mod == 0``, so the
train and held-out requests are disjoint strings (generation rejects requests of the other split).
The request type id is an observable category of the request (it keys the agents' shared memory).

Why our own: the paper's assistant benchmarks need real LLMs; this keeps their structure (routing,
QA over a table, structured tool calls, two-agent chains) at character level (the presets use
``models.tokenizer.CharTokenizer``), with exact checkers on token ids.

Token ids come from the tokenizer handed in. The system is character-level: every text (requests,
answers, sub-agent steps, calls, the tool's values) is *spelled* one token per character (``spell``,
``char_ids``, through ``Tokenizer.spell``: the id of each character is ``tokenizer.encode(ch)``, which must be
one token that decodes back to ``ch``). With our character-level tokenizers (``CharTokenizer``, the presets';
``ByteTokenizer``) that is their own encoding, ids unchanged; with a checkpoint tokenizer in which every
character of the task is one token (byte-level BPE: Qwen2/3, Llama 3, DeepSeek-V3) it is a valid id
sequence that decodes back to the text but not the canonical (merged) tokenization of it, so one token
per character also holds for the static widths. Any other tokenizer is refused with one ValueError
naming it and the first character that is not a single token. ``request_arrays(..., tokenizer)``
spells requests and answers; the jitted tool takes ``AssistantIds.from_tokenizer(tokenizer)`` (static
Python ints: a 10-entry digit table -- digits need not have consecutive ids, as in BPE vocabularies in
general --, the tool names, ``(``, ``,``, ``)``). In jit, text is read through those tables only: a
multi-character token a checkpoint model generates (e.g. a merged "13") is not a digit, so such an
answer or call does not parse (reward 0 / malformed call); the SFT warm start teaches the spelling.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.tasks.longcontext import exact_match
from jaxrl_reason.utils.validation import check_hyperparameters

TYPES = ("math", "lookup", "call", "two_step")
ROUTES = ("m", "q", "f", "t")  # the master's routing token for each type (same order)
TOOLS = ("f", "g", "h")
SPLITS = ("train", "heldout")
_KEYS = "abcdekmnpsuvwxyz"
#: every character the task's texts can hold (requests, answers, steps, calls): what ``spell`` must spell
TEXT_CHARS = "0123456789" + "".join(sorted(set(_KEYS + "do" + "".join(TOOLS)))) + " =,?+-*()"


def tool_value(name: str, a: int, b: int) -> int:
    """Host-side reference of the tools (the jnp version is ``execute_call``)."""
    return {"f": a * b, "g": a * a + b, "h": a * b + a + b}[name]


@dataclasses.dataclass(frozen=True)
class AssistantRequest:
    text: str
    answer: str
    kind: int  # index into TYPES
    route: str  # the correct routing token
    steps: tuple[str, ...]  # scripted sub-agent outputs, in order (1 or 2)
    results: tuple[str, ...]  # what each step returns to the system (tool result for calls)


@dataclasses.dataclass(frozen=True)
class AssistantTask:
    difficulty: int = 1
    weights: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0)  # sampling weight per request type
    heldout_mod: int = 4

    def __post_init__(self):
        check_hyperparameters(self)
        if self.difficulty < 1 or self.difficulty > 3:
            raise ValueError(f"AssistantTask: difficulty must be in [1, 3], got {self.difficulty}")
        if len(self.weights) != len(TYPES) or min(self.weights) < 0 or sum(self.weights) <= 0:
            raise ValueError(f"AssistantTask: weights must be {len(TYPES)} non-negative numbers with a positive sum, "
                             f"got {self.weights}")
        if self.heldout_mod < 2:
            raise ValueError(f"AssistantTask: heldout_mod must be >= 2, got {self.heldout_mod}")

    @property
    def operand_range(self) -> int:
        """Operands and table values are drawn from [0, 5 * difficulty)."""
        return 5 * self.difficulty

    @property
    def request_chars(self) -> int:
        """Longest request text (two-step at this difficulty)."""
        d = self.difficulty
        num = len(str(self.operand_range - 1))
        return max((d + 1) * (2 + num) + d + 3 + num, 5 + 2 * num)  # two-step (pairs, commas, ' k+b') or call

    @property
    def answer_chars(self) -> int:
        m = self.operand_range - 1
        return len(str(max(m * m + m, m * m + 2 * m)))

    @property
    def call_chars(self) -> int:
        return 4 + 2 * len(str(self.operand_range - 1))

    def split_of(self, text: str) -> str:
        return "heldout" if zlib.crc32(text.encode()) % self.heldout_mod == 0 else "train"

    def _draw(self, rng: np.random.Generator, kind: int) -> AssistantRequest:
        hi = self.operand_range
        a, b = int(rng.integers(0, hi)), int(rng.integers(0, hi))
        if kind == 0:
            if rng.random() < 0.5:
                return self._make(f"{a}+{b}", str(a + b), 0, (str(a + b),))
            a, b = max(a, b), min(a, b)
            return self._make(f"{a}-{b}", str(a - b), 0, (str(a - b),))
        if kind == 2:
            name = TOOLS[int(rng.integers(0, len(TOOLS)))]
            call, val = f"{name}({a},{b})", str(tool_value(name, a, b))
            return AssistantRequest(f"do {name} {a} {b}", val, 2, ROUTES[2], (call,), (val,))
        keys = rng.choice(list(_KEYS), size=self.difficulty + 1, replace=False)
        vals = [int(v) for v in rng.integers(0, hi, size=len(keys))]
        table = ",".join(f"{k}={v}" for k, v in zip(keys, vals))
        j = int(rng.integers(0, len(keys)))
        key, val = str(keys[j]), vals[j]
        if kind == 1:
            return self._make(f"{table} {key}?", str(val), 1, (str(val),))
        if rng.random() < 0.5:
            return self._make(f"{table} {key}+{b}", str(val + b), 3, (str(val), str(val + b)))
        return self._make(f"{table} {key}*{b}", str(val * b), 3, (str(val), str(val * b)))

    @staticmethod
    def _make(text, answer, kind, steps):
        return AssistantRequest(text, answer, kind, ROUTES[kind], steps, steps)

    def generate(self, rng: np.random.Generator, split: str = "train", kind: int | None = None) -> AssistantRequest:
        """One request of ``split`` (of type ``kind``, or drawn by ``weights``)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if kind is None:
            w = np.asarray(self.weights, np.float64)
            kind = int(rng.choice(len(TYPES), p=w / w.sum()))
        if not 0 <= kind < len(TYPES):
            raise ValueError(f"kind must be in [0, {len(TYPES)}), got {kind}")
        for _ in range(1000):
            r = self._draw(rng, kind)
            if self.split_of(r.text) == split:
                return r
        raise RuntimeError("could not draw a request of the requested split")  # unreachable in practice

    def generate_batch(self, rng: np.random.Generator, n: int, split: str = "train",
                       balanced: bool = False) -> list[AssistantRequest]:
        """``n`` requests; ``balanced``: types in turn (0, 1, 2, 3, 0, ...) instead of by weight."""
        return [self.generate(rng, split, i % len(TYPES) if balanced else None) for i in range(n)]

    def check(self, answer: str, request: AssistantRequest) -> bool:
        """Host-side exact checker; malformed or missing answers are simply wrong."""
        return isinstance(answer, str) and answer == request.answer


# ------------------------------------------------------------------------------------ jnp tools
def _name(tokenizer: Tokenizer) -> str:
    return f"{type(tokenizer).__name__} (vocab_size {tokenizer.vocab_size})"


def char_ids(tokenizer: Tokenizer, chars: str, owner: str) -> tuple[int, ...]:
    """The id of each character of ``chars`` (``Tokenizer.spell``: one token that decodes back to the
    character, not an unknown token); one ValueError naming ``owner``, the tokenizer and the first character
    that is not."""
    try:
        return tuple(tokenizer.spell(chars))
    except ValueError as e:
        raise ValueError(
            f"{owner}: {e}; the assistant system spells its text one token per character and needs its characters "
            "as single tokens (a character-level tokenizer such as CharTokenizer, or a byte-level BPE checkpoint "
            "tokenizer: Qwen2/3, Llama 3, DeepSeek-V3)") from None


def spell(tokenizer: Tokenizer, text: str) -> list[int]:
    """``text`` one token per character (``char_ids``): what the jitted system reads and writes. Our
    character-level tokenizers: exactly their ``encode``; a byte-level BPE: valid ids that decode back to
    ``text``, not its canonical (merged) tokenization."""
    return list(char_ids(tokenizer, text, "spell"))


class AssistantIds(NamedTuple):
    """The token ids of the jitted tool (static Python ints, hashable: usable inside jit as constants)."""

    pad: int
    digits: tuple[int, ...]  # ids of "0" .. "9" (a lookup table: no assumption that they are consecutive)
    tools: tuple[int, ...]  # TOOLS
    lpar: int
    comma: int
    rpar: int

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> "AssistantIds":
        """ValueError unless every character of the task (``TEXT_CHARS``) is one token of ``tokenizer`` and
        text spelled one token per character decodes back to itself."""
        return _assistant_ids(tokenizer)

    def spell(self, text: str) -> list[int]:
        """Ids of a call or a number as the jitted tool reads / writes it (one token per character)."""
        table = {**{str(d): i for d, i in enumerate(self.digits)}, **dict(zip(TOOLS, self.tools)),
                 "(": self.lpar, ",": self.comma, ")": self.rpar}
        return [table[c] for c in text]


@functools.lru_cache(maxsize=32)
def _assistant_ids(tokenizer: Tokenizer) -> AssistantIds:
    table = dict(zip(TEXT_CHARS, char_ids(tokenizer, TEXT_CHARS, "AssistantIds")))
    sample = TEXT_CHARS * 2
    got = tokenizer.decode(tokenizer.spell(sample))
    if got != sample:  # e.g. a SentencePiece vocabulary whose single characters carry a word-start marker
        raise ValueError(f"AssistantIds: {_name(tokenizer)} does not decode text spelled one token per character "
                         f"back to the text ({sample!r} -> {got!r})")
    return AssistantIds(pad=tokenizer.pad_id, digits=tuple(table[c] for c in "0123456789"),
                        tools=tuple(table[t] for t in TOOLS), lpar=table["("], comma=table[","], rpar=table[")"])


def _digit_of(tokens: jax.Array, digits: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """Token ids [...] -> (digit value [...] (0 where not a digit), is a digit [...]), by the digit table."""
    hit = tokens[..., None] == jnp.asarray(digits, jnp.int32)
    return jnp.argmax(hit, axis=-1).astype(jnp.int32), jnp.any(hit, axis=-1)


def _digits_value(tokens, lens, start, stop, digits: tuple[int, ...]):
    """Integer spelled by tokens[start:stop] per row -> (value [B], ok [B]: 1-3 digits, all digits)."""
    n = tokens.shape[1]
    pos = jnp.arange(n)[None]
    inside = (pos >= start[:, None]) & (pos < stop[:, None]) & (pos < lens[:, None])
    d, is_digit = _digit_of(tokens, digits)
    width = stop - start
    ok = (width >= 1) & (width <= 3) & jnp.all(~inside | is_digit, axis=1)
    power = jnp.where(inside, 10 ** jnp.clip(stop[:, None] - 1 - pos, 0, 3), 0)
    return jnp.sum(jnp.where(inside, d, 0) * power, axis=1), ok


def execute_call(tokens: jax.Array, lens: jax.Array, ids: AssistantIds) -> tuple[jax.Array, jax.Array]:
    """The pure-JAX tool: call text ``name(a,b)`` tokens [B, N], lens [B] -> (value [B] int32, valid [B]).

    Valid iff the text is exactly a tool name, '(', 1-3 digits, ',', 1-3 digits, ')' (``ids``: their
    token ids, ``AssistantIds.from_tokenizer``). Jittable."""
    n = tokens.shape[1]
    pos = jnp.arange(n)[None]
    valid_pos = pos < lens[:, None]
    first = lambda t: jnp.where(jnp.any((tokens == t) & valid_pos, 1), jnp.argmax((tokens == t) & valid_pos, 1), -1)
    count = lambda t: jnp.sum((tokens == t) & valid_pos, axis=1)
    name = tokens[:, 0]
    tool_ids = jnp.asarray(ids.tools, jnp.int32)
    comma, rpar = first(ids.comma), first(ids.rpar)
    a, ok_a = _digits_value(tokens, lens, jnp.full_like(lens, 2), comma, ids.digits)
    b, ok_b = _digits_value(tokens, lens, comma + 1, rpar, ids.digits)
    structure = ((tokens[:, 1] == ids.lpar) & (lens >= 6) & (count(ids.lpar) == 1) & (count(ids.comma) == 1)
                 & (count(ids.rpar) == 1) & (rpar == lens - 1) & jnp.any(name[:, None] == tool_ids[None], axis=1))
    which = jnp.argmax(name[:, None] == tool_ids[None], axis=1)
    value = jnp.stack([a * b, a * a + b, a * b + a + b], axis=1)
    value = jnp.take_along_axis(value, which[:, None], axis=1)[:, 0]
    return value.astype(jnp.int32), structure & ok_a & ok_b


def encode_int(value: jax.Array, width: int, ids: AssistantIds) -> tuple[jax.Array, jax.Array]:
    """Non-negative ints [B] -> decimal digit tokens [B, width] (right-padded with ``ids.pad``), lens [B];
    values with more than ``width`` digits are clipped to the largest ``width``-digit number. Jittable."""
    value = jnp.clip(value, 0, 10**width - 1)
    ndig = 1 + sum((value >= 10**k).astype(jnp.int32) for k in range(1, width))
    pos = jnp.arange(width)[None]
    power = 10 ** jnp.clip(ndig[:, None] - 1 - pos, 0, width - 1)
    digit = (value[:, None] // power) % 10
    digit_ids = jnp.asarray(ids.digits, jnp.int32)[digit]
    return jnp.where(pos < ndig[:, None], digit_ids, ids.pad).astype(jnp.int32), ndig.astype(jnp.int32)


# ------------------------------------------------------------------------------------ batches
def request_arrays(requests, request_tokens: int, answer_tokens: int, tokenizer: Tokenizer) -> dict[str, np.ndarray]:
    """Requests -> {"text" [B, R], "text_lens", "answer" [B, A], "answer_lens", "kind" [B]} (numpy; texts
    spelled one token per character of ``tokenizer`` (``spell``), right-padded with its pad id; too long raises)."""
    if not requests:
        raise ValueError("request_arrays: no requests")
    text, tl = tokenizer.pad_batch([spell(tokenizer, r.text) for r in requests], request_tokens)
    ans, al = tokenizer.pad_batch([spell(tokenizer, r.answer) for r in requests], answer_tokens)
    return {"text": text, "text_lens": tl, "answer": ans, "answer_lens": al,
            "kind": np.asarray([r.kind for r in requests], np.int32)}


def check_answers(pred, pred_lens, answer, answer_lens) -> jax.Array:
    """Exact checker on token ids (jittable): pred [B, A] (right-padded) -> reward [B] float32 in {0, 1}."""
    return exact_match(pred, pred_lens, answer, answer_lens)


__all__ = ["AssistantIds", "AssistantRequest", "AssistantTask", "ROUTES", "SPLITS", "TEXT_CHARS", "TOOLS", "TYPES",
           "char_ids", "check_answers", "encode_int", "execute_call", "request_arrays", "spell", "tool_value"]
