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
``update``: the chunk ``run_chunks`` drives.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Protocol, TypeVar

import jax
import numpy as np

from jaxrl_reason import envs

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
