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
QA over a table, structured tool calls, two-agent chains) on the character vocabulary, with exact
checkers on token ids.
"""

from __future__ import annotations

import dataclasses
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.tasks.longcontext import encode_plain, exact_match
from jaxrl_reason.tasks.vocab import VOCAB
from jaxrl_reason.utils.validation import check_hyperparameters

TYPES = ("math", "lookup", "call", "two_step")
ROUTES = ("m", "q", "f", "t")  # the master's routing token for each type (same order)
TOOLS = ("f", "g", "h")
SPLITS = ("train", "heldout")
_KEYS = "abcdekmnpsuvwxyz"


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
_DIGIT0 = VOCAB.encode("0")[0]
_TOOL_IDS = jnp.asarray([VOCAB.encode(t)[0] for t in TOOLS], jnp.int32)
_LPAR, _COMMA, _RPAR = (VOCAB.encode(c)[0] for c in "(,)")


def _digits_value(tokens, lens, start, stop):
    """Integer spelled by tokens[start:stop] per row -> (value [B], ok [B]: 1-3 digits, all digits)."""
    n = tokens.shape[1]
    pos = jnp.arange(n)[None]
    inside = (pos >= start[:, None]) & (pos < stop[:, None]) & (pos < lens[:, None])
    d = tokens - _DIGIT0
    is_digit = (d >= 0) & (d <= 9)
    width = stop - start
    ok = (width >= 1) & (width <= 3) & jnp.all(~inside | is_digit, axis=1)
    power = jnp.where(inside, 10 ** jnp.clip(stop[:, None] - 1 - pos, 0, 3), 0)
    return jnp.sum(jnp.where(inside, d, 0) * power, axis=1), ok


def execute_call(tokens: jax.Array, lens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The pure-JAX tool: call text ``name(a,b)`` tokens [B, N], lens [B] -> (value [B] int32, valid [B]).

    Valid iff the text is exactly a tool name, '(', 1-3 digits, ',', 1-3 digits, ')'. Jittable."""
    n = tokens.shape[1]
    pos = jnp.arange(n)[None]
    valid_pos = pos < lens[:, None]
    first = lambda t: jnp.where(jnp.any((tokens == t) & valid_pos, 1), jnp.argmax((tokens == t) & valid_pos, 1), -1)
    count = lambda t: jnp.sum((tokens == t) & valid_pos, axis=1)
    name = tokens[:, 0]
    comma, rpar = first(_COMMA), first(_RPAR)
    a, ok_a = _digits_value(tokens, lens, jnp.full_like(lens, 2), comma)
    b, ok_b = _digits_value(tokens, lens, comma + 1, rpar)
    structure = ((tokens[:, 1] == _LPAR) & (lens >= 6) & (count(_LPAR) == 1) & (count(_COMMA) == 1)
                 & (count(_RPAR) == 1) & (rpar == lens - 1) & jnp.any(name[:, None] == _TOOL_IDS[None], axis=1))
    which = jnp.argmax(name[:, None] == _TOOL_IDS[None], axis=1)
    value = jnp.stack([a * b, a * a + b, a * b + a + b], axis=1)
    value = jnp.take_along_axis(value, which[:, None], axis=1)[:, 0]
    return value.astype(jnp.int32), structure & ok_a & ok_b


def encode_int(value: jax.Array, width: int) -> tuple[jax.Array, jax.Array]:
    """Non-negative ints [B] -> decimal digit tokens [B, width] (right-padded), lens [B]; values with more
    than ``width`` digits are clipped to the largest ``width``-digit number. Jittable."""
    value = jnp.clip(value, 0, 10**width - 1)
    ndig = 1 + sum((value >= 10**k).astype(jnp.int32) for k in range(1, width))
    pos = jnp.arange(width)[None]
    power = 10 ** jnp.clip(ndig[:, None] - 1 - pos, 0, width - 1)
    digit = (value[:, None] // power) % 10
    return jnp.where(pos < ndig[:, None], digit + _DIGIT0, VOCAB.pad).astype(jnp.int32), ndig.astype(jnp.int32)


# ------------------------------------------------------------------------------------ batches
def request_arrays(requests, request_tokens: int, answer_tokens: int) -> dict[str, np.ndarray]:
    """Requests -> {"text" [B, R], "text_lens", "answer" [B, A], "answer_lens", "kind" [B]} (numpy)."""
    if not requests:
        raise ValueError("request_arrays: no requests")
    text, tl = encode_plain([r.text for r in requests], request_tokens)
    ans, al = encode_plain([r.answer for r in requests], answer_tokens)
    return {"text": text, "text_lens": tl, "answer": ans, "answer_lens": al,
            "kind": np.asarray([r.kind for r in requests], np.int32)}


def check_answers(pred, pred_lens, answer, answer_lens) -> jax.Array:
    """Exact checker on token ids (jittable): pred [B, A] (right-padded) -> reward [B] float32 in {0, 1}."""
    return exact_match(pred, pred_lens, answer, answer_lens)


__all__ = ["AssistantRequest", "AssistantTask", "ROUTES", "SPLITS", "TOOLS", "TYPES", "check_answers", "encode_int",
           "execute_call", "request_arrays", "tool_value"]
