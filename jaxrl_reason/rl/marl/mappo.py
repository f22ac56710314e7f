"""MAPPO: PPO with a parameter-shared actor on local observations and a centralised
critic on the global state (plus a one-hot agent id), PureJaxRL shape.

Hyperparameters are ``rl.ppo.PPOConfig`` (``policy="mlp"`` only); the rollout, GAE and
clipped loss are the same pieces as IPPO (``rl.ppo``): only the critic's input differs,
which is why this lives beside it rather than inside the lead-owned ``ppo.py``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from jaxrl_reason import envs
from jaxrl_reason.models.policies import MLP, masked_logits
from jaxrl_reason.rl.gae import compute_gae
from jaxrl_reason.rl.marl import common
from jaxrl_reason.rl.ppo import ChunkedTrain, PPOConfig
from jaxrl_reason.rl.ppo_loss import ppo_loss
from jaxrl_reason.utils.guard import guard_optimizer


class CentralisedActorCritic(nnx.Module):
    """Actor ``[..., A, D] -> logits [..., A, N]``; critic ``(s [..., S]) -> values [..., A]``."""

    def __init__(self, obs_dim: int, state_dim: int, num_agents: int, num_actions: int, hidden: int,
                 *, rngs: nnx.Rngs):
        self.actor = MLP([obs_dim, hidden, hidden, num_actions], rngs=rngs, final_scale=0.01)
        self.critic = MLP([state_dim + num_agents, hidden, hidden, 1], rngs=rngs)
        self.num_agents = num_agents

    def values(self, s):
        A = self.num_agents
        x = jnp.concatenate([jnp.broadcast_to(s[..., None, :], (*s.shape[:-1], A, s.shape[-1])),
                             jnp.broadcast_to(jnp.eye(A), (*s.shape[:-1], A, A))], -1)
        return self.critic(x)[..., 0]


@struct.dataclass
class MAPPOState:
    params: Any
    opt_state: Any
    env_state: Any
    timestep: envs.TimeStep
    key: jax.Array
    update: jax.Array


class Traj(NamedTuple):
    obs: jax.Array  # [E, A, D]
    gstate: jax.Array  # [E, S]
    legal: jax.Array
    action: jax.Array
    logp: jax.Array
    value: jax.Array
    reward: jax.Array
    done: jax.Array
    returned: jax.Array
    episode_return: jax.Array
    coverage: jax.Array


def make_chunked(config: PPOConfig, env: envs.Environment) -> ChunkedTrain:
    """``init(key)`` and ``update_chunk(state) -> (state, metrics [updates_per_chunk])``."""
    common.check_discrete_simultaneous(env, "MAPPO")
    if config.policy != "mlp":
        raise ValueError("MAPPO here supports policy='mlp' only")
    wrapped = envs.EpisodeStats(envs.AutoReset(env))
    E, A = config.num_envs, env.num_agents
    obs_dim, state_dim = math.prod(env.obs_shape), common.global_state_dim(env)
    build = lambda key: CentralisedActorCritic(obs_dim, state_dim, A, env.num_actions, config.hidden,
                                               rngs=nnx.Rngs(key))
    graphdef, _ = nnx.split(build(jax.random.key(0)))
    lr = (optax.linear_schedule(config.lr, 0.0, config.num_updates * config.update_epochs * config.num_minibatches)
          if config.anneal_lr else config.lr)
    tx = guard_optimizer(optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(lr, eps=1e-5)))

    def apply(params, obs, gstate, legal):
        net = nnx.merge(graphdef, params)
        return masked_logits(net.actor(obs), legal), net.values(gstate)

    def init(key):
        k_p, k_e, k_r = jax.random.split(key, 3)
        params = nnx.state(build(k_p))
        env_state, ts = jax.vmap(wrapped.reset)(jax.random.split(k_e, E))
        return MAPPOState(params, tx.init(params), env_state, ts, k_r, jnp.int32(0))

    def env_step(carry, key):
        params, env_state, ts = carry
        k_act, k_env = jax.random.split(key)
        obs, gstate, legal = common.flat_obs(ts), common.global_state(ts), ts.legal_action_mask
        logits, value = apply(params, obs, gstate, legal)
        action = jax.random.categorical(k_act, logits).astype(jnp.int32)
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[..., None], -1)[..., 0]
        env_state, nts = jax.vmap(wrapped.step)(jax.random.split(k_env, E), env_state, action)
        info = nts.info
        tr = Traj(obs, gstate, legal, action, logp, value, nts.reward,
                  jnp.broadcast_to(nts.done[:, None], (E, A)), info["returned_episode"],
                  info["returned_episode_return"].mean(-1), info.get("coverage", jnp.zeros((E,))))
        return (params, env_state, nts), tr

    def loss_fn(params, traj: Traj, adv, ret):
        logits, values = apply(params, traj.obs, traj.gstate, traj.legal)
        log_probs = jax.nn.log_softmax(logits)
        logp = jnp.take_along_axis(log_probs, traj.action[..., None], -1)[..., 0]
        entropy = -jnp.sum(jnp.where(traj.legal, jnp.exp(log_probs) * log_probs, 0.0), -1)
        return ppo_loss(logp, traj.logp, adv, values, traj.value, ret, entropy, clip_eps=config.clip_eps,
                        vf_coef=config.vf_coef, ent_coef=config.ent_coef)

    grad_fn = jax.grad(loss_fn, has_aux=True)

    def update(state: MAPPOState, _):
        key, k_roll, k_perm = jax.random.split(state.key, 3)
        (params, env_state, ts), traj = jax.lax.scan(
            env_step, (state.params, state.env_state, state.timestep), jax.random.split(k_roll, config.num_steps))
        _, last_value = apply(params, common.flat_obs(ts), common.global_state(ts), ts.legal_action_mask)
        adv, ret = compute_gae(traj.reward, traj.value, traj.done, last_value, config.gamma, config.gae_lambda)
        if config.normalize_advantages:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)

        def epoch(carry, key):
            perm = jax.random.permutation(key, E).reshape(config.num_minibatches, -1)

            def minibatch(carry, idx):
                params, opt_state = carry
                pick = lambda x: jnp.take(x, idx, axis=1)
                grads, m = grad_fn(params, jax.tree.map(pick, traj), pick(adv), pick(ret))
                updates, opt_state = tx.update(grads, opt_state, params)
                return (optax.apply_updates(params, updates), opt_state), m

            return jax.lax.scan(minibatch, carry, perm)

        (params, opt_state), m = jax.lax.scan(epoch, (params, state.opt_state),
                                              jax.random.split(k_perm, config.update_epochs))
        finished = traj.returned.astype(jnp.float32)
        n = jnp.maximum(finished.sum(), 1.0)
        metrics = {k: v.mean() for k, v in m.items()}
        metrics.update(episode_return=(traj.episode_return * finished).sum() / n, episodes=finished.sum(),
                       coverage=traj.coverage.mean(), env_steps=(state.update + 1) * E * config.num_steps)
        return MAPPOState(params, opt_state, env_state, ts, key, state.update + 1), metrics

    def update_chunk(state):
        return jax.lax.scan(update, state, None, length=config.updates_per_chunk)

    return ChunkedTrain(init, update_chunk, graphdef)


def make_train(config: PPOConfig, env: envs.Environment):
    """``train(key) -> {"state", "metrics"}`` (metrics ``[num_updates]``)."""
    chunked = make_chunked(dataclasses.replace(config, updates_per_chunk=config.num_updates), env)

    def train(key):
        state, metrics = chunked.update_chunk(chunked.init(key))
        return {"state": state, "metrics": metrics}

    return train


def evaluation_policy(env: envs.Environment, graphdef, params, greedy: bool = True):
    """``(policy_fn, carry)`` for ``rl.evaluate.evaluate`` (decentralised: the actor only)."""

    def policy_fn(carry, key, ts):
        logits = masked_logits(nnx.merge(graphdef, params).actor(common.flat_obs(ts)), ts.legal_action_mask)
        a = jnp.argmax(logits, -1) if greedy else jax.random.categorical(key, logits)
        return carry, a.astype(jnp.int32)

    return policy_fn, jnp.zeros(())
