"""RMIX: role-value heads per agent, mixed by QMIX's monotone network, trained
semi-offline from a prior intent policy's transitions, then online.

``RoleValueNet`` factorises each UAV's utility over the discrete (target, role)
action as ``Q(o, t, r) = V(o, t) + A(o, t, r) - mean_r A(o, t, r)``: a target-value
head and a role-value head per target. The training recipe is QMIX's trainer
(``rl.marl.qmix``) with ``agent_net="role"``, a prefill of prior transitions, an
offline phase with a large-margin loss towards the prior's choices, then online
epsilon-greedy learning whose exploration partly follows the prior
(``rmix_config`` sets these fields). Two options aim at a conservative improvement
over the prior: ``td_target="prior"`` (the TD target uses the prior's next proposal, so
the mixer estimates the prior's value and acting greedily is one step of policy
improvement) and ``prior_bonus`` (keep the prior's choice unless another role's utility
is higher by more than the bonus).

Measured on the 4-UAV swarm (``experiments/rally.py``): RMIX stays far above plain QMIX
but does not beat the scripted prior at 20k-100k env steps. There is room: one step of exact
policy improvement over the prior's roles (``agents.rally.lookahead``, privileged: it reads
the state and simulates) gains +0.5 return (captures 0.42 -> 0.25), from a few role changes
per episode; averaged over all decisions the gains are small, so the learned utilities'
errors decide most deviations: with a small ``prior_bonus`` the greedy policy deviates and
loses return (more captures), with a large one it is the prior. Even a classifier trained on
the lookahead's own choices does not beat the prior (``experiments/rally_lookahead.py``): the
role changes that pay are not predictable from one step's observation, local or global.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_reason import envs
from jaxrl_reason.agents.rally.intent import IntentPolicy, act
from jaxrl_reason.envs.swarm import NUM_ROLES
from jaxrl_reason.models.policies import MLP
from jaxrl_reason.rl.marl import qmix


class RoleValueNet(nnx.Module):
    """``[..., D] -> [..., M * 3]`` utilities with a target head and a role-value head."""

    def __init__(self, in_dim: int, num_actions: int, hidden: int, *, rngs: nnx.Rngs, num_targets=None):
        if num_targets is None or num_actions != num_targets * NUM_ROLES:
            raise ValueError("RoleValueNet needs a (target x role) action space, e.g. the swarm env "
                             f"(num_actions={num_actions}, num_targets={num_targets})")
        self.M = num_targets
        self.torso = MLP([in_dim, hidden, hidden], rngs=rngs)
        self.target_head = nnx.Linear(hidden, num_targets, rngs=rngs)
        self.role_head = nnx.Linear(hidden, num_actions, rngs=rngs)

    def role_values(self, x):
        """``(target_value [..., M], role_advantage [..., M, 3])``."""
        h = jnp.tanh(self.torso(x))
        adv = self.role_head(h).reshape(*x.shape[:-1], self.M, NUM_ROLES)
        return self.target_head(h), adv - adv.mean(-1, keepdims=True)

    def __call__(self, x):
        v, a = self.role_values(x)
        return (v[..., None] + a).reshape(*x.shape[:-1], self.M * NUM_ROLES)


qmix.AGENT_NETS["role"] = RoleValueNet


def rmix_config(base: qmix.QMIXConfig, *, offline_updates: int = 500, bc_margin: float = 1.0,
                prior_explore: float = 0.5, eps_start: float = 0.3) -> qmix.QMIXConfig:
    """The RMIX variant of a QMIX config: same budget, role heads conditioned on the
    prior's (target, role) proposal, semi-offline schedule."""
    return dataclasses.replace(base, agent_net="role", offline_updates=offline_updates, bc_margin=bc_margin,
                               prior_explore=prior_explore, eps_start=eps_start, condition_on_prior=True)


def same_target(legal: jax.Array, proposal: jax.Array) -> jax.Array:
    """Keep the actions whose target is the proposal's: RMIX then chooses the role."""
    num_actions = legal.shape[-1]
    target = jnp.arange(num_actions) // NUM_ROLES
    return legal & (target == (proposal // NUM_ROLES)[..., None])


def make_chunked(config: qmix.QMIXConfig, env: envs.Environment, prior: IntentPolicy,
                 roles_only: bool = False) -> qmix.ChunkedQMIX:
    """RMIX trainer: prefill with ``prior`` transitions, offline phase, then online.
    ``roles_only``: the prior's target intention is kept and RMIX selects the role."""
    if config.agent_net != "role":
        raise ValueError("RMIX uses role-value heads: build the config with rmix_config(...)")
    return qmix.make_chunked(config, env, behaviour=prior_behaviour(prior),
                             restrict=same_target if roles_only else None)


def greedy_policy(config: qmix.QMIXConfig, env: envs.Environment, graphdef, params, prior: IntentPolicy,
                  roles_only: bool = False):
    return qmix.greedy_policy(config, env, graphdef, params, prior_behaviour(prior),
                              same_target if roles_only else None)


def prior_behaviour(prior: IntentPolicy) -> qmix.Behaviour:
    return lambda key, ts: act(prior, key, ts)


__all__ = ["RoleValueNet", "greedy_policy", "make_chunked", "prior_behaviour", "rmix_config", "same_target"]
