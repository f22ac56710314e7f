"""Sorting and parity: short algorithmic tasks with exact answers (difficulty = list length).

``sort 4 1 3`` -> ``134`` (trace: the sorted digits one by one);
``parity 1 0 1 1`` -> ``1`` (trace: the running parity).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_reason.tasks.base import Problem
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Sorting:
    min_difficulty: int = 2
    max_difficulty: int = 5
    name: str = "sort"
    exact_match: bool = True

    def __post_init__(self):
        check_hyperparameters(self)
        if not 1 <= self.min_difficulty <= self.max_difficulty:
            raise ValueError("Sorting: need 1 <= min_difficulty <= max_difficulty")

    def generate(self, rng: np.random.Generator, difficulty: int | None = None) -> Problem:
        k = int(rng.integers(self.min_difficulty, self.max_difficulty + 1)) if difficulty is None else difficulty
        xs = [int(x) for x in rng.integers(0, 10, size=k)]
        ans = "".join(map(str, sorted(xs)))
        wrong = "".join(map(str, sorted(xs, reverse=True)))
        wrong = wrong if wrong != ans else ans + "0"
        return Problem(prompt="sort " + " ".join(map(str, xs)), answer=ans, wrong=wrong,
                       trace=",".join(ans), difficulty=k, task=self.name)

    def check(self, answer: str, problem: Problem) -> bool:
        return answer == problem.answer


@dataclasses.dataclass(frozen=True)
class Parity:
    min_difficulty: int = 2
    max_difficulty: int = 8
    name: str = "parity"
    exact_match: bool = True

    def __post_init__(self):
        check_hyperparameters(self)
        if not 1 <= self.min_difficulty <= self.max_difficulty:
            raise ValueError("Parity: need 1 <= min_difficulty <= max_difficulty")

    def generate(self, rng: np.random.Generator, difficulty: int | None = None) -> Problem:
        k = int(rng.integers(self.min_difficulty, self.max_difficulty + 1)) if difficulty is None else difficulty
        bits = [int(x) for x in rng.integers(0, 2, size=k)]
        running = np.cumsum(bits) % 2
        ans = str(int(running[-1]))
        return Problem(prompt="parity " + " ".join(map(str, bits)), answer=ans, wrong=str(1 - int(ans)),
                       trace="".join(map(str, running)), difficulty=k, task=self.name)

    def check(self, answer: str, problem: Problem) -> bool:
        return answer == problem.answer
