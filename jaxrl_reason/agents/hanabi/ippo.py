"""IPPO with a parameter-shared recurrent policy and legal masking, plus HDR-IPPO.

PureJaxRL shape: ``make_train(config, env, bc=None) -> train(key)``, whole loop
jitted. Every agent observes every turn (its GRU carry advances every turn);
only the player to move samples the played action, and only its log-prob enters
the policy loss (``acted`` mask); values are learned for all agents and turns.

HDR-IPPO (AH2AC2): ``loss = (1 - lambda) * PPO + lambda * KL(pi_BC || pi)`` on the
acting turns, with ``pi_BC`` a frozen behaviour-cloned policy unrolled alongside
(``hdr_lambda = 0`` gives plain IPPO). Written here rather than on
``jaxrl_reason.rl.ppo`` because that trainer has no hook for a second, frozen
recurrent policy in the loss; GAE, the clipped loss and the policies are shared.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxrl_reason import envs
from jaxrl_reason.models.policies import GRUActorCritic, masked_logits
from jaxrl_reason.rl.gae import compute_gae
from jaxrl_reason.rl.ppo_loss import masked_mean, ppo_loss
from jaxrl_reason.utils.guard import guard_optimizer
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class IPPOConfig:
    num_envs: int = 64
    num_steps: int = 32
    num_updates: int = 100
    update_epochs: int = 2
    num_minibatches: int = 2
    lr: float = 5e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    hidden: int = 128
    hdr_lambda: float = 0.0

    def __post_init__(self):
        check_hyperparameters(self)
        for name in ("num_envs", "num_steps", "num_updates", "update_epochs", "num_minibatches", "hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"IPPOConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_envs % self.num_minibatches:
            raise ValueError(f"num_envs={self.num_envs} must be divisible by num_minibatches={self.num_minibatches}")
        if not 0.0 <= self.hdr_lambda <= 1.0:
            raise ValueError(f"hdr_lambda must be in [0, 1], got {self.hdr_lambda}")


def make_policy(env, hidden: int, seed: int = 0) -> GRUActorCritic:
    return GRUActorCritic(env.obs_shape[0], env.num_actions, hidden=hidden, rngs=nnx.Rngs(seed))


def unroll(graphdef, params, carry, obs, first):
    """Run a policy over time: ``obs [T, *B, F]``, ``first [T, *B]`` -> logits, values."""
    policy = nnx.merge(graphdef, params)

    def body(c, x):
        o, f = x
        c, logits, value = policy(c, o, f)
        return c, (logits, value)

    _, (logits, values) = jax.lax.scan(body, carry, (obs, first))
    return logits, values


def kl_bc(bc_logits, logits, legal):
    """``KL(pi_BC || pi)`` over the legal actions, ``[...]``."""
    lb = jax.nn.log_softmax(masked_logits(bc_logits, legal), -1)
    lp = jax.nn.log_softmax(masked_logits(logits, legal), -1)
    return jnp.sum(jnp.where(legal, jnp.exp(lb) * (lb - lp), 0.0), -1)


def make_train(config: IPPOConfig, env, bc: tuple[Any, Any] | None = None, init_params=None):
    """Returns ``(graphdef, train)`` with ``train(key) -> (params, metrics [num_updates])``.

    ``bc = (graphdef, params)``: the frozen BC policy for HDR (same ``hidden``);
    ``init_params``: start from these parameters (e.g. the BC policy) instead of a fresh init.
    """
    if config.hdr_lambda > 0 and bc is None:
        raise ValueError("hdr_lambda > 0 needs a behaviour-cloned policy: make_train(config, env, bc=(graphdef, params))")
    wrapped = envs.EpisodeStats(envs.AutoReset(env))
    e, n, t = config.num_envs, env.num_agents, config.num_steps
    graphdef, fresh = nnx.split(make_policy(env, config.hidden))
    init_params = fresh if init_params is None else init_params
    tx = guard_optimizer(optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(config.lr)))
    lam = config.hdr_lambda
    use_bc = bc is not None and lam > 0

    def policy_step(gd, params, carry, obs, first):
        return nnx.merge(gd, params)(carry, obs, jnp.broadcast_to(first[:, None], obs.shape[:2]))

    def train(key):
        key, k_reset = jax.random.split(key)
        opt_state = tx.init(init_params)
        state, ts = jax.vmap(wrapped.reset)(jax.random.split(k_reset, e))
        carry = jnp.zeros((e, n, config.hidden))
        bc_carry = nnx.merge(*bc).initial_carry((e, n)) if use_bc else jnp.zeros(())
        first = jnp.ones((e,), bool)

        def rollout_step(c, k):
            state, ts, carry, bc_carry, first, params = c
            k_act, k_step = jax.random.split(k)
            carry, logits, value = policy_step(graphdef, params, carry, ts.obs, first)
            logits = masked_logits(logits, ts.legal_action_mask)
            acts = jax.random.categorical(k_act, logits)  # [E, N]
            logp = jnp.take_along_axis(jax.nn.log_softmax(logits), acts[..., None], -1)[..., 0]
            if use_bc:
                bc_carry, bc_logits, _ = policy_step(bc[0], bc[1], bc_carry, ts.obs, first)
            else:
                bc_logits = jnp.zeros(())
            action = jnp.take_along_axis(acts, ts.current_player[:, None], 1)[:, 0]
            acted = jnp.arange(n)[None, :] == ts.current_player[:, None]
            nstate, nts = jax.vmap(wrapped.step)(jax.random.split(k_step, e), state, action)
            tr = dict(obs=ts.obs, legal=ts.legal_action_mask, first=first, acts=acts, logp=logp, value=value,
                      acted=acted, reward=nts.reward, done=nts.done, bc_logits=bc_logits,
                      ep_ret=nts.info["returned_episode_return"][:, 0], ep_done=nts.info["returned_episode"])
            return (nstate, nts, carry, bc_carry, nts.done, params), tr

        def update(c, k):
            state, ts, carry, bc_carry, first, params, opt_state = c
            carry0 = carry
            k_roll, k_perm = jax.random.split(k)
            (state, ts, carry, bc_carry, first, _), tr = jax.lax.scan(
                rollout_step, (state, ts, carry, bc_carry, first, params), jax.random.split(k_roll, t))
            _, _, last_value = policy_step(graphdef, params, carry, ts.obs, first)
            dones = jnp.broadcast_to(tr["done"][..., None], tr["reward"].shape)
            adv, ret = compute_gae(tr["reward"], tr["value"], dones, last_value, config.gamma, config.gae_lambda)

            def loss_fn(p, idx):
                sel = lambda x: x[:, idx]
                logits, values = unroll(graphdef, p, carry0[idx], sel(tr["obs"]),
                                        jnp.broadcast_to(sel(tr["first"])[..., None], sel(tr["acted"]).shape))
                logits = masked_logits(logits, sel(tr["legal"]))
                logp_all = jax.nn.log_softmax(logits)
                logp = jnp.take_along_axis(logp_all, sel(tr["acts"])[..., None], -1)[..., 0]
                entropy = -jnp.sum(jnp.where(sel(tr["legal"]), jnp.exp(logp_all) * logp_all, 0.0), -1)
                a = sel(adv)
                mask = sel(tr["acted"])
                a = (a - masked_mean(a, mask)) / (jnp.sqrt(masked_mean(jnp.square(a - masked_mean(a, mask)), mask)) + 1e-8)
                loss, m = ppo_loss(logp, sel(tr["logp"]), a, values, sel(tr["value"]), sel(ret), entropy,
                                   clip_eps=config.clip_eps, vf_coef=config.vf_coef, ent_coef=config.ent_coef,
                                   mask=mask, value_mask=jnp.ones_like(mask))
                if use_bc:
                    kl = masked_mean(kl_bc(sel(tr["bc_logits"]), logits, sel(tr["legal"])), mask)
                    loss = (1.0 - lam) * loss + lam * kl
                    m = {**m, "kl_bc": kl}
                return loss, m

            def epoch(c, k):
                params, opt_state = c
                perm = jax.random.permutation(k, e).reshape(config.num_minibatches, -1)

                def mb(c, idx):
                    params, opt_state = c
                    (loss, m), g = jax.value_and_grad(loss_fn, has_aux=True)(params, idx)
                    upd, opt_state = tx.update(g, opt_state, params)
                    return (optax.apply_updates(params, upd), opt_state), {**m, "loss": loss}

                return jax.lax.scan(mb, (params, opt_state), perm)

            (params, opt_state), m = jax.lax.scan(epoch, (params, opt_state), jax.random.split(k_perm, config.update_epochs))
            m = jax.tree.map(jnp.mean, m)
            n_done = tr["ep_done"].sum()
            m["episode_score"] = jnp.where(n_done > 0, (tr["ep_ret"] * tr["ep_done"]).sum() / jnp.maximum(n_done, 1), jnp.nan)
            return (state, ts, carry, bc_carry, first, params, opt_state), m

        c = (state, ts, carry, bc_carry, first, init_params, opt_state)
        c, metrics = jax.lax.scan(update, c, jax.random.split(key, config.num_updates))
        return c[5], metrics

    return graphdef, train
