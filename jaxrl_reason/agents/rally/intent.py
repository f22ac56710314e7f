"""The intent-policy interface of RALLY and the scripted rule-based prior.

An intent policy picks a discrete ``swarm`` action, i.e. (target, role), in two stages:

1. ``propose(key, obs) -> [A]`` an initial intention per UAV from its local observation;
2. ``revise(key, obs, proposals, neighbors) -> [A]`` a consensus step: each UAV sees the
   proposals of its neighbours (``neighbors`` ``[A, k]`` indices, -1 for none; the
   messages it would receive within the communication radius) and revises its own.

``act(policy, key, ts)`` runs both stages on one environment's TimeStep, so any intent
policy is a ``qmix.Behaviour`` / ``rl.evaluate`` policy. ``RulePrior`` is the scripted
prior; ``agents.rally.llm.LLMIntentPolicy`` is the language-model policy with the same
interface.
"""

from __future__ import annotations

from typing import Protocol

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_reason.envs.swarm import COMMANDER, COORDINATOR, EXECUTOR, NUM_ROLES, Swarm


class IntentPolicy(Protocol):
    def propose(self, key: jax.Array, obs: jax.Array) -> jax.Array: ...

    def revise(self, key: jax.Array, obs: jax.Array, proposals: jax.Array, neighbors: jax.Array) -> jax.Array: ...


def act(policy: IntentPolicy, key: jax.Array, ts) -> jax.Array:
    """Both stages for ONE environment: ``[A]`` int32 actions."""
    k1, k2 = jax.random.split(key)
    proposals = policy.propose(k1, ts.obs)
    return policy.revise(k2, ts.obs, proposals, ts.info["neighbors"]).astype(jnp.int32)


@struct.dataclass
class LocalView:
    """Decoded local observation of every UAV (leading dim A)."""

    target_rel: jax.Array  # [A, M, d]
    target_dist: jax.Array  # [A, M]
    urgency: jax.Array  # [A, M] (0 if unseen)
    served: jax.Array  # [A, M]
    coverage: jax.Array  # [A, M]
    target_visible: jax.Array  # [A, M] bool
    threat_dist: jax.Array  # [A] distance to the nearest visible pursuer (inf if none)
    active: jax.Array  # [A] bool


def decode(env: Swarm, obs: jax.Array) -> LocalView:
    """Split observations ``[A, obs_dim]`` into named parts (see ``Swarm`` docstring)."""
    c = env.config
    A, d, M, K = obs.shape[0], c.dim, c.num_targets, c.num_adversaries
    tg = obs[:, env.obs_slices["targets"]].reshape(A, M, d + 4)
    rel = tg[..., :d]
    vis = tg[..., -1] > 0.5
    dist = jnp.where(vis, jnp.linalg.norm(rel, axis=-1), jnp.inf)
    if K:
        adv = obs[:, env.obs_slices["adversaries"]].reshape(A, K, 2 * d + 1)
        adist = jnp.where(adv[..., -1] > 0.5, jnp.linalg.norm(adv[..., :d], axis=-1), jnp.inf).min(-1)
    else:
        adist = jnp.full((A,), jnp.inf)
    return LocalView(rel, dist, tg[..., d], tg[..., d + 1], tg[..., d + 2], vis, adist,
                     obs[:, 2 * d] > 0.5)


@struct.dataclass
class RulePrior:
    """Scripted prior: go for the most urgent nearby unserved target; Executor by default,
    Commander (evasive) when a pursuer is within ``threat_radius``; consensus: defer to
    neighbours with a lower index that chose the same target (Coordinator, formation slot),
    and move to the second-best target when ``crowd`` of them already go there."""

    env: Swarm = struct.field(pytree_node=False)
    threat_radius: float = struct.field(pytree_node=False, default=0.3)
    crowd: int = struct.field(pytree_node=False, default=2)

    def _scores(self, v: LocalView) -> jax.Array:
        A, M = v.urgency.shape
        score = jnp.where(v.target_visible & (v.served < 0.5), v.urgency / (v.target_dist + 0.2), 0.0)
        fallback = jax.nn.one_hot(jnp.arange(A) % M, M) * 1e-3  # unseen: spread by index
        return score + fallback

    def _role(self, v: LocalView, default):
        return jnp.where(v.threat_dist < self.threat_radius, COMMANDER, default)

    def propose(self, key, obs):
        v = decode(self.env, obs)
        target = jnp.argmax(self._scores(v), -1)
        return target * NUM_ROLES + self._role(v, EXECUTOR)

    def revise(self, key, obs, proposals, neighbors):
        v = decode(self.env, obs)
        A = obs.shape[0]
        scores = self._scores(v)
        mine = proposals // NUM_ROLES
        nb_target = jnp.where(neighbors >= 0, proposals[jnp.maximum(neighbors, 0)] // NUM_ROLES, -1)
        ahead = (nb_target == mine[:, None]) & (neighbors >= 0) & (neighbors < jnp.arange(A)[:, None])
        n_ahead = ahead.sum(-1)
        second = jnp.argmax(jnp.where(jax.nn.one_hot(mine, scores.shape[-1]) > 0, -1.0, scores), -1)
        target = jnp.where(n_ahead >= self.crowd, second, mine)
        role = self._role(v, jnp.where((n_ahead >= 1) & (target == mine), COORDINATOR, EXECUTOR))
        return target * NUM_ROLES + role
