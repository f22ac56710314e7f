"""MAPPO: PPO with a parameter-shared actor on local observations and a centralised critic on the
global state (plus a one-hot agent id), PureJaxRL shape.

A configuration of ``rl.onpolicy``: hyperparameters are ``rl.ppo.PPOConfig`` (``policy="mlp"``
only) and the trainer is PPO's with the ``critic_input`` hook (``common.global_state``). The
environment's own metrics (e.g. the swarm's ``coverage``) come from ``env.info_metrics``.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from flax import nnx

from jaxrl_reason import envs
from jaxrl_reason.models.policies import MLP
from jaxrl_reason.rl.base import ChunkedTrain
from jaxrl_reason.rl.marl import common
from jaxrl_reason.rl.onpolicy import Hooks, evaluation_policy, make_trainer
from jaxrl_reason.rl.ppo import PPOConfig, _data_mesh

__all__ = ["CentralisedActorCritic", "evaluation_policy", "make_chunked"]


class CentralisedActorCritic(nnx.Module):
    """``(carry, obs [..., A, D], reset, state [..., S] | None) -> (carry, logits [..., A, N], values
    [..., A] | None)``: the actor reads local observations, the critic the global state."""

    def __init__(self, obs_dim: int, state_dim: int, num_agents: int, num_actions: int, hidden: int,
                 *, rngs: nnx.Rngs):
        self.actor = MLP([obs_dim, hidden, hidden, num_actions], rngs=rngs, final_scale=0.01)
        self.critic = MLP([state_dim + num_agents, hidden, hidden, 1], rngs=rngs)
        self.num_agents = num_agents

    def initial_carry(self, batch_shape: tuple[int, ...]):
        return jnp.zeros((*batch_shape, 0), jnp.float32)

    def values(self, s):
        A = self.num_agents
        x = jnp.concatenate([jnp.broadcast_to(s[..., None, :], (*s.shape[:-1], A, s.shape[-1])),
                             jnp.broadcast_to(jnp.eye(A), (*s.shape[:-1], A, A))], -1)
        return self.critic(x)[..., 0]

    def __call__(self, carry, obs, reset, state=None):
        return carry, self.actor(obs), (None if state is None else self.values(state))


def make_chunked(config: PPOConfig, env: envs.Environment) -> ChunkedTrain:
    """``init(key)`` and ``update(state) -> (state, metrics [updates_per_chunk])``."""
    common.check_discrete_simultaneous(env, "MAPPO")
    if config.policy != "mlp":
        raise ValueError("MAPPO here supports policy='mlp' only")
    obs_dim, state_dim = math.prod(env.obs_shape), common.global_state_dim(env)
    build = lambda key: CentralisedActorCritic(obs_dim, state_dim, env.num_agents, env.num_actions, config.hidden,
                                               rngs=nnx.Rngs(key))
    return make_trainer(config, env, build, Hooks(critic_input=common.global_state),
                        updates_per_chunk=config.updates_per_chunk, mesh=_data_mesh(config))
