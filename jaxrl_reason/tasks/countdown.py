"""Countdown: reach a target with the given numbers (each used exactly once) and + - *.

Problem ``count 3 5 7 to 22`` ; one valid answer ``3*5+7``. Many answers are valid, so the reward
is the host-side verifier ``check`` (a tiny recursive-descent parser over digits, + - * and
parentheses that never raises), not an exact string match. Difficulty = how many numbers (2..4).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from fractions import Fraction

import numpy as np

from jaxrl_reason.tasks.base import Problem
from jaxrl_reason.utils.validation import check_hyperparameters

MAX_ANSWER_CHARS = 64  # longer answers are malformed; bounds the parser's recursion (<= 32 nested parentheses)
MAX_NUMBER_DIGITS = 6
_DIGITS = frozenset("0123456789")  # ASCII only: str.isdigit() also accepts '²' or '١', which int() rejects or reads
_PROMPT = re.compile(r"count ((?:[0-9]{1,6} )*[0-9]{1,6}) to (-?[0-9]{1,60})")


def evaluate_expression(text) -> tuple[Fraction, list[int]] | None:
    """Evaluate ``text`` (integers, + - *, parentheses) -> (value, numbers used); None if malformed.

    Never raises: anything but a ``str`` of at most ``MAX_ANSWER_CHARS`` characters over ASCII digits
    (numbers of at most ``MAX_NUMBER_DIGITS``), ``+ - *`` and parentheses is malformed.
    """
    if not isinstance(text, str) or len(text) > MAX_ANSWER_CHARS:
        return None
    pos = 0
    nums: list[int] = []

    def peek():
        return text[pos] if pos < len(text) else ""

    def atom():
        nonlocal pos
        if peek() == "(":
            pos += 1
            v = expr()
            if v is None or peek() != ")":
                return None
            pos += 1
            return v
        start = pos
        while peek() in _DIGITS:
            pos += 1
        if start == pos or pos - start > MAX_NUMBER_DIGITS:
            return None
        nums.append(int(text[start:pos]))
        return Fraction(nums[-1])

    def term():
        nonlocal pos
        v = atom()
        while v is not None and peek() == "*":
            pos += 1
            w = atom()
            v = None if w is None else v * w
        return v

    def expr():
        nonlocal pos
        v = term()
        while v is not None and peek() in ("+", "-"):
            op = peek()
            pos += 1
            w = term()
            v = None if w is None else (v + w if op == "+" else v - w)
        return v

    try:
        v = expr()
    except RecursionError:  # only when called from an already deep stack
        return None
    return (v, nums) if v is not None and pos == len(text) else None


def parse_prompt(prompt: str) -> tuple[list[int], int] | None:
    """``count 3 5 7 to 22`` -> ([3, 5, 7], 22); None if ``prompt`` is not a countdown prompt."""
    m = _PROMPT.fullmatch(prompt) if isinstance(prompt, str) else None
    return None if m is None else ([int(x) for x in m.group(1).split()], int(m.group(2)))


@dataclasses.dataclass(frozen=True)
class Countdown:
    min_difficulty: int = 2
    max_difficulty: int = 4
    max_number: int = 9
    name: str = "count"
    exact_match: bool = False

    def __post_init__(self):
        check_hyperparameters(self)
        if not 2 <= self.min_difficulty <= self.max_difficulty:
            raise ValueError(f"Countdown: need 2 <= min_difficulty <= max_difficulty, got "
                             f"{self.min_difficulty}, {self.max_difficulty}")

    def generate(self, rng: np.random.Generator, difficulty: int | None = None) -> Problem:
        k = int(rng.integers(self.min_difficulty, self.max_difficulty + 1)) if difficulty is None else difficulty
        nums = [int(x) for x in rng.integers(1, self.max_number + 1, size=k)]
        expr, value, trace = str(nums[0]), Fraction(nums[0]), []
        for n in nums[1:]:
            op = "+-*"[int(rng.integers(3))]
            new = value + n if op == "+" else value - n if op == "-" else value * n
            trace.append(f"{value}{op}{n}={new}")
            expr = f"({expr}){op}{n}" if op == "*" and ("+" in expr or "-" in expr) else f"{expr}{op}{n}"
            value = new
        shown = sorted(nums)
        return Problem(prompt=f"count {' '.join(map(str, shown))} to {value}", answer=expr, wrong=f"{'+'.join(map(str, nums))}+1",
                       trace=",".join(trace), difficulty=k, task=self.name)

    def check(self, answer: str, problem: Problem) -> bool:
        """True iff ``answer`` uses the prompt's numbers exactly once each and reaches its target; never
        raises (a malformed answer, or a prompt that is not a countdown prompt, is simply False)."""
        out, prompt = evaluate_expression(answer), parse_prompt(getattr(problem, "prompt", None))
        if out is None or prompt is None:
            return False
        (value, used), (numbers, target) = out, prompt
        return value == target and Counter(used) == Counter(numbers)
