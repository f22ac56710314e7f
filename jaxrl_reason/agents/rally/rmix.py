"""RMIX: role-value heads per agent, mixed by QMIX's monotone network, trained
semi-offline from a prior intent policy's transitions, then online.

``RoleValueNet`` factorises each UAV's utility over the discrete (target, role)
action as ``Q(o, t, r) = V(o, t) + A(o, t, r) - mean_r A(o, t, r)``: a target-value
head and a role-value head per target. The training recipe is QMIX's trainer
(``rl.marl.qmix``) given RMIX's pieces: the role-value network conditioned on the prior's
proposal (``ConditionedRoleNet``), a large-margin auxiliary loss towards the prior's choices
(``large_margin_loss``; DQfD style) and the prior as ``qmix.Prior``: a prefill of prior
transitions, an offline phase, then online epsilon-greedy learning whose exploration partly
follows the prior. ``RMIXConfig`` (a ``QMIXConfig`` plus the recipe's fields; ``rmix_config``
builds one from a QMIX config) holds the settings. Two options aim at a conservative improvement
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
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_reason import envs
from jaxrl_reason.agents.rally.intent import IntentPolicy, act
from jaxrl_reason.envs.swarm import NUM_ROLES
from jaxrl_reason.models.policies import MLP
from jaxrl_reason.rl.marl import qmix


@dataclasses.dataclass(frozen=True)
class RMIXConfig(qmix.QMIXConfig):
    """QMIX's settings plus the semi-offline RMIX recipe (defaults: the recipe of the RALLY study)."""

    eps_start: float = 0.3  # online exploration starts low: the prefill already explored with the prior
    offline_updates: int = 500  # gradient steps on the prior's prefill before online learning
    bc_margin: float = 1.0  # weight of the large-margin loss on prior transitions (offline phase)
    bc_online: float = 0.0  # its weight during the online phase
    margin: float = 0.5  # the loss wants the prior's action ahead of every other by this much
    prior_explore: float = 0.5  # fraction of exploratory actions taken from the prior
    prior_bonus: float = 0.0  # acting only: the proposal's utility + this before the argmax
    td_target: str = "max"  # "max" (Q-learning) or "prior" (SARSA on the prior's next proposal)

    def __post_init__(self):
        super().__post_init__()  # QMIX's checks, and every float field's (check_hyperparameters)
        if self.td_target not in ("max", "prior"):
            raise ValueError(f"RMIXConfig.td_target must be 'max' or 'prior', got {self.td_target!r}")
        if min(self.offline_updates, self.bc_margin, self.bc_online, self.prior_bonus) < 0:
            raise ValueError("RMIXConfig.offline_updates, bc_margin, bc_online and prior_bonus must be >= 0")
        if not 0.0 <= self.prior_explore <= 1.0:
            raise ValueError(f"RMIXConfig.prior_explore must be in [0, 1], got {self.prior_explore}")


def rmix_config(base: qmix.QMIXConfig, **recipe) -> RMIXConfig:
    """The RMIX variant of a QMIX config: ``base``'s budget and network sizes, RMIX's recipe (the
    ``RMIXConfig`` defaults, its ``eps_start`` included) with ``recipe`` overriding fields."""
    shared = {f.name: getattr(base, f.name) for f in dataclasses.fields(qmix.QMIXConfig) if f.name != "eps_start"}
    return RMIXConfig(**{**shared, **recipe})


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


def with_proposal(x: jax.Array, proposal: jax.Array, num_actions: int) -> jax.Array:
    """``x [..., A, D]`` and the prior's proposals ``[..., A]`` -> ``[..., A, D + num_actions]``
    (the proposal one-hot appended): what RMIX's role network sees."""
    return jnp.concatenate([x, jax.nn.one_hot(proposal, num_actions)], -1)


class ConditionedRoleNet(nnx.Module):
    """RMIX's agent network (a ``qmix.AgentNet``): ``RoleValueNet`` on the QMIX agent input with the
    prior's proposal appended, ``(x [..., A, D], proposal [..., A]) -> [..., A, M * 3]``."""

    def __init__(self, in_dim: int, num_actions: int, hidden: int, *, rngs: nnx.Rngs, num_targets: int):
        self.num_actions = num_actions
        self.net = RoleValueNet(in_dim + num_actions, num_actions, hidden, rngs=rngs, num_targets=num_targets)

    def __call__(self, x, proposal=None):
        if proposal is None:
            raise ValueError("RMIX's network is conditioned on the prior's proposal: act through "
                             "rmix.greedy_policy(..., prior) (or qmix.greedy_policy with its qmix.Prior)")
        return self.net(with_proposal(x, proposal, self.num_actions))


def large_margin_loss(config: RMIXConfig) -> qmix.AuxLoss:
    """DQfD's large-margin loss on the prior's transitions (a ``qmix.AuxLoss``): per agent
    ``max_a (Q(a) + margin [a != taken]) - Q(taken)`` (>= 0), averaged over prior-taken steps, weighted
    ``bc_margin`` offline and ``bc_online`` online; logged as ``bc_loss``."""

    def loss(q: jax.Array, q_taken: jax.Array, first: qmix.Step, online: bool):
        margin = jnp.where(jax.nn.one_hot(first.action, q.shape[-1]) > 0, 0.0, config.margin)
        large_margin = jnp.max(q + margin, -1) - q_taken
        w = first.from_prior[:, None]
        bc = jnp.sum(large_margin * w) / jnp.maximum(w.sum() * q.shape[-2], 1.0)
        weight = config.bc_online if online else config.bc_margin
        return weight * bc, {"bc_loss": bc}

    return loss


def same_target(legal: jax.Array, proposal: jax.Array) -> jax.Array:
    """Keep the actions whose target is the proposal's: RMIX then chooses the role."""
    num_actions = legal.shape[-1]
    target = jnp.arange(num_actions) // NUM_ROLES
    return legal & (target == (proposal // NUM_ROLES)[..., None])


def qmix_prior(config: RMIXConfig, env: envs.Environment, prior: IntentPolicy, roles_only: bool = False) -> qmix.Prior:
    """``prior`` as QMIX's behaviour prior with the recipe's settings; ``roles_only``: the prior's
    target intention is kept and RMIX selects the role."""
    if not isinstance(config, RMIXConfig):
        raise TypeError(f"RMIX needs an RMIXConfig (build it with rmix_config(...)), got {type(config).__name__}")
    if getattr(env, "num_targets", None) is None or env.num_actions != env.num_targets * NUM_ROLES:
        raise ValueError(f"RMIX needs a (target x role) action space, e.g. the swarm env; {env.name} has "
                         f"num_actions={env.num_actions}")
    return qmix.Prior(prior_behaviour(prior), offline_updates=config.offline_updates, explore=config.prior_explore,
                      td_on_proposal=config.td_target == "prior", bonus=config.prior_bonus,
                      restrict=same_target if roles_only else None)


def make_chunked(config: RMIXConfig, env: envs.Environment, prior: IntentPolicy,
                 roles_only: bool = False) -> qmix.ChunkedQMIX:
    """RMIX trainer: prefill with ``prior`` transitions, offline phase, then online.
    ``roles_only``: the prior's target intention is kept and RMIX selects the role."""
    as_prior = qmix_prior(config, env, prior, roles_only)
    agent_net = functools.partial(ConditionedRoleNet, num_targets=env.num_targets)
    return qmix.make_chunked(config, env, agent_net, large_margin_loss(config), as_prior)


def greedy_policy(config: RMIXConfig, env: envs.Environment, graphdef, params, prior: IntentPolicy,
                  roles_only: bool = False):
    """``(policy_fn, carry)``: the trained RMIX networks acting greedily on ``prior``'s proposals."""
    return qmix.greedy_policy(graphdef, params, qmix_prior(config, env, prior, roles_only))


def prior_behaviour(prior: IntentPolicy) -> qmix.Behaviour:
    return lambda key, ts: act(prior, key, ts)


__all__ = ["ConditionedRoleNet", "RMIXConfig", "RoleValueNet", "greedy_policy", "large_margin_loss", "make_chunked",
           "prior_behaviour", "qmix_prior", "rmix_config", "same_target", "with_proposal"]
