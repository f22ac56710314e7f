"""RandomCalculation ("Reasoning or Memorization?", arXiv 2507.10532): fresh arithmetic expressions
with 1..N computation steps over + - * /, exact rational answers. Clean by construction: every
problem is drawn fresh from the seed, so no pre-training corpus can contain the test split.

Problem text ``calc (3+4)*2`` (``template``, e.g. ``"What is {expr}?"`` for an instruction-tuned model); trace ``3+4=7,7*2=14`` ; answer ``14``. Rationals are written in
lowest terms ``-7/2``; integers without a denominator. Difficulty = number of steps.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np

from jaxrl_reason.tasks.base import Problem
from jaxrl_reason.utils.validation import check_hyperparameters


def fmt(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


def _apply(a: Fraction, op: str, b: Fraction) -> Fraction:
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[op]


@dataclasses.dataclass(frozen=True)
class RandomCalculation:
    min_difficulty: int = 1  # steps
    max_difficulty: int = 3
    max_operand: int = 9
    ops: str = "+-*/"
    name: str = "calc"
    exact_match: bool = True
    template: str = "calc {expr}"  # the problem text; e.g. "What is {expr}? Reply with just the number."

    def __post_init__(self):
        check_hyperparameters(self)
        if not 1 <= self.min_difficulty <= self.max_difficulty:
            raise ValueError(f"RandomCalculation: need 1 <= min_difficulty <= max_difficulty, got "
                             f"{self.min_difficulty}, {self.max_difficulty}")
        if self.max_operand < 1 or not self.ops or set(self.ops) - set("+-*/"):
            raise ValueError(f"RandomCalculation: max_operand >= 1 and ops a non-empty subset of '+-*/', "
                             f"got {self.max_operand}, {self.ops!r}")
        if "{expr}" not in self.template:
            raise ValueError(f"RandomCalculation: template must contain '{{expr}}', got {self.template!r}")

    def generate(self, rng: np.random.Generator, difficulty: int | None = None) -> Problem:
        steps = int(rng.integers(self.min_difficulty, self.max_difficulty + 1)) if difficulty is None else difficulty
        value = Fraction(int(rng.integers(0, self.max_operand + 1)))
        expr, trace = fmt(value), []
        for s in range(steps):
            op = self.ops[int(rng.integers(len(self.ops)))]
            n = Fraction(int(rng.integers(1 if op == "/" else 0, self.max_operand + 1)))
            left = bool(rng.integers(2)) or (op == "/" and value == 0)  # the running value on the left
            a, b = (value, n) if left else (n, value)
            e = expr if s == 0 else f"({expr})"
            expr = f"{e}{op}{fmt(n)}" if left else f"{fmt(n)}{op}{e}"
            value = _apply(a, op, b)
            trace.append(f"{fmt(a)}{op}{fmt(b)}={fmt(value)}")
        return Problem(prompt=self.template.replace("{expr}", expr), answer=fmt(value), wrong=fmt(value + 1), trace=",".join(trace),
                       difficulty=steps, task=self.name)

    def check(self, answer: str, problem: Problem) -> bool:
        return answer == problem.answer
