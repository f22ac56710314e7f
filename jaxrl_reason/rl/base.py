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
``update``: the chunk ``run_chunks`` drives; ``run_steps`` is that whole run, with periodic evaluations.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Protocol, TypeVar

import jax
import numpy as np

from jaxrl_reason import envs
from jaxrl_reason.utils.experiment import RunDir
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


def check_schedule(num_steps: int, eval_every: int) -> None:
    """An LM run's schedule: ``num_steps`` a positive multiple of ``eval_every`` (ValueError otherwise)."""
    if num_steps < 1 or eval_every < 1 or num_steps % eval_every:
        raise ValueError(f"the number of steps ({num_steps}) must be a positive multiple of eval_every ({eval_every})")


def run_steps(run_dir: RunDir, step: Callable[[State], tuple[State, Metrics]], state: State, num_steps: int,
              eval_every: int, evaluate: Callable[[State], dict] | None = None, desc: str = "train") -> State:
    """An LM trainer's run: ``num_steps`` calls of ``step`` in chunks of ``eval_every`` (``host_steps``) driven by
    ``utils.loop.run_chunks`` (metrics, a checkpoint per chunk, exact resume). ``evaluate(state) -> {name: scalar}``
    is logged at the state's step before the first chunk (not again on a resume) and after every chunk."""
    check_schedule(num_steps, eval_every)
    update = host_steps(step, eval_every)

    def chunk(state):
        state, metrics = update(state)
        if evaluate is not None:
            run_dir.log(int(state.step), evaluate(state))
        return state, metrics

    if evaluate is not None and not run_dir.resumed:
        run_dir.log(int(state.step), evaluate(state))
    return run_chunks(run_dir, state, chunk, num_steps // eval_every, steps_per_chunk=eval_every, desc=desc)
