"""``RewardSuite``: run weighted reward functions on a batch of decoded completions, sync ones on host threads and
async ones together on an event loop.

    suite = RewardSuite([make_reward("math_verify"), (make_reward("r1_format"), 0.1)], max_workers=4)
    fut = suite.submit(prompts, completions, fields, step=step)   # a Future, returned at once
    total, per_fn = fut.result()   # total [B] float32 = sum_i w_i * r_i ; per_fn {name: [B] float32} (unweighted)
    scores = suite.score(prompts, completions, fields, step=step, turns=None).result()   # RewardScores

Calling convention (``reward_call``): a function gets only the keywords it declares (``completion_ids``, ``step``,
row fields), or all of them when it takes ``**kwargs``; ``prompts`` and ``completions`` go positionally, or by
keyword when it names a ``completions`` parameter elsewhere (TRL style ``f(completions, **kwargs)``). An
``async def`` function (or one returning an awaitable) is awaited; all async functions of a batch run
concurrently on one event loop in a worker thread.

Return values, one per completion: a number; ``None`` to exclude that sample from the loss (its advantage and
loss mask zeroed by the trainer, counted as ``reward/<name>/excluded``; NaN marks it in ``per_fn`` and in the
legacy ``total``); or, for a multi-turn episode (``turns`` [B] given: the number of model turns of each sample),
a list of ``turns[i]`` per-turn numbers. Per-turn rewards sum to the episode's reward (what GRPO's sequence-level
advantage uses); ``RewardScores.per_turn`` keeps them per turn, an episode-level number counted at the last turn.
Anything else (a wrong length, a string, NaN / inf, a per-turn list of the wrong length) is a ``RewardError``
naming the function, in one line; so is an exception the function raises (the first failing function in suite
order).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import dataclasses
import inspect
import math
import numbers
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

RewardFn = Callable[..., Sequence[float | None]]  # fn(prompts, completions, *, completion_ids, step, **fields)

RESERVED_FIELDS = ("prompts", "completions", "step")
_MAX_ERROR_CHARS = 300


class RewardError(ValueError):
    """A reward function raised, or returned something that is not B numbers (or None)."""


def reward_name(fn) -> str:
    """``fn.name`` if it is a non-empty string, else ``fn.__name__``, else the type name."""
    name = getattr(fn, "name", None)
    if isinstance(name, str) and name:
        return name
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) and name else type(fn).__name__


@dataclasses.dataclass(frozen=True)
class RewardCall:
    """How one reward function is called (``reward_call``): ``takes`` the keyword names it declares (None: all,
    it has ``**kwargs``); ``by_keyword``: prompts / completions passed by keyword; ``required``: its keyword
    parameters without a default; ``is_async``: an ``async def`` (or async ``__call__``)."""

    takes: frozenset[str] | None
    by_keyword: bool
    required: tuple[str, ...]
    is_async: bool

    def kwargs(self, prompts, completions, extra: Mapping[str, Any]) -> tuple[tuple, dict]:
        """-> (positional args, keyword args) of one call; ``extra``: step, completion_ids and the row fields."""
        avail = {"prompts": prompts, "completions": completions, **extra} if self.by_keyword else dict(extra)
        kw = avail if self.takes is None else {k: v for k, v in avail.items() if k in self.takes}
        return ((), kw) if self.by_keyword else ((prompts, completions), kw)


def _is_async(fn) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(type(fn), "__call__", None))


def reward_call(fn, ref: str | None = None) -> RewardCall:
    """Inspect ``fn``'s signature -> ``RewardCall``; ``RewardError`` (naming ``ref``, default the function's name)
    when it cannot take (prompts, completions): fewer than two positional parameters and no ``completions``."""
    ref = ref or reward_name(fn)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: everything, positionally
        return RewardCall(None, False, (), _is_async(fn))
    params = list(sig.parameters.values())
    kinds = {p.kind for p in params}
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keyword = {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    by_keyword = "completions" in keyword and [p.name for p in positional[:2]] != ["prompts", "completions"]
    if by_keyword:
        named = [p for p in keyword.values()]
        if any(p.kind == p.POSITIONAL_ONLY and p.default is p.empty for p in params):
            raise RewardError(f"reward function {ref!r}{sig}: positional-only parameters besides a keyword "
                              "'completions' cannot be filled; take (prompts, completions, ...)")
    else:
        if len(positional) < 2 and inspect.Parameter.VAR_POSITIONAL not in kinds:
            raise RewardError(f"reward function {ref!r}{sig}: must take (prompts, completions) first, e.g. "
                              "def f(prompts, completions, *, answer, step): ...")
        named = positional[2:] + [p for p in params if p.kind == p.KEYWORD_ONLY]
    takes = None if inspect.Parameter.VAR_KEYWORD in kinds else frozenset(p.name for p in named)
    required = tuple(p.name for p in named if p.default is p.empty and p.name not in ("prompts", "completions"))
    return RewardCall(takes, by_keyword, required, _is_async(fn))


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


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS] + " ..."


def _number(v) -> bool:
    return isinstance(v, numbers.Real) or (isinstance(v, (np.ndarray, np.generic)) and np.ndim(v) == 0
                                           and np.asarray(v).dtype.kind in "biuf")


def _check_finite(name: str, values: np.ndarray, step: int, rows=None) -> None:
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        rows = bad if rows is None else np.asarray(rows)[bad]
        raise RewardError(f"reward function {name!r} returned {bad.size} non-finite value(s) at step {step}: "
                          f"rows {rows[:8].tolist()}{' ...' if bad.size > 8 else ''} "
                          f"(values {values[bad[:8]].tolist()}); return None to exclude a sample")


def check_rewards(name: str, out, n: int, step: int, turns: Sequence[int] | None = None
                  ) -> tuple[np.ndarray, list[np.ndarray] | None]:
    """Validate one function's output -> (episode rewards [n] float32, NaN where it returned None; per-turn
    rewards: [turns[i]] float32 per row (an episode-level number at the last turn), only with ``turns``).
    ``RewardError`` naming ``name`` for anything else (see the module docstring)."""
    if isinstance(out, (str, bytes)) or not hasattr(out, "__len__"):
        raise RewardError(f"reward function {name!r} returned a {type(out).__name__} at step {step}, expected a "
                          f"sequence of {n} rewards (one per completion)")
    try:
        arr = np.asarray(out)
    except (ValueError, TypeError):  # ragged nested sequences: per-turn lists
        arr = None
    if arr is not None and arr.ndim > 1 and turns is None:
        raise RewardError(f"reward function {name!r} returned shape {arr.shape} at step {step}, expected a 1-D "
                          f"sequence of length {n} (one reward per completion; per-turn lists need a multi-turn "
                          "rollout)")
    if len(out) != n:
        raise RewardError(f"reward function {name!r} returned length {len(out)} at step {step}, expected a 1-D "
                          f"sequence of length {n} (one reward per completion)")
    if arr is not None and arr.ndim == 1 and arr.dtype.kind in "biuf":  # the common case, vectorised
        ep = arr.astype(np.float32)
        _check_finite(name, ep, step)
        return ep, None if turns is None else [np.append(np.zeros(t - 1, np.float32), r) for t, r in zip(turns, ep)]
    ep, per_turn = np.empty(n, np.float32), None if turns is None else []
    for i, v in enumerate(out):
        t = None if turns is None else int(turns[i])
        if v is None:
            ep[i] = np.nan
            row = None if t is None else np.full(t, np.nan, np.float32)
        elif _number(v):
            ep[i] = float(v)
            _check_finite(name, ep[i:i + 1], step, [i])
            row = None if t is None else np.append(np.zeros(t - 1, np.float32), ep[i])
        elif t is not None and hasattr(v, "__len__") and not isinstance(v, (str, bytes)):
            if len(v) != t or not all(_number(x) for x in v):
                raise RewardError(f"reward function {name!r} returned per-turn rewards {_one_line(repr(v))[:80]} for "
                                  f"row {i} at step {step}, expected {t} numbers (one per turn of the episode)")
            row = np.asarray(v, np.float32)
            _check_finite(name, row, step, [i] * t)
            ep[i] = row.sum()
        else:
            raise RewardError(f"reward function {name!r} returned non-numeric values at step {step}: "
                              f"{type(v).__name__} {_one_line(repr(v))[:60]} for row {i}, expected a number "
                              f"(or None to exclude the sample)")
        if per_turn is not None:
            per_turn.append(row)
    return ep, per_turn


@dataclasses.dataclass
class RewardScores:
    """One batch's rewards (``RewardSuite.score``). ``total`` [B] float32: sum_i w_i r_i over the functions, 0 on
    excluded rows; ``valid`` [B] bool: False where any function returned None; ``per_fn`` {name: [B] float32}:
    each function's unweighted (episode) rewards, NaN where it returned None; ``excluded`` {name: rows it
    returned None for}; ``per_turn``: with ``turns``, [turns[i]] float32 weighted totals per turn of each row
    (summing to ``total``; NaN on excluded rows), else None."""

    total: np.ndarray
    valid: np.ndarray
    per_fn: dict[str, np.ndarray]
    excluded: dict[str, int]
    per_turn: list[np.ndarray] | None = None

    def legacy(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(total [B] with NaN on excluded rows, per_fn): ``RewardSuite.submit``'s result."""
        return np.where(self.valid, self.total, np.float32(np.nan)).astype(np.float32), self.per_fn


def finite_mean_std(values: np.ndarray) -> tuple[float, float, int]:
    """(mean, std, n) over the finite entries of ``values`` (the rows a reward scored); (0, 0, 0) for none."""
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    return (float(v.mean()), float(v.std()), int(v.size)) if v.size else (0.0, 0.0, 0)


class RewardSuite:
    """Weighted reward functions run concurrently: sync ones each on a host thread, async ones together on an
    event loop (one worker thread).

    ``fns``: reward functions, or ``(fn, weight)`` pairs (weight 1.0 by default). ``names`` are the
    functions' names made unique; ``calls`` how each is called (``reward_call``). ``last_seconds`` holds the wall
    time per function of the most recently finished batch (for logging). Use as a context manager, or call
    ``close()``.
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
        self.calls: tuple[RewardCall, ...] = tuple(reward_call(fn, name) for fn, name in zip(self.fns, self.names))
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

    def _error(self, i: int, e: Exception, step: int, n: int) -> RewardError:
        return RewardError(f"reward function {self.names[i]!r} raised {type(e).__name__} at step {step} on a batch "
                           f"of {n} completions: {_one_line(e)}")

    def _run_one(self, i: int, prompts, completions, extra, step: int, turns):
        """Call sync function i (awaiting an awaitable it returns) -> (episode [B], per-turn | None, seconds)."""
        t0 = time.perf_counter()
        args, kw = self.calls[i].kwargs(prompts, completions, extra)
        try:
            out = self.fns[i](*args, **kw)
            if inspect.isawaitable(out):
                out = asyncio.run(_awaited(out))
        except Exception as e:
            raise self._error(i, e, step, len(completions)) from e
        return (*check_rewards(self.names[i], out, len(completions), step, turns), time.perf_counter() - t0)

    def _run_async(self, idx: list[int], parts: list[cf.Future], prompts, completions, extra, step: int,
                   turns) -> None:
        """Await the async functions ``idx`` concurrently on one event loop; resolve their futures."""
        async def one(i):
            t0 = time.perf_counter()
            args, kw = self.calls[i].kwargs(prompts, completions, extra)
            try:
                out = await self.fns[i](*args, **kw)
            except Exception as e:
                raise self._error(i, e, step, len(completions)) from e
            return (*check_rewards(self.names[i], out, len(completions), step, turns), time.perf_counter() - t0)

        async def all_():
            return await asyncio.gather(*(one(i) for i in idx), return_exceptions=True)

        try:
            results = asyncio.run(all_())
        except BaseException as e:  # the loop itself failed: every future must still resolve
            results = [e] * len(idx)
        for i, r in zip(idx, results):
            if isinstance(r, BaseException):
                parts[i].set_exception(r)
            else:
                parts[i].set_result(r)

    def score(self, prompts: Sequence[str], completions: Sequence[str], fields: Mapping[str, Sequence] | None = None,
              step: int = 0, turns: Sequence[int] | None = None) -> cf.Future:
        """Start all functions on a batch of B rows; -> Future of ``RewardScores``, returned at once.

        ``fields``: per-row columns (each of length B, e.g. ``answer``, ``completion_ids``), passed with ``step``
        to every function that declares them (or takes ``**kwargs``). ``turns`` [B] ints: the model turns of each
        multi-turn sample (allows per-turn rewards). The inputs must not be mutated until the future resolves.
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
        if turns is not None:
            turns = [int(t) for t in turns]
            if len(turns) != n or min(turns, default=1) < 1:
                raise ValueError(f"RewardSuite: turns must be {n} ints >= 1 (model turns per sample)")
        extra = {**fields, "step": step}
        pool = self._executor()
        parts: list[cf.Future] = [None] * len(self.fns)
        async_idx = [i for i, c in enumerate(self.calls) if c.is_async]
        for i in range(len(self.fns)):
            if i in async_idx:
                parts[i] = cf.Future()
                parts[i].set_running_or_notify_cancel()
            else:
                parts[i] = pool.submit(self._run_one, i, prompts, completions, extra, step, turns)
        if async_idx:
            pool.submit(self._run_async, async_idx, parts, prompts, completions, extra, step, turns)
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
                result.set_result(self._combine([p.result() for p in parts], n))
            except Exception as e:  # a callback's exception would be swallowed and the future never resolve
                result.set_exception(e)

        for p in parts:
            p.add_done_callback(finish)
        return result

    def _combine(self, outs, n: int) -> RewardScores:
        per_fn = {name: ep for name, (ep, _, _) in zip(self.names, outs)}
        valid = np.ones(n, bool)
        total = np.zeros(n, np.float32)
        for w, ep in zip(self.weights, per_fn.values()):
            valid &= np.isfinite(ep)
            total += w * np.nan_to_num(ep, nan=0.0)
        per_turn = None
        if outs and outs[0][1] is not None:
            per_turn = [sum(w * np.nan_to_num(pt[i], nan=0.0) for w, (_, pt, _) in zip(self.weights, outs))
                        .astype(np.float32) if valid[i] else np.full(len(outs[0][1][i]), np.nan, np.float32)
                        for i in range(n)]
        total = np.where(valid, total, 0.0).astype(np.float32)
        self.last_seconds = {name: s for name, (_, _, s) in zip(self.names, outs)}
        excluded = {name: int(np.isnan(ep).sum()) for name, ep in per_fn.items()}
        return RewardScores(total, valid, per_fn, excluded, per_turn)

    def submit(self, prompts: Sequence[str], completions: Sequence[str], fields: Mapping[str, Sequence] | None = None,
               step: int = 0) -> cf.Future:
        """``score`` -> Future of ``(total [B], {name: [B]})`` (float32; NaN marks rows a function returned None
        for: they are excluded, see ``RewardScores``)."""
        inner = self.score(prompts, completions, fields, step=step)
        out: cf.Future = cf.Future()
        out.set_running_or_notify_cancel()

        def done(f):
            if f.exception() is not None:
                out.set_exception(f.exception())
            else:
                out.set_result(f.result().legacy())

        inner.add_done_callback(done)
        return out

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], fields: Mapping[str, Sequence] | None = None,
                 step: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Synchronous ``submit(...).result()``."""
        return self.submit(prompts, completions, fields, step=step).result()

    def metrics(self, per_fn: Mapping[str, np.ndarray], prefix: str = "reward/") -> dict[str, float]:
        """Scalars to log for every function's unweighted rewards: mean (``reward/<name>``) and std
        (``reward/<name>_std``) over the rows it scored, and ``reward/<name>/excluded``: rows it returned None for."""
        out = {}
        for name, r in per_fn.items():
            mean, std, scored = finite_mean_std(r)
            out[f"{prefix}{name}"], out[f"{prefix}{name}_std"] = mean, std
            out[f"{prefix}{name}/excluded"] = float(len(r) - scored)
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


async def _awaited(x):
    return await x
