"""Side-by-side timing for benchmarks: calls interleaved round by round, so that a load change on a
shared machine hits every implementation alike (the benchmarks in ``experiments/`` use this)."""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable, Mapping

import jax


@dataclasses.dataclass(frozen=True)
class Timings:
    """Seconds of the timed calls of one function: wall-clock and process CPU time."""

    wall: list[float]
    cpu: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.wall)

    @property
    def best(self) -> float:
        return min(self.wall)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)


def after_warmup(fn: Callable[..., Any], *args, repeats: int = 1) -> tuple[Any, float]:
    """``(result, seconds)``: one untimed call of ``fn(*args)`` (compile, warm up), then the mean
    wall seconds of ``repeats`` calls (results blocked on); the result is the last call's."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    jax.block_until_ready(fn(*args))
    t = time.perf_counter()
    for _ in range(repeats):
        out = jax.block_until_ready(fn(*args))
    return out, (time.perf_counter() - t) / repeats


def interleaved(fns: Mapping[str, Callable[[int], Any]], rounds: int, last: dict | None = None) -> dict[str, Timings]:
    """Time ``fns[name](i)`` (results blocked on): one untimed call each with ``i = 0`` (compile and
    warm up), then ``rounds`` rounds ``i = 1..rounds`` calling every function once, in turn.

    ``i`` lets a function vary its input per call (e.g. ``jax.random.key(i)``); ignore it otherwise.
    ``last``: a dict that receives each function's last result (``last[name]``: checked after the timing).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    last = {} if last is None else last
    for name, f in fns.items():
        last[name] = jax.block_until_ready(f(0))
    wall = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    for i in range(1, rounds + 1):
        for name, f in fns.items():
            t, c = time.perf_counter(), time.process_time()
            last[name] = jax.block_until_ready(f(i))
            wall[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
    return {name: Timings(wall[name], cpu[name]) for name in fns}
