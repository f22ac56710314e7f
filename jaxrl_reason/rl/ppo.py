"""PPO (PureJaxRL shape) on any discrete environment of the protocol: a configuration of
``rl.onpolicy`` (rollout, GAE, minibatch epochs, the family's advantage normalisation and
optimiser) with a parameter-shared ``models.policies`` network ("mlp" or "gru").

    trainer = make_chunked(config, env)            # rl.base.Trainer: init(key), update(state)
    train = make_train(config, env)                # train(key) -> {"runner_state", "metrics"}

Single-agent and simultaneous-move environments: every agent acts each step; turn-based games:
every agent observes every step, only the current player's action is played and enters the policy
loss. The whole loop is jitted and vmappable over seeds; ``make_chunked``'s ``update`` runs
``updates_per_chunk`` updates so a driver can log and checkpoint between chunks (bit-identical to
``train``).

Data parallelism (``PPOConfig.mesh``, see ``parallel.mesh.config_mesh``; by default on in a
multi-process run): the environments are split over the mesh's ``data`` axis, so each device (and
each process) steps and differentiates its slice; parameters, optimizer state and keys are
replicated and GSPMD inserts the gradient all-reduce. The random streams do not depend on the
split (threefry is partitionable), so the result matches one device up to the order of the sums.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
from flax import nnx

from jaxrl_reason import envs
from jaxrl_reason.models.policies import make_policy
from jaxrl_reason.parallel.mesh import config_mesh
from jaxrl_reason.rl.base import ChunkedTrain
from jaxrl_reason.rl.onpolicy import OnPolicyConfig, RunnerState, evaluation_policy, make_trainer

__all__ = ["PPOConfig", "ChunkedTrain", "RunnerState", "build_policy", "evaluation_policy", "make_chunked",
           "make_train"]


@dataclasses.dataclass(frozen=True)
class PPOConfig(OnPolicyConfig):
    """``OnPolicyConfig`` plus the budget in env steps, chunking, the network and the mesh."""

    total_timesteps: int = 204_800
    updates_per_chunk: int = 10
    policy: str = "mlp"  # "mlp" or "gru"
    hidden: int = 64
    mesh: str | None = None  # e.g. "data=8": environments split over "data" (None: see the module docstring)

    def __post_init__(self):
        super().__post_init__()
        for name in ("total_timesteps", "updates_per_chunk", "hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"PPOConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.total_timesteps < self.num_envs * self.num_steps:
            raise ValueError(
                f"PPOConfig.total_timesteps={self.total_timesteps} is less than one rollout "
                f"(num_envs * num_steps = {self.num_envs * self.num_steps})"
            )
        if self.policy not in ("mlp", "gru"):
            raise ValueError(f"PPOConfig.policy must be 'mlp' or 'gru', got {self.policy!r}")

    @property
    def num_chunks(self) -> int:
        """Chunks of ``updates_per_chunk`` updates covering ``total_timesteps`` (rounded up)."""
        updates = self.total_timesteps // (self.num_envs * self.num_steps)
        return -(-updates // self.updates_per_chunk)

    @property
    def num_updates(self) -> int:
        """Updates actually run: total_timesteps rounded up to whole chunks."""
        return self.num_chunks * self.updates_per_chunk


def _data_mesh(config: PPOConfig):
    """The mesh that splits the environments (None: one device), checked against the batch sizes."""
    mesh = config_mesh(config.mesh)
    if mesh is None:
        return None
    if "data" not in mesh.shape:
        raise ValueError(f"PPOConfig.mesh {config.mesh!r} has no 'data' axis to split the environments over")
    n = mesh.shape["data"]
    sizes = {"num_envs": config.num_envs, "num_envs / num_minibatches": config.num_envs // config.num_minibatches}
    for what, size in sizes.items():
        if size % n:
            raise ValueError(
                f"PPOConfig {what} = {size} is not divisible by the {n} devices of the 'data' mesh axis "
                f"({jax.process_count()} process(es) x {jax.local_device_count()} device(s)); use a multiple of {n}"
            )
    return mesh


def build_policy(config: PPOConfig, env: envs.Environment, key: jax.Array) -> nnx.Module:
    obs_dim = math.prod(env.obs_shape)
    kwargs = {"hidden": config.hidden} if config.policy == "gru" else {"hidden": (config.hidden,) * 2}
    return make_policy(config.policy, obs_dim, env.num_actions, rngs=nnx.Rngs(key), **kwargs)


def make_chunked(config: PPOConfig, env: envs.Environment) -> ChunkedTrain:
    """``ChunkedTrain(init, update, graphdef)``: ``init(key) -> RunnerState``, ``update(state) ->
    (state, metrics)`` with ``metrics`` ``[updates_per_chunk]`` each (``rl.onpolicy.make_trainer``)."""
    return make_trainer(config, env, lambda key: build_policy(config, env, key),
                        updates_per_chunk=config.updates_per_chunk, mesh=_data_mesh(config))


def make_train(config: PPOConfig, env: envs.Environment) -> Callable[[jax.Array], dict]:
    """``train(key) -> {"runner_state", "metrics"}``; metrics are ``[num_updates]`` arrays."""
    chunked = make_chunked(
        dataclasses.replace(config, updates_per_chunk=config.num_updates), env
    )

    def train(key):
        state, metrics = chunked.update(chunked.init(key))
        return {"runner_state": state, "metrics": metrics}

    return train
