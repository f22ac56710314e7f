"""Ordering logic puzzles: shuffled pairwise facts about a hidden total order, ask for an extreme.

``order C>A,B>C max`` -> ``B`` (trace: the reconstructed chain ``B>C>A``).
Difficulty = number of people (2..6); only adjacent pairs of the hidden order are given.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_reason.tasks.base import Problem
from jaxrl_reason.utils.validation import check_hyperparameters

NAMES = "ABCDEF"


@dataclasses.dataclass(frozen=True)
class OrderingPuzzle:
    min_difficulty: int = 3
    max_difficulty: int = 5
    name: str = "order"
    exact_match: bool = True

    def __post_init__(self):
        check_hyperparameters(self)
        if not 2 <= self.min_difficulty <= self.max_difficulty <= len(NAMES):
            raise ValueError(f"OrderingPuzzle: need 2 <= min_difficulty <= max_difficulty <= {len(NAMES)}")

    def generate(self, rng: np.random.Generator, difficulty: int | None = None) -> Problem:
        k = int(rng.integers(self.min_difficulty, self.max_difficulty + 1)) if difficulty is None else difficulty
        order = [NAMES[i] for i in rng.permutation(k)]  # order[0] is the largest
        facts = [f"{order[i]}>{order[i + 1]}" for i in range(k - 1)]
        facts = [facts[i] for i in rng.permutation(len(facts))]
        ask_max = bool(rng.integers(2))
        ans = order[0] if ask_max else order[-1]
        wrong = order[-1] if ask_max else order[0]
        return Problem(prompt=f"order {','.join(facts)} {'max' if ask_max else 'min'}", answer=ans, wrong=wrong,
                       trace=">".join(order), difficulty=k, task=self.name)

    def check(self, answer: str, problem: Problem) -> bool:
        return answer == problem.answer
