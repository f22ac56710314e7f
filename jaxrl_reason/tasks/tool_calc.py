"""A tool-use task on the text-environment protocol (``envs.text``): arithmetic the model answers with a calculator.

    tok = tool_tokenizer()                         # bytes + <calc> </calc> <result> </result> as control tokens
    env = CalcEnv(tok, tool=True)                   # a HostTextEnv: its steps run on host threads
    problems = ToolCalcTask().problems(np.random.default_rng(0), 512)

An episode: the prompt ``<bos>calc: 47*83+12=`` (``mind:`` when the tool is off); the model may call the tool,
``<calc>47*83+12</calc>`` (the turn stops at ``</calc>``), and gets ``<result>3913</result>`` as the next
observation (context, not trained on); a turn without a call is the answer, ``<answer>3913</answer><eos>``
(reward 1 if it is the problem's answer, else 0) and ends the episode. Expressions are evaluated by
``safe_eval`` (``ast`` with a whitelist: numbers, + - * / // % **, parentheses, unary signs; bounded length,
depth, exponent and magnitude; never ``eval``). Counted per episode (``CalcEpisode``, summed by ``calc_metrics``):
tool calls, malformed calls (not an expression: ``<result>error</result>``), oversized ones (the input, a value or
the result too large: ``<result>too long</result>``), calls with the tool off (``<result>none</result>``), episodes
that hit the turn limit still calling (endless calls: reward 0), and answers with no ``<answer>`` tag.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from fractions import Fraction
from typing import Sequence

import numpy as np

from jaxrl_reason.envs.text import HostTextEnv
from jaxrl_reason.models.tokenizer import ByteTokenizer
from jaxrl_reason.utils.validation import check_hyperparameters

TOOL_TAGS = ("<calc>", "</calc>", "<result>", "</result>")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: Fraction(a // b), ast.Mod: lambda a, b: a % b}


class CalcError(ValueError):
    """A call ``safe_eval`` refuses; ``kind``: "malformed" (not an allowed expression) or "oversized"."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclasses.dataclass(frozen=True)
class CalcLimits:
    max_chars: int = 64  # the expression's length
    max_nodes: int = 64  # its AST nodes (nesting included)
    max_exponent: int = 64  # |exponent| of **
    max_abs: int = 10**15  # every intermediate value's magnitude (numerator and denominator)

    def __post_init__(self):
        check_hyperparameters(self)


def safe_eval(expr: str, limits: CalcLimits = CalcLimits()) -> Fraction:
    """The exact value of an arithmetic expression, or CalcError. Only numbers (int or decimal literals),
    + - * / // % ** and unary +/-, parenthesised; names, calls, attributes, subscripts, comparisons... are
    refused. Never evaluates text as Python: the AST is walked node by node."""
    if not isinstance(expr, str):
        raise CalcError("malformed", f"expression must be text, got {type(expr).__name__}")
    if len(expr) > limits.max_chars:
        raise CalcError("oversized", f"expression of {len(expr)} characters > {limits.max_chars}")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise CalcError("malformed", f"not an expression: {type(err).__name__}") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > limits.max_nodes:
        raise CalcError("oversized", f"expression of {nodes} nodes > {limits.max_nodes}")

    def bounded(v: Fraction) -> Fraction:
        if abs(v.numerator) > limits.max_abs or v.denominator > limits.max_abs:
            raise CalcError("oversized", f"a value exceeds {limits.max_abs:.0e}")
        return v

    def value(node) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return bounded(Fraction(str(node.value)))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = value(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            base, exp = value(node.left), value(node.right)
            if exp.denominator != 1 or abs(exp) > limits.max_exponent:
                raise CalcError("oversized" if exp.denominator == 1 else "malformed",
                                f"exponent must be an integer of at most {limits.max_exponent} in size")
            if base == 0 and exp < 0:
                raise CalcError("malformed", "zero to a negative power")
            digits = abs(int(exp)) * math.log10(max(abs(base.numerator), base.denominator, 1))
            if digits > math.log10(limits.max_abs):  # decided before the power is computed
                raise CalcError("oversized", f"a power exceeds {limits.max_abs:.0e}")
            return bounded(base ** int(exp))
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = value(node.left), value(node.right)
            if b == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
                raise CalcError("malformed", "division by zero")
            return bounded(_OPS[type(node.op)](a, b))
        raise CalcError("malformed", f"{type(node).__name__} is not allowed")

    return value(tree.body)


def format_value(v: Fraction) -> str:
    """An integer as itself, else a decimal with at most 6 places (trailing zeros dropped)."""
    if v.denominator == 1:
        return str(v.numerator)
    return f"{float(v):.6f}".rstrip("0").rstrip(".")


# ---------------------------------------------------------------------------------------- problems
FORMS = ("{a}*{b}", "{a}*{b}+{c}", "{a}*{b}-{c}", "({a}+{b})*{c}")


@dataclasses.dataclass(frozen=True)
class CalcProblem:
    expr: str
    answer: str


@dataclasses.dataclass(frozen=True)
class ToolCalcTask:
    """Two-digit products with an extra term (``FORMS``): out of a small model's head, one call with the tool."""

    low: int = 10
    high: int = 99
    forms: tuple[str, ...] = FORMS

    def __post_init__(self):
        check_hyperparameters(self)
        if not 0 <= self.low <= self.high or not self.forms:
            raise ValueError(f"ToolCalcTask: need 0 <= low <= high and a form, got {self.low}, {self.high}, {self.forms}")

    def generate(self, rng: np.random.Generator) -> CalcProblem:
        a, b, c = (int(x) for x in rng.integers(self.low, self.high + 1, 3))
        expr = self.forms[int(rng.integers(len(self.forms)))].format(a=a, b=b, c=c)
        return CalcProblem(expr, format_value(safe_eval(expr)))

    def problems(self, rng: np.random.Generator, n: int, exclude: frozenset = frozenset()) -> list[CalcProblem]:
        """``n`` problems whose expression is not in ``exclude`` (held-out problems stay out of training)."""
        out = []
        while len(out) < n:
            p = self.generate(rng)
            if p.expr not in exclude:
                out.append(p)
        return out


def tool_tokenizer() -> ByteTokenizer:
    """Bytes plus the R1 tags and the tool's tags (``TOOL_TAGS``) as control tokens."""
    return ByteTokenizer(extra_special=TOOL_TAGS)


# ---------------------------------------------------------------------------------------- the environment
@dataclasses.dataclass
class CalcEpisode:
    problem: CalcProblem
    turn: int = 0
    calls: int = 0
    malformed: int = 0
    oversized: int = 0
    disabled_calls: int = 0
    turn_limit: bool = False
    answered: bool = False
    correct: bool = False


class CalcEnv(HostTextEnv):
    """The calculator episode (module docstring) as a ``HostTextEnv``; rows are ``CalcProblem``s.
    ``tool=False``: the same episode with the tool off (``mind:`` prompt, calls answered ``none``): equal budgets."""

    def __init__(self, tokenizer, tool: bool = True, max_turns: int = 3, prompt_tokens: int = 24,
                 result_chars: int = 10, limits: CalcLimits = CalcLimits()):
        if max_turns < 1 or prompt_tokens < 1 or result_chars < 8:
            raise ValueError(f"CalcEnv: need max_turns >= 1, prompt_tokens >= 1, result_chars >= 8 (the longest "
                             f"message), got {max_turns}, {prompt_tokens}, {result_chars}")
        self.tok, self.tool, self.limits, self.result_chars = tokenizer, tool, limits, result_chars
        self.max_turns, self.prompt_tokens, self.obs_tokens = max_turns, prompt_tokens, result_chars + 2

    def prompt_text(self, p: CalcProblem) -> str:
        return f"{'calc' if self.tool else 'mind'}: {p.expr}="

    def prompt(self, p: CalcProblem) -> list[int]:
        return [self.tok.bos_id] + self.tok.encode(self.prompt_text(p))

    def result(self, text: str) -> list[int]:
        return self.tok.encode(f"<result>{text}</result>", allow_special=True)

    def reset(self, row: CalcProblem):
        return CalcEpisode(row), self.prompt(row)

    def call(self, ep: CalcEpisode, expr: str) -> str:
        """The tool's reply to one call (counted on ``ep``)."""
        ep.calls += 1
        if not self.tool:
            ep.disabled_calls += 1
            return "none"
        try:
            out = format_value(safe_eval(expr, self.limits))
        except CalcError as err:
            setattr(ep, err.kind, getattr(ep, err.kind) + 1)
            return "error" if err.kind == "malformed" else "too long"
        if len(out) > self.result_chars:
            ep.oversized += 1
            return "too long"
        return out

    def step(self, ep: CalcEpisode, turn: list[int]):
        text = self.tok.decode(turn)
        ep.turn += 1
        if "</calc>" in text:
            head = text[: text.rindex("</calc>")]
            reply = self.call(ep, head[head.rindex("<calc>") + len("<calc>"):]) if "<calc>" in head else None
            if reply is None:
                ep.calls, ep.malformed = ep.calls + 1, ep.malformed + 1
                reply = "error"
            if ep.turn >= self.max_turns:  # still calling at the last turn: endless calls
                ep.turn_limit = True
                return ep, [], 0.0, True
            return ep, self.result(reply), 0.0, False
        found = _ANSWER.findall(text)
        ep.answered = bool(found)
        ep.correct = bool(found) and found[-1].strip() == ep.problem.answer
        return ep, [], float(ep.correct), True

    # SFT traces: what a model that uses the tool well writes
    def oracle(self, p: CalcProblem, call: bool | None = None) -> list[tuple[list[int], bool]]:
        """The episode's segments (ids, written by the model?): prompt, [call, result,] answer + eos. ``call``
        (default: whether the tool is on): the trace calls the tool; without, it answers at once."""
        enc = lambda s: self.tok.encode(s, allow_special=True)
        answer = (enc(f"<answer>{p.answer}</answer>") + [self.tok.eos_id], True)
        if not (self.tool if call is None else call):
            return [(self.prompt(p), False), answer]
        return [(self.prompt(p), False), (enc(f"<calc>{p.expr}</calc>"), True), (self.result(p.answer), False),
                answer]


def segment_rows(episodes: Sequence[Sequence[tuple[list[int], bool]]], seq_len: int, pad_id: int) -> dict:
    """Episodes as segments -> {"tokens" [E, seq_len], "loss_mask" [E, seq_len - 1]}: loss where the target token
    is the model's (``models.lm.sft.fit``'s data; prompts and tool results are context)."""
    tokens = np.full((len(episodes), seq_len), pad_id, np.int32)
    mask = np.zeros((len(episodes), seq_len), np.float32)
    for i, segs in enumerate(episodes):
        ids = [t for s, _ in segs for t in s]
        if len(ids) > seq_len:
            raise ValueError(f"segment_rows: an episode of {len(ids)} tokens > seq_len {seq_len}")
        tokens[i, : len(ids)] = ids
        mask[i, : len(ids)] = [float(m) for s, m in segs for _ in s]
    return {"tokens": tokens, "loss_mask": mask[:, 1:]}


COUNTS = ("calls", "malformed", "oversized", "disabled_calls")


def calc_metrics(episodes: Sequence[CalcEpisode]) -> dict[str, float]:
    """Per episode means: accuracy, the counts (``COUNTS``), turn_limit (endless calls), no_answer, and their SE."""
    n = len(episodes)
    if not n:
        raise ValueError("calc_metrics: no episodes")
    out = {"n": n}
    rates = {"accuracy": [e.correct for e in episodes], "turn_limit": [e.turn_limit for e in episodes],
             "no_answer": [not e.answered and not e.turn_limit for e in episodes],
             **{k: [getattr(e, k) for e in episodes] for k in COUNTS}}
    for k, v in rates.items():
        v = np.asarray(v, np.float64)
        out[k], out[f"{k}_se"] = float(v.mean()), float(v.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0
    return out


__all__ = ["COUNTS", "CalcEnv", "CalcEpisode", "CalcError", "CalcLimits", "CalcProblem", "FORMS", "TOOL_TAGS",
           "ToolCalcTask", "calc_metrics", "format_value", "safe_eval", "segment_rows", "tool_tokenizer"]
