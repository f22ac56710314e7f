"""``RewardSuite``: run weighted reward functions on a batch of decoded completions in a thread pool.

    suite = RewardSuite([make_reward("math_verify"), (make_reward("r1_format"), 0.1)], max_workers=4)
    fut = suite.submit(prompts, completions, fields, step=step)   # a Future, returned at once
    total, per_fn = fut.result()   # total [B] float32 = sum_i w_i * r_i ; per_fn {name: [B] float32} (unweighted)

Every function of a batch runs as its own task in a lazily created ``ThreadPoolExecutor``; the returned
future is resolved by a done-callback of the last one to finish (no combiner thread, so
``max_workers=1`` cannot deadlock). Outputs are validated (1-D numeric, length B, finite); any failure
resolves the future with a ``RewardError`` naming the function (the first failing one in suite order).
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import numbers
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

RewardFn = Callable[..., Sequence[float]]  # fn(prompts, completions, *, step, **fields) -> [B] floats

RESERVED_FIELDS = ("prompts", "completions", "step")


class RewardError(ValueError):
    """A reward function raised, or returned something that is not B finite numbers."""


def reward_name(fn) -> str:
    """``fn.name`` if it is a non-empty string, else ``fn.__name__``, else the type name."""
    name = getattr(fn, "name", None)
    if isinstance(name, str) and name:
        return name
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) and name else type(fn).__name__


def _unique(names: Sequence[str]) -> tuple[str, ...]:
    """Second and later copies of a name get ``_2``, ``_3``, ... (skipping names already taken)."""
    out: list[str] = []
    for name in names:
        new, k = name, 2
        while new in out or (new != name and new in names):
            new, k = f"{name}_{k}", k + 1
        out.append(new)
    return tuple(out)


def _finite_weight(w) -> float:
    if not isinstance(w, numbers.Real) or isinstance(w, bool) or not math.isfinite(float(w)):
        raise ValueError(f"RewardSuite: weights must be finite numbers, got {w!r}")
    return float(w)


def check_rewards(name: str, out, n: int, step: int) -> np.ndarray:
    """Validate one function's output -> [n] float32; raise ``RewardError`` naming ``name`` otherwise."""
    try:
        arr = np.asarray(out)
    except (ValueError, TypeError) as e:  # ragged nested sequences
        raise RewardError(f"reward function {name!r} returned a non-numeric {type(out).__name__} "
                          f"at step {step} (expected {n} numbers)") from e
    if arr.ndim != 1 or arr.shape[0] != n:
        got = f"length {arr.shape[0]}" if arr.ndim == 1 else f"shape {arr.shape}"
        raise RewardError(f"reward function {name!r} returned {got} at step {step}, expected a 1-D sequence "
                          f"of length {n} (one reward per completion)")
    if arr.dtype.kind not in "biuf":
        raise RewardError(f"reward function {name!r} returned non-numeric values (dtype {arr.dtype}) at step "
                          f"{step}, expected {n} numbers")
    arr = arr.astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise RewardError(f"reward function {name!r} returned {bad.size} non-finite value(s) at step {step}: "
                          f"rows {bad[:8].tolist()}{' ...' if bad.size > 8 else ''} "
                          f"(values {arr[bad[:8]].tolist()})")
    return arr


class RewardSuite:
    """Weighted reward functions run concurrently on host threads.

    ``fns``: reward functions, or ``(fn, weight)`` pairs (weight 1.0 by default). ``names`` are the
    functions' names made unique. ``last_seconds`` holds the wall time per function of the most
    recently finished batch (for logging). Use as a context manager, or call ``close()``.
    """

    def __init__(self, fns: Sequence[RewardFn | tuple[RewardFn, float]], max_workers: int = 4):
        entries = list(fns)
        if not entries:
            raise ValueError("RewardSuite: needs at least one reward function")
        self.fns: tuple[RewardFn, ...] = ()
        weights = []
        for entry in entries:
            fn, w = entry if isinstance(entry, tuple) else (entry, 1.0)
            if not callable(fn):
                raise ValueError(f"RewardSuite: {fn!r} is not callable (expected fn(prompts, completions, **fields))")
            self.fns += (fn,)
            weights.append(_finite_weight(w))
        if not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(f"RewardSuite: max_workers must be an int >= 1, got {max_workers!r}")
        self.weights = np.asarray(weights, np.float32)
        self.names: tuple[str, ...] = _unique([reward_name(fn) for fn in self.fns])
        self.max_workers = max_workers
        self.last_seconds: dict[str, float] = {}
        self._pool: cf.ThreadPoolExecutor | None = None
        self._closed = False
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}*{w:g}" for n, w in zip(self.names, self.weights))
        return f"RewardSuite({parts}; max_workers={self.max_workers})"

    def _executor(self) -> cf.ThreadPoolExecutor:
        with self._lock:
            if self._closed:
                raise RuntimeError("RewardSuite: submit after close()")
            if self._pool is None:
                self._pool = cf.ThreadPoolExecutor(self.max_workers, thread_name_prefix="reward")
            return self._pool

    def _run_one(self, i: int, prompts, completions, fields, step: int) -> tuple[np.ndarray, float]:
        name, t0 = self.names[i], time.perf_counter()
        try:
            out = self.fns[i](prompts, completions, step=step, **fields)
        except Exception as e:
            raise RewardError(f"reward function {name!r} raised {type(e).__name__} at step {step} on a batch of "
                              f"{len(completions)} completions: {e}") from e
        return check_rewards(name, out, len(completions), step), time.perf_counter() - t0

    def submit(self, prompts: Sequence[str], completions: Sequence[str], fields: Mapping[str, Sequence] | None = None,
               step: int = 0) -> cf.Future:
        """Start all functions on a batch of B rows; -> Future of ``(total [B], {name: [B]})`` (float32).

        ``fields``: per-row columns (each of length B, e.g. ``answer``, ``completion_ids``), passed to every
        function as keyword arguments, with ``step``. The inputs must not be mutated until the future resolves.
        """
        prompts, completions, fields = list(prompts), list(completions), dict(fields or {})
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"RewardSuite: {len(prompts)} prompts but {n} completions")
        for key, col in fields.items():
            if key in RESERVED_FIELDS:
                raise ValueError(f"RewardSuite: field name {key!r} is reserved ({', '.join(RESERVED_FIELDS)})")
            if isinstance(col, (str, bytes)) or not hasattr(col, "__len__") or len(col) != n:
                got = f"length {len(col)}" if hasattr(col, "__len__") else type(col).__name__
                raise ValueError(f"RewardSuite: field {key!r} must be a per-row sequence of length {n}, got {got}")
        pool = self._executor()
        parts = [pool.submit(self._run_one, i, prompts, completions, fields, step) for i in range(len(self.fns))]
        result: cf.Future = cf.Future()
        result.set_running_or_notify_cancel()  # running: cannot be cancelled, so set_result always works
        remaining = [len(parts)]
        count_lock = threading.Lock()

        def finish(_):
            with count_lock:
                remaining[0] -= 1
                if remaining[0]:
                    return
            errors = [p.exception() for p in parts if p.exception() is not None]
            if errors:
                result.set_exception(errors[0])
                return
            try:
                outs = [p.result() for p in parts]
                per_fn = {name: r for name, (r, _) in zip(self.names, outs)}
                total = np.zeros(n, np.float32)
                for w, r in zip(self.weights, per_fn.values()):
                    total += w * r
            except Exception as e:  # a callback's exception would be swallowed and the future never resolve
                result.set_exception(e)
                return
            self.last_seconds = {name: s for name, (_, s) in zip(self.names, outs)}
            result.set_result((total, per_fn))

        for p in parts:
            p.add_done_callback(finish)
        return result

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], fields: Mapping[str, Sequence] | None = None,
                 step: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Synchronous ``submit(...).result()``."""
        return self.submit(prompts, completions, fields, step=step).result()

    def metrics(self, per_fn: Mapping[str, np.ndarray], prefix: str = "reward/") -> dict[str, float]:
        """Scalars to log: mean (``reward/<name>``) and std (``reward/<name>_std``) of every function's
        unweighted rewards."""
        out = {}
        for name, r in per_fn.items():
            out[f"{prefix}{name}"] = float(np.mean(r))
            out[f"{prefix}{name}_std"] = float(np.std(r))
        return out

    def close(self) -> None:
        """Shut the thread pool down (waits for running functions); the suite cannot submit afterwards."""
        with self._lock:
            pool, self._pool, self._closed = self._pool, None, True
        if pool is not None:
            pool.shutdown(wait=True)

    def __enter__(self) -> "RewardSuite":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
