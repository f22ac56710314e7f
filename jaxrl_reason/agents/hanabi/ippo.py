"""IPPO with a parameter-shared recurrent policy and legal masking, plus HDR-IPPO: configurations
of ``rl.onpolicy``.

Every agent observes every turn (its GRU carry advances every turn); only the player to move samples
the played action, and only its log-prob enters the policy loss; values are learned for all agents
and turns. Advantages are standardised over the rollout's acting turns (the family's rule; before
the one trainer, IPPO standardised per minibatch).

HDR-IPPO (AH2AC2): ``loss = (1 - lambda) * PPO + lambda * KL(pi_BC || pi)`` on the acting turns,
with ``pi_BC`` a frozen behaviour-cloned policy unrolled alongside (the ``partner`` hook, playing no
seat) and the KL an auxiliary loss (``hdr_lambda = 0`` gives plain IPPO).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_reason.models.policies import GRUActorCritic, masked_logits
from jaxrl_reason.rl.onpolicy import Hooks, OnPolicyConfig, Partner, Targets, Transition, make_trainer, unroll
from jaxrl_reason.rl.ppo_loss import masked_mean

__all__ = ["IPPOConfig", "hdr_kl", "kl_bc", "make_policy", "make_train", "unroll"]


@dataclasses.dataclass(frozen=True)
class IPPOConfig(OnPolicyConfig):
    """``OnPolicyConfig`` (defaults: 32 steps, 2 epochs x 2 minibatches, lr 5e-4 constant) plus the
    budget in updates, the GRU width and HDR's lambda."""

    num_steps: int = 32
    num_updates: int = 100
    update_epochs: int = 2
    num_minibatches: int = 2
    lr: float = 5e-4
    anneal_lr: bool = False
    hidden: int = 128
    hdr_lambda: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        for name in ("num_updates", "hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"IPPOConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.hdr_lambda <= 1.0:
            raise ValueError(f"hdr_lambda must be in [0, 1], got {self.hdr_lambda}")


def make_policy(env, hidden: int, seed: int | jax.Array = 0) -> GRUActorCritic:
    """The GRU actor-critic IPPO and BC share (``seed``: an int or a PRNG key)."""
    return GRUActorCritic(env.obs_shape[0], env.num_actions, hidden=hidden, rngs=nnx.Rngs(seed))


def kl_bc(bc_logits, logits, legal):
    """``KL(pi_BC || pi)`` over the legal actions, ``[...]``."""
    lb = jax.nn.log_softmax(masked_logits(bc_logits, legal), -1)
    lp = jax.nn.log_softmax(masked_logits(logits, legal), -1)
    return jnp.sum(jnp.where(legal, jnp.exp(lb) * (lb - lp), 0.0), -1)


def hdr_kl(logits, values, traj: Transition, tg: Targets):
    """Auxiliary loss: ``KL(pi_BC || pi)`` (BC = the partner's logits) averaged over acting turns."""
    return masked_mean(kl_bc(traj.partner_logits, logits, traj.legal), tg.mask), {}


def make_train(config: IPPOConfig, env, bc: tuple[Any, Any] | None = None, init_params=None):
    """Returns ``(graphdef, train)`` with ``train(key) -> (params, metrics [num_updates])``.

    ``bc = (graphdef, params)``: the frozen BC policy for HDR (same ``hidden``);
    ``init_params``: start from these parameters (e.g. the BC policy) instead of a fresh init.
    ``metrics["episode_score"]``: mean score of the games finished in each update (NaN if none).
    """
    if config.hdr_lambda > 0 and bc is None:
        raise ValueError("hdr_lambda > 0 needs a behaviour-cloned policy: make_train(config, env, bc=(graphdef, params))")
    use_bc = bc is not None and config.hdr_lambda > 0
    hooks = Hooks(partner=Partner(*bc) if use_bc else None,
                  aux_losses=(("kl_bc", config.hdr_lambda, hdr_kl),) if use_bc else (),
                  init_params=init_params)
    trainer = make_trainer(config, env, lambda key: make_policy(env, config.hidden, key), hooks,
                           updates_per_chunk=config.num_updates)

    def train(key):
        state, m = trainer.update(trainer.init(key))
        m["episode_score"] = jnp.where(m["episodes"] > 0, m["episode_return_agent0"], jnp.nan)
        return state.params, m

    return trainer.graphdef, train
