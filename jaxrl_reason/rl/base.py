"""The two shapes every RL module here shares, declared once (as mctx declares ``RecurrentFn``).

- ``Trainer``: ``state = trainer.init(key)``, ``state, metrics = trainer.update(state)``, where one
  ``update`` is one chunk of ``steps_per_chunk`` learning steps and every value of ``metrics`` is a
  ``[steps_per_chunk]`` array: ``utils.loop.run_chunks(run_dir, init(key), jit(update), ...)`` drives
  any of them (log, checkpoint, resume between chunks). ``ChunkedTrain`` is the concrete one the
  on-policy family (``rl.onpolicy``: PPO, IPPO, HDR-IPPO, MAPPO, self-play) returns.
- ``Policy``: ``carry, action = policy(carry, key, ts)`` for one environment, what
  ``rl.evaluate.evaluate``, the arenas and the experiments play.

The LM trainers (GRPO, SPIRAL, MemAgent, JoyAgents) share the first half of that shape: ``state =
trainer.init(key)``, ``state, metrics = trainer.step(state)``, each step's data drawn by the step index from
a seeded stream (so a resumed run draws what the uninterrupted one drew). Their step runs host code between
device programs (drawing data, decoding, reward functions), so ``host_steps(trainer.step, n)`` is their
``update``; ``run_steps`` is that whole run, one step per chunk of ``run_chunks``, with evaluations, checkpoints
and log lines each at its own interval.
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any, Callable, Mapping, NamedTuple, Protocol, TypeVar

import jax
import numpy as np
from tqdm.auto import tqdm

from jaxrl_reason import envs
from jaxrl_reason.utils.experiment import RunDir, RunDirError
from jaxrl_reason.utils.loop import run_chunks

State = TypeVar("State")
Carry = Any  # a pytree; an empty array for feed-forward policies
Metrics = dict[str, jax.Array]


class Trainer(Protocol[State]):
    """A jittable trainer in chunks (pure functions of the state)."""

    def init(self, key: jax.Array) -> State:
        """PRNG key -> the initial training state (parameters, optimiser, environments, key)."""

    def update(self, state: State) -> tuple[State, Metrics]:
        """One chunk of ``steps_per_chunk`` learning steps -> (state, metrics ``[steps_per_chunk]`` each)."""


class Policy(Protocol):
    """An acting policy for ONE environment (vmap it over a batch): ``policy(carry, key, ts) -> (carry, action)``.

    - ``carry``: the policy's recurrent state (pytree; an empty array when it has none).
    - ``key``: PRNG key for sampling.
    - ``ts``: the environment's ``TimeStep``: ``obs [A, *obs_shape]``, ``legal_action_mask [A, N]``,
      ``current_player []`` (turn-based games).
    - returns ``(carry, action)``: ``action`` is ``[]`` int32 (the current player's move) for turn-based
      environments, ``[A]`` int32 for simultaneous-move ones.
    """

    def __call__(self, carry: Carry, key: jax.Array, ts: envs.TimeStep) -> tuple[Carry, jax.Array]: ...


class ChunkedTrain(NamedTuple):
    """A ``Trainer`` plus the graph of its network (``nnx.merge(graphdef, state.params)``)."""

    init: Callable[[jax.Array], Any]
    update: Callable[[Any], tuple[Any, Metrics]]
    graphdef: Any


def host_steps(step: Callable[[State], tuple[State, Metrics]], steps: int):
    """``state -> (state, metrics)``: ``steps`` calls of an LM trainer's ``step`` (a ``Trainer.update`` for
    ``utils.loop.run_chunks``), every metric stacked ``[steps]`` (numpy, on the host)."""

    def update(state):
        rows = []
        for _ in range(steps):
            state, m = step(state)
            rows.append(jax.device_get(m))
        return state, {k: np.asarray([r[k] for r in rows]) for k in rows[0]}

    return update


def check_intervals(num_steps: int, **intervals: int | None) -> None:
    """``num_steps >= 0`` and every interval (``eval_every=``, ``save_every=``, ...) ``>= 0`` or None; ValueError naming
    the first that is not. No interval has to divide ``num_steps`` (``run_steps``)."""
    if num_steps < 0:
        raise ValueError(f"steps must be >= 0, got {num_steps}")
    for name, value in intervals.items():
        if value is not None and value < 0:
            raise ValueError(f"{name} must be >= 0 (0: never), got {value}")


def eval_line(desc: str, step: int, metrics: Mapping[str, Any]) -> str | None:
    """One console line of an evaluation's ``{name: scalar}``: for each group (the part before the first "/":
    ``eval``, ``eval_data``, ...) accuracy ± SE (n), the other accuracies, pass@k, mean@n and the mean response
    length; None when no group holds an accuracy, pass@k or length.

        [grpo] eval step 2: eval accuracy 0.432 ± 0.022 (n 512), strict_accuracy 0.410, pass@4 0.550, len 23.4"""
    groups: dict[str, dict[str, Any]] = {}
    for key, value in metrics.items():
        group, sep, name = key.partition("/")
        if sep:
            groups.setdefault(group, {})[name] = value
    fmt = lambda v: f"{float(v):.3f}"
    parts = []
    for group, m in groups.items():
        shown = []
        if "accuracy" in m:
            se = f" ± {fmt(m['se'])}" if "se" in m else ""
            shown.append(f"accuracy {fmt(m['accuracy'])}{se}" + (f" (n {int(m['n'])})" if "n" in m else ""))
        shown += [f"{k} {fmt(v)}" for k, v in m.items() if "accuracy" in k and k != "accuracy"
                  and not k.endswith(("_se", "_n"))]
        at_k = sorted((k for k in m if re.fullmatch(r"(pass|mean)@\d+", k)),
                      key=lambda k: (k.startswith("mean"), int(k.split("@")[1])))
        shown += [f"{k} {fmt(m[k])}" for k in at_k]
        if "response_length" in m:
            shown.append(f"len {float(m['response_length']):.1f}")
        if shown:
            parts.append(f"{group} {', '.join(shown)}")
    return f"[{desc}] eval step {step}: {'; '.join(parts)}" if parts else None


def run_steps(run_dir: RunDir, step: Callable[[State], tuple[State, Metrics]], state: State, num_steps: int,
              eval_every: int, evaluate: Callable[[State], dict] | None = None, desc: str = "train", *,
              save_every: int | None = None, log_every: int = 0, after_step: Callable[[State], None] | None = None,
              show: Mapping[str, str] | None = None) -> State:
    """An LM trainer's run: ``num_steps`` calls of ``step``, one chunk each of ``utils.loop.run_chunks`` (a
    progress bar that moves every step, one metrics row per step with ``time_step_s``, the non-finite guard,
    exact resume).

    - ``evaluate(state) -> {name: scalar}`` is logged at the state's step before the first step (not again on a
      resume), after every ``eval_every``-th step (0: never in between) and after the last; each evaluation prints
      one line (``eval_line``: accuracy ± SE, n, pass@k, response length).
    - checkpoints after every ``save_every``-th step (None: ``eval_every``; 0: none in between) and after the last.
    - ``show``: {label: metric} shown after the progress bar (the last step's values) and, every ``log_every``
      steps (0: never), printed as one line of their means over those steps.
    - ``after_step(state)``: called after each step (e.g. to log sample completions).

    None of the intervals has to divide ``num_steps``. Checkpoints are numbered by step, so a resumed run continues
    after the last checkpoint and repeats exactly what the uninterrupted run did from there."""
    check_intervals(num_steps, eval_every=eval_every, save_every=save_every, log_every=log_every)
    save_every = eval_every if save_every is None else save_every
    window: list[dict] = []
    expected: list[int] = []  # the step the next call starts from (checkpoints are numbered by step)

    def one_step(state):
        if not expected:
            expected.append((run_dir.checkpointer().latest_step() or 0) if run_dir.resumed else int(state.step))
        if int(state.step) != expected[0]:
            raise RunDirError(f"{run_dir.path}: checkpoint {expected[0]} holds the state after step {int(state.step)}: "
                              "it was written by an older version that numbered checkpoints by evaluation chunk; "
                              "resume it with that version, or start a new run")
        expected[0] += 1
        t0 = time.perf_counter()
        state, metrics = step(state)
        metrics = {**jax.device_get(metrics), "time_step_s": time.perf_counter() - t0}
        done = int(state.step)
        if after_step is not None:
            after_step(state)
        if show and log_every and run_dir.is_writer:
            window.append(metrics)
            if done % log_every == 0 or done == num_steps:
                tqdm.write(f"[{desc}] step {done}/{num_steps} " + " ".join(
                    f"{label} {np.mean([m[k] for m in window if k in m]):.4g}" for label, k in show.items()
                    if any(k in m for m in window)), file=sys.stderr)
                window.clear()
        if evaluate is not None and ((eval_every and done % eval_every == 0) or done == num_steps):
            log_eval(state)
        return state, {k: np.asarray([v]) for k, v in metrics.items()}

    def log_eval(state) -> None:
        step, metrics = int(state.step), evaluate(state)
        run_dir.log(step, metrics)
        line = eval_line(desc, step, metrics)
        if line and run_dir.is_writer:
            tqdm.write(line, file=sys.stderr)

    if evaluate is not None and not run_dir.resumed:
        if run_dir.is_writer:
            tqdm.write(f"[{desc}] evaluating the start (step {int(state.step)}) before training", file=sys.stderr)
        log_eval(state)
    postfix = None if not show else (lambda m: {label: f"{float(m[k][-1]):.4g}" for label, k in show.items() if k in m})
    return run_chunks(run_dir, state, one_step, num_steps, steps_per_chunk=1, checkpoint_every=save_every or
                      max(num_steps, 1), desc=desc, postfix=postfix)
