"""A seeded random held-out split of a dataset's rows.

    train, held = heldout_split(rows, n=None, seed=0, source="train.jsonl")   # n=None: 10% of the rows, at most 512

The held-out rows are a seeded random sample (``default_rng([seed, *SPLIT_STREAM])``), in the file's order, and
the training rows the rest in the file's order: the same file and seed always give the same split.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxrl_reason.data.loading import DataError

#: the split's seed stream (3-element seeds: never the trainer's [seed, step] nor the task-row streams)
SPLIT_STREAM = (2**31 - 1, 19)
AUTO_FRACTION, AUTO_MAX = 0.1, 512


def heldout_size(n_rows: int, n: int | None) -> int:
    """``n``, or (None) 10% of ``n_rows``, at least 1 and at most 512."""
    return max(1, min(AUTO_MAX, int(AUTO_FRACTION * n_rows))) if n is None else n


def heldout_split(rows: Sequence, n: int | None, seed: int, source: str = "dataset") -> tuple[list, list]:
    """(training rows, ``heldout_size(len(rows), n)`` held-out rows), both in the rows' order; DataError when
    that leaves no training row."""
    k = heldout_size(len(rows), n)
    if k < 1 or k >= len(rows):
        raise DataError(f"{source} has {len(rows)} rows: too few to hold out {k} and train on the rest (give "
                        "--eval-data, or a smaller --heldout)")
    held = np.zeros(len(rows), bool)
    held[np.random.default_rng([seed, *SPLIT_STREAM]).permutation(len(rows))[:k]] = True
    return [r for r, h in zip(rows, held) if not h], [r for r, h in zip(rows, held) if h]
