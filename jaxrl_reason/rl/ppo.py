"""PPO in the PureJaxRL shape: ``make_train(config, env) -> train(key)``.

One parameter-shared policy acts for every agent of any environment on the
protocol (discrete actions):

- single-agent and simultaneous-move environments: every agent acts each step;
- turn-based multi-agent games: every agent observes every step, but only the
  current player's action is played and only its log-probability enters the
  policy loss (``acted`` mask); values are learned for every agent and step.

Minibatches split the batch of environments and keep whole time sequences, so
feed-forward ("mlp") and recurrent ("gru") policies share one code path.
The whole loop is jitted and vmappable over seeds; ``make_chunked`` exposes the
same update as ``init`` + ``update_chunk`` so a driver can log and checkpoint
between chunks (the result is bit-identical to ``train``).

Data parallelism (``PPOConfig.mesh``, see ``parallel.mesh.config_mesh``; by default on in a
multi-process run): the environments (dim 0 of the env state, timestep and recurrent carry, dim 1
of the time-major rollout and of each minibatch) are split over the mesh's ``data`` axis, so each
device (and each process) steps and differentiates its slice; parameters, optimizer state and keys
are replicated and GSPMD inserts the gradient all-reduce. The random streams do not depend on the
split (threefry is partitionable), so the result matches one device up to the order of the sums.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from jaxrl_reason import envs
from jaxrl_reason.models.policies import make_policy, masked_logits
from jaxrl_reason.parallel.mesh import config_mesh, split_along
from jaxrl_reason.rl.gae import compute_gae
from jaxrl_reason.rl.ppo_loss import masked_mean, ppo_loss
from jaxrl_reason.utils.guard import guard_optimizer
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    num_envs: int = 64
    num_steps: int = 16
    total_timesteps: int = 204_800
    updates_per_chunk: int = 10
    update_epochs: int = 4
    num_minibatches: int = 4
    lr: float = 3e-3
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    normalize_advantages: bool = True
    policy: str = "mlp"  # "mlp" or "gru"
    hidden: int = 64
    mesh: str | None = None  # e.g. "data=8": environments split over "data" (None: see the module docstring)

    def __post_init__(self):
        check_hyperparameters(self)
        positive = ("num_envs", "num_steps", "total_timesteps", "updates_per_chunk",
                    "update_epochs", "num_minibatches", "hidden")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"PPOConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_envs % self.num_minibatches:
            raise ValueError(
                f"PPOConfig.num_envs={self.num_envs} must be divisible by "
                f"num_minibatches={self.num_minibatches} (minibatches split environments)"
            )
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


@struct.dataclass
class RunnerState:
    params: Any  # nnx.State of the policy
    opt_state: Any
    env_state: Any  # batched [num_envs] state of EpisodeStats(AutoReset(env))
    timestep: envs.TimeStep  # batched
    carry: jax.Array  # [num_envs, num_agents, hidden] recurrent state (empty for mlp)
    key: jax.Array
    update: jax.Array  # int32 number of updates done


class Transition(NamedTuple):
    obs: jax.Array  # [E, A, D]
    reset: jax.Array  # [E, A] obs starts an episode
    legal: jax.Array  # [E, A, N]
    action: jax.Array  # [E, A]
    logp: jax.Array  # [E, A]
    value: jax.Array  # [E, A]
    reward: jax.Array  # [E, A]
    done: jax.Array  # [E, A]
    acted: jax.Array  # [E, A]
    returned: jax.Array  # [E] an episode finished at this step
    episode_return: jax.Array  # [E, A] return of the last finished episode
    episode_length: jax.Array  # [E]


class ChunkedTrain(NamedTuple):
    init: Callable[[jax.Array], RunnerState]
    update_chunk: Callable[[RunnerState], tuple[RunnerState, dict]]
    graphdef: Any


def build_policy(config: PPOConfig, env: envs.Environment, key: jax.Array) -> nnx.Module:
    obs_dim = math.prod(env.obs_shape)
    kwargs = {"hidden": config.hidden} if config.policy == "gru" else {"hidden": (config.hidden,) * 2}
    return make_policy(config.policy, obs_dim, env.num_actions, rngs=nnx.Rngs(key), **kwargs)


def _flat_obs(ts: envs.TimeStep) -> jax.Array:
    """``[..., A, *obs_shape]`` -> ``[..., A, D]`` float32."""
    lead = ts.legal_action_mask.shape[:-1]
    return ts.obs.reshape(*lead, -1).astype(jnp.float32)


def _select_env_action(env: envs.Environment, actions: jax.Array, ts: envs.TimeStep):
    """Agent actions ``[E, A]`` -> (env action ``[E]`` or ``[E, A]``, acted mask ``[E, A]``)."""
    if not env.turn_based:
        return actions, jnp.ones(actions.shape, bool)
    cp = ts.current_player  # [E]
    acted = jnp.arange(env.num_agents)[None, :] == cp[:, None]
    return jnp.take_along_axis(actions, cp[:, None], axis=1)[:, 0], acted


def make_chunked(config: PPOConfig, env: envs.Environment) -> ChunkedTrain:
    """Build ``init(key) -> RunnerState`` and ``update_chunk(state) -> (state, metrics)``.

    ``metrics`` holds one entry per update of the chunk, each ``[updates_per_chunk]``.
    """
    if env.action_dim is not None:
        raise ValueError(f"PPO here handles discrete actions only; {env.name} has action_dim={env.action_dim}")
    wrapped = envs.EpisodeStats(envs.AutoReset(env))
    E, A = config.num_envs, env.num_agents
    mesh = _data_mesh(config)
    split = lambda tree, dim: split_along(tree, mesh, dim)  # dim None: replicated

    def place(state: RunnerState) -> RunnerState:
        """The environments' batch (dim 0 of env_state, timestep, carry) split over data, the rest replicated."""
        dims = {f.name: 0 if f.name in ("env_state", "timestep", "carry") else None for f in dataclasses.fields(state)}
        return state.replace(**{name: split(getattr(state, name), dim) for name, dim in dims.items()})

    graphdef, _ = nnx.split(build_policy(config, env, jax.random.key(0)))
    steps_per_update = config.update_epochs * config.num_minibatches
    lr = (
        optax.linear_schedule(config.lr, 0.0, config.num_updates * steps_per_update)
        if config.anneal_lr else config.lr
    )
    tx = guard_optimizer(optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(lr, eps=1e-5)))

    def apply(params, carry, obs, reset, legal):
        carry, logits, value = nnx.merge(graphdef, params)(carry, obs, reset)
        return carry, masked_logits(logits, legal), value

    def init(key: jax.Array) -> RunnerState:
        k_params, k_env, k_run = jax.random.split(key, 3)
        policy = build_policy(config, env, k_params)
        params = nnx.state(policy)
        env_state, ts = jax.vmap(wrapped.reset)(jax.random.split(k_env, E))
        return place(RunnerState(
            params=params,
            opt_state=tx.init(params),
            env_state=env_state,
            timestep=ts,
            carry=policy.initial_carry((E, A)),
            key=k_run,
            update=jnp.int32(0),
        ))

    def env_step(carry_state, key):
        params, env_state, ts, carry, reset = carry_state
        k_act, k_env = jax.random.split(key)
        obs, legal = _flat_obs(ts), ts.legal_action_mask
        carry, logits, value = apply(params, carry, obs, reset, legal)
        action = jax.random.categorical(k_act, logits).astype(jnp.int32)
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[..., None], -1)[..., 0]
        env_action, acted = _select_env_action(env, action, ts)
        env_state, next_ts = jax.vmap(wrapped.step)(jax.random.split(k_env, E), env_state, env_action)
        done = jnp.broadcast_to(next_ts.done[:, None], (E, A))
        info = next_ts.info
        tr = Transition(obs, reset, legal, action, logp, value, next_ts.reward, done, acted,
                        info["returned_episode"], info["returned_episode_return"],
                        info["returned_episode_length"])
        return (params, *split((env_state, next_ts, carry, done), 0)), tr

    def loss_fn(params, init_carry, traj: Transition, advantages, returns):
        def step(carry, xs):
            obs, reset, legal = xs
            carry, logits, value = apply(params, carry, obs, reset, legal)
            return carry, (logits, value)

        _, (logits, values) = jax.lax.scan(step, init_carry, (traj.obs, traj.reset, traj.legal))
        log_probs = jax.nn.log_softmax(logits)
        logp = jnp.take_along_axis(log_probs, traj.action[..., None], -1)[..., 0]
        probs = jnp.exp(log_probs)
        entropy = -jnp.sum(jnp.where(traj.legal, probs * log_probs, 0.0), -1)
        return ppo_loss(
            logp, traj.logp, advantages, values, traj.value, returns, entropy,
            clip_eps=config.clip_eps, vf_coef=config.vf_coef, ent_coef=config.ent_coef,
            mask=traj.acted, value_mask=jnp.ones_like(traj.acted),
        )

    grad_fn = jax.grad(loss_fn, has_aux=True)

    def update(state: RunnerState, _):
        state = place(state)
        key, k_roll, k_perm = jax.random.split(state.key, 3)
        init_carry = state.carry
        reset0 = jnp.broadcast_to(state.timestep.done[:, None], (E, A))
        (params, env_state, ts, carry, _), traj = jax.lax.scan(
            env_step,
            (state.params, state.env_state, state.timestep, state.carry, reset0),
            jax.random.split(k_roll, config.num_steps),
        )
        last_reset = jnp.broadcast_to(ts.done[:, None], (E, A))
        _, _, last_value = apply(params, carry, _flat_obs(ts), last_reset, ts.legal_action_mask)
        advantages, returns = compute_gae(
            traj.reward, traj.value, traj.done, last_value, config.gamma, config.gae_lambda
        )
        if config.normalize_advantages:
            mean = masked_mean(advantages, traj.acted)
            std = jnp.sqrt(masked_mean(jnp.square(advantages - mean), traj.acted))
            advantages = (advantages - mean) / (std + 1e-8)

        def epoch(carry, key):
            params, opt_state = carry
            perm = jax.random.permutation(key, E).reshape(config.num_minibatches, -1)

            def minibatch(carry, idx):
                params, opt_state = carry
                pick = lambda x: jnp.take(x, idx, axis=1)  # time-major [T, E, ...]
                grads, metrics = grad_fn(
                    params, split(jnp.take(init_carry, idx, axis=0), 0),
                    *split((jax.tree.map(pick, traj), pick(advantages), pick(returns)), 1),
                )
                updates, opt_state = tx.update(grads, opt_state, params)
                return (optax.apply_updates(params, updates), opt_state), metrics

            return jax.lax.scan(minibatch, (params, opt_state), perm)

        (params, opt_state), loss_metrics = jax.lax.scan(
            epoch, (params, state.opt_state), jax.random.split(k_perm, config.update_epochs)
        )
        finished = traj.returned.astype(jnp.float32)
        count = finished.sum()
        metrics = {k: v.mean() for k, v in loss_metrics.items()}
        metrics.update(
            episode_return=(traj.episode_return.mean(-1) * finished).sum() / jnp.maximum(count, 1.0),
            episode_return_agent0=(traj.episode_return[..., 0] * finished).sum() / jnp.maximum(count, 1.0),
            episode_length=(traj.episode_length * finished).sum() / jnp.maximum(count, 1.0),
            episodes=count,
            env_steps=(state.update + 1) * E * config.num_steps,
        )
        new_state = place(RunnerState(params, opt_state, env_state, ts, carry, key, state.update + 1))
        return new_state, metrics

    def update_chunk(state: RunnerState):
        return jax.lax.scan(update, state, None, length=config.updates_per_chunk)

    return ChunkedTrain(init, update_chunk, graphdef)


def make_train(config: PPOConfig, env: envs.Environment) -> Callable[[jax.Array], dict]:
    """``train(key) -> {"runner_state", "metrics"}``; metrics are ``[num_updates]`` arrays."""
    chunked = make_chunked(
        dataclasses.replace(config, updates_per_chunk=config.num_updates), env
    )

    def train(key):
        state, metrics = chunked.update_chunk(chunked.init(key))
        return {"runner_state": state, "metrics": metrics}

    return train


def evaluation_policy(env: envs.Environment, graphdef, params, greedy: bool = True):
    """``(policy_fn, init_carry)`` for ``rl.evaluate.evaluate`` (one environment per call)."""

    def policy_fn(carry, key, ts: envs.TimeStep):
        obs = ts.obs.reshape(env.num_agents, -1).astype(jnp.float32)
        reset = jnp.zeros((env.num_agents,), bool)
        carry, logits, _ = nnx.merge(graphdef, params)(carry, obs, reset)
        logits = masked_logits(logits, ts.legal_action_mask)
        action = (jnp.argmax(logits, -1) if greedy else jax.random.categorical(key, logits)).astype(jnp.int32)
        return carry, (action[jnp.maximum(ts.current_player, 0)] if env.turn_based else action)

    init_carry = nnx.merge(graphdef, params).initial_carry((env.num_agents,))
    return policy_fn, init_carry
