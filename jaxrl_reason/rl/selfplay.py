"""PPO self-play for two-player turn-based games: one shared policy plays both seats.

Each step the player to move acts from its own observation (``arena.mover_view``); only the
mover's log-probability enters the loss. Advantages (``advantage``):

- ``"rae"``: Role-conditioned Advantage Estimation (``rl/rae.py``): ``A = R_role - b[role]`` with a
  per-role EMA baseline (alpha 0.05) read before the update; every turn of a role gets its
  episode's advantage (SPIRAL).
- ``"none"``: plain self-play, ``A = R_role`` (no baseline, SPIRAL's ablation).
- ``"critic"``: ``A = R - V(obs)`` with the learned value head (Monte Carlo, lambda = 1).

Steps of episodes that do not finish inside the rollout are masked out. Rewards are assumed to
come at the end of the episode (true for the games here), so ``R`` is the episode return.
``make_selfplay(config) -> SelfPlay`` with ``init(key)``, jitted ``update(state)`` and
``train(key)`` (all updates in one ``lax.scan``; vmappable over seeds).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from jaxrl_reason import envs
from jaxrl_reason.envs.games.arena import mover_view
from jaxrl_reason.models.policies import make_policy, masked_logits
from jaxrl_reason.rl.ppo_loss import ppo_loss
from jaxrl_reason.rl.rae import init_baseline, rae_advantages
from jaxrl_reason.utils.guard import guard_optimizer
from jaxrl_reason.utils.validation import check_hyperparameters

ADVANTAGES = ("rae", "none", "critic")


@dataclasses.dataclass(frozen=True)
class SelfPlayConfig:
    env: str = "kuhn_poker"
    num_envs: int = 256
    rollout_length: int = 16
    num_updates: int = 200
    advantage: str = "rae"
    hidden: tuple[int, ...] = (64, 64)
    learning_rate: float = 3e-3
    anneal_lr: bool = True
    update_epochs: int = 4
    num_minibatches: int = 4
    clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    rae_alpha: float = 0.05
    max_grad_norm: float = 0.5
    seed: int = 0

    def __post_init__(self):
        check_hyperparameters(self)
        if self.advantage not in ADVANTAGES:
            raise ValueError(f"advantage must be one of {ADVANTAGES}, got {self.advantage!r}")
        for f in ("num_envs", "rollout_length", "num_updates", "update_epochs", "num_minibatches"):
            if getattr(self, f) < 1:
                raise ValueError(f"SelfPlayConfig.{f} must be >= 1, got {getattr(self, f)}")
        if (self.num_envs * self.rollout_length) % self.num_minibatches:
            raise ValueError("num_envs * rollout_length must be divisible by num_minibatches")
        if not 0.0 < self.rae_alpha <= 1.0:
            raise ValueError(f"rae_alpha must be in (0, 1], got {self.rae_alpha}")


@struct.dataclass
class SelfPlayState:
    params: object
    opt_state: object
    env_state: object
    ts: object
    episode_return: jax.Array  # [num_envs, 2] running returns
    baseline: jax.Array  # [1, 2] RAE baselines (one game, two roles)
    key: jax.Array
    update: jax.Array


class SelfPlay:
    def __init__(self, config: SelfPlayConfig, env=None, metrics_fn: Callable | None = None):
        """``metrics_fn(policy_fn) -> dict`` adds metrics each update; ``policy_fn(params, obs, mask)``
        returns action probabilities (e.g. Kuhn exploitability)."""
        self.config = c = config
        self.env = env if env is not None else envs.make(c.env)
        if self.env.num_agents != 2 or not self.env.turn_based:
            raise ValueError("self-play needs a two-player turn-based environment")
        self.auto = envs.AutoReset(self.env)
        self.obs_dim = int(self.env.obs_shape[0])
        model = make_policy("mlp", self.obs_dim, self.env.num_actions, rngs=nnx.Rngs(0), hidden=c.hidden)
        self.graphdef, _ = nnx.split(model)
        steps = c.num_updates * c.update_epochs * c.num_minibatches
        lr = optax.linear_schedule(c.learning_rate, 0.0, steps) if c.anneal_lr else c.learning_rate
        self.optimizer = guard_optimizer(optax.chain(optax.clip_by_global_norm(c.max_grad_norm), optax.adam(lr)))
        self.metrics_fn = metrics_fn
        self.update = jax.jit(self._update)

    def apply(self, params, obs, mask):
        """``(masked logits, value)`` of the shared policy."""
        _, logits, value = nnx.merge(self.graphdef, params)(None, obs, None)
        return masked_logits(logits, mask), value

    def probs(self, params, obs, mask):
        return jax.nn.softmax(self.apply(params, obs, mask)[0], -1)

    def init(self, key) -> SelfPlayState:
        k_net, k_env, key = jax.random.split(key, 3)
        model = make_policy("mlp", self.obs_dim, self.env.num_actions, rngs=nnx.Rngs(k_net), hidden=self.config.hidden)
        params = nnx.state(model)
        env_state, ts = jax.vmap(self.auto.reset)(jax.random.split(k_env, self.config.num_envs))
        zeros = jnp.zeros((self.config.num_envs, 2), jnp.float32)
        return SelfPlayState(params, self.optimizer.init(params), env_state, ts, zeros, init_baseline(1, 2),
                             key, jnp.int32(0))

    def policy_player(self, params, greedy: bool = False):
        """Batched player for ``arena.play``."""

        def act(key, state, ts):
            obs, mask = mover_view(ts)
            logits, _ = self.apply(params, obs, mask)
            a = jnp.argmax(logits, -1) if greedy else jax.random.categorical(key, logits)
            return a.astype(jnp.int32)

        return act

    def _rollout(self, s: SelfPlayState, key):
        c = self.config

        def step(carry, key):
            env_state, ts, ep_ret = carry
            k_act, k_env = jax.random.split(key)
            obs, mask = mover_view(ts)
            logits, value = self.apply(s.params, obs, mask)
            action = jax.random.categorical(k_act, logits)
            logp = jax.nn.log_softmax(logits)[jnp.arange(c.num_envs), action]
            env_state, nts = jax.vmap(self.auto.step)(jax.random.split(k_env, c.num_envs), env_state, action)
            ep_ret = ep_ret + nts.reward
            rec = dict(obs=obs, mask=mask, action=action, logp=logp, value=value, mover=ts.current_player,
                       done=nts.done, ep_ret=ep_ret)
            return (env_state, nts, jnp.where(nts.done[:, None], 0.0, ep_ret)), rec

        carry, traj = jax.lax.scan(step, (s.env_state, s.ts, s.episode_return), jax.random.split(key, c.rollout_length))
        return carry, traj

    def _advantages(self, traj, baseline):
        c = self.config
        done = traj["done"]
        rows = traj["ep_ret"].reshape(-1, 2)  # episode returns at done events, (t, b) order
        adv_rows, new_baseline = rae_advantages(baseline, rows, valid=done.reshape(-1), alpha=c.rae_alpha)
        b_read = (rows - adv_rows).reshape(done.shape + (2,))

        def backward(carry, x):  # spread each episode's (return, baseline) back over its steps
            ret, base, seen = carry
            d, r, b = x
            ret = jnp.where(d[:, None], r, ret)
            base = jnp.where(d[:, None], b, base)
            seen = d | seen
            return (ret, base, seen), (ret, base, seen)

        b = done.shape[1]
        init = (jnp.zeros((b, 2)), jnp.zeros((b, 2)), jnp.zeros((b,), bool))
        _, (ret, base, valid) = jax.lax.scan(backward, init, (done, traj["ep_ret"], b_read), reverse=True)
        pick = lambda x: jnp.where(traj["mover"] == 0, x[..., 0], x[..., 1])
        R = pick(ret)
        if c.advantage == "rae":
            adv = R - pick(base)
        elif c.advantage == "none":
            adv = R
        else:
            adv = R - traj["value"]
        if c.advantage != "rae":
            new_baseline = baseline
        return adv, R, valid, new_baseline

    def _update(self, s: SelfPlayState):
        c = self.config
        key, k_roll, k_perm = jax.random.split(s.key, 3)
        (env_state, ts, ep_ret), traj = self._rollout(s, k_roll)
        adv, R, valid, baseline = self._advantages(traj, s.baseline)
        flat = lambda x: x.reshape((-1,) + x.shape[2:])
        data = {k: flat(traj[k]) for k in ("obs", "mask", "action", "logp", "value")}
        data.update(adv=flat(adv), ret=flat(R), valid=flat(valid))
        n = c.num_envs * c.rollout_length

        def loss_fn(params, mb):
            logits, value = self.apply(params, mb["obs"], mb["mask"])
            logp_all = jax.nn.log_softmax(logits)
            logp = jnp.take_along_axis(logp_all, mb["action"][:, None], 1)[:, 0]
            p = jnp.exp(logp_all)
            entropy = -(jnp.where(mb["mask"], p * logp_all, 0.0)).sum(-1)
            return ppo_loss(logp, mb["logp"], mb["adv"], value, mb["value"], mb["ret"], entropy,
                            clip_eps=c.clip_eps, vf_coef=c.vf_coef, ent_coef=c.ent_coef, mask=mb["valid"])

        def epoch(carry, key):
            params, opt_state = carry
            perm = jax.random.permutation(key, n).reshape(c.num_minibatches, -1)

            def minibatch(carry, idx):
                params, opt_state = carry
                mb = jax.tree.map(lambda x: x[idx], data)
                (loss, m), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, mb)
                updates, opt_state = self.optimizer.update(grads, opt_state, params)
                return (optax.apply_updates(params, updates), opt_state), m

            return jax.lax.scan(minibatch, (params, opt_state), perm)

        (params, opt_state), m = jax.lax.scan(epoch, (s.params, s.opt_state), jax.random.split(k_perm, c.update_epochs))
        metrics = jax.tree.map(jnp.mean, m)
        done = traj["done"]
        n_ep = jnp.maximum(done.sum(), 1)
        metrics.update(
            episodes=done.sum(),
            return_p0=(traj["ep_ret"][..., 0] * done).sum() / n_ep,
            baseline_p0=baseline[0, 0], baseline_p1=baseline[0, 1],
        )
        if self.metrics_fn is not None:
            metrics.update(self.metrics_fn(lambda obs, mask: self.probs(params, obs, mask)))
        new = SelfPlayState(params, opt_state, env_state, ts, ep_ret, baseline, key, s.update + 1)
        return new, metrics

    def train(self, key):
        """All ``num_updates`` updates in one scan: ``(final state, metrics [num_updates])``."""
        return jax.lax.scan(lambda s, _: self._update(s), self.init(key), None, self.config.num_updates)


def kuhn_policy_table(policy_fn) -> jax.Array:
    """``[3, 4]`` bet/call probabilities of ``policy_fn(obs, mask) -> probs`` at the 12 infosets."""
    from jaxrl_reason.envs.games import opponents as O

    obs, mask = O.kuhn_infoset_obs()
    probs = policy_fn(obs.reshape(12, -1), mask.reshape(12, -1)).reshape(3, 4, -1)
    return O.kuhn_table_from_probs(probs)


def kuhn_exploitability_metric(policy_fn) -> dict:
    """``metrics_fn`` for Kuhn Poker: exact exploitability of the current policy and its
    ``[3, 4]`` table (``policy_table``; feed the stacked tables to
    ``opponents.kuhn_average_exploitability_curve`` for the time-averaged policy)."""
    from jaxrl_reason.envs.games import opponents as O

    table = kuhn_policy_table(policy_fn)
    return {"exploitability": O.kuhn_exploitability(table), "policy_table": table}
