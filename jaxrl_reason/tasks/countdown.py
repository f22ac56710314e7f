"""Countdown: reach a target with the given numbers (each used exactly once) and + - *.

Problem ``count 3 5 7 to 22`` ; one valid answer ``3*5+7``. Many answers are valid, so the reward
is the host-side verifier ``check`` (a tiny recursive-descent parser over digits, + - * and
parentheses that never raises), not an exact string match. Difficulty = how many numbers (2..4).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from fractions import Fraction

import numpy as np

from jaxrl_reason.tasks.base import Problem


def evaluate_expression(text: str) -> tuple[Fraction, list[int]] | None:
    """Evaluate ``text`` (integers, + - *, parentheses) -> (value, numbers used); None if malformed."""
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
        while peek().isdigit():
            pos += 1
        if start == pos or pos - start > 6:
            return None
        nums.append(int(text[start:pos]))
        return Fraction(int(text[start:pos]))

    def term():
        nonlocal pos
        v = atom()
        while v is not None and peek() == "*":
            pos += 1
            w = atom()
            v = None if w is None else v * w
        return v

    def expr(depth=[0]):
        nonlocal pos
        v = term()
        while v is not None and peek() in ("+", "-"):
            op = peek()
            pos += 1
            w = term()
            v = None if w is None else (v + w if op == "+" else v - w)
        return v

    if len(text) > 64:
        return None
    try:
        v = expr()
    except RecursionError:
        return None
    return (v, nums) if v is not None and pos == len(text) else None


@dataclasses.dataclass(frozen=True)
class Countdown:
    min_difficulty: int = 2
    max_difficulty: int = 4
    max_number: int = 9
    name: str = "count"
    exact_match: bool = False

    def __post_init__(self):
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
        out = evaluate_expression(answer)
        if out is None:
            return False
        value, used = out
        head, target = problem.prompt[len("count "):].split(" to ")
        return value == Fraction(int(target)) and Counter(used) == Counter(int(x) for x in head.split())
