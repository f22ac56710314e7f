"""One on-policy actor-critic trainer (the PPO family) with hooks; PPO, IPPO, HDR-IPPO, MAPPO and
PPO self-play are configurations of it.

    trainer = make_trainer(config, env, build, Hooks(...), updates_per_chunk=10)  # an rl.base.Trainer
    state = trainer.init(key)
    state, metrics = trainer.update(state)          # 10 updates; metrics [10] each

One update: a rollout (``lax.scan`` over ``num_steps`` steps of ``num_envs`` vmapped copies of
``EpisodeStats(AutoReset(env))``), targets (GAE by default), then ``update_epochs`` passes of
``num_minibatches`` gradient steps (``rl.update.minibatch_epochs``). Every agent observes every
step (obs ``[E, A, D]``) through one parameter-shared network ``build(key)`` with the
``models.policies`` signature ``carry, logits, value = net(carry, obs, reset)``; in turn-based games
only the current player's action is played and only its log-probability enters the policy loss (the
``acted`` mask); values are learned for every agent and step. Minibatches split the environments and
keep whole time sequences, so feed-forward and recurrent networks share one path.

Hooks (``Hooks``):

- ``loss``: ``(logits, values, traj, targets) -> (loss, metrics)`` on a minibatch (time-major
  ``[T, B, A, ...]``); default ``ppo_objective`` (clipped surrogate, clipped value, entropy).
- ``aux_losses``: ``(name, weight, loss)`` triples mixed convexly,
  ``(1 - sum w) * loss + sum w * aux`` (HDR-IPPO's ``(1 - lambda) PPO + lambda KL(pi_BC || pi)``).
- ``critic_input``: ``critic_input(ts) -> [E, S]`` is passed to the network as a fourth argument
  (MAPPO's centralised state).
- ``partner``: a frozen policy unrolled alongside on the same observations; its logits are recorded
  (``traj.partner_logits``) for the losses, and it plays the seats it is given, which then leave the
  policy loss (HDR's behaviour-cloned reference; a fixed self-play opponent).
- ``targets``: ``(traj, last_value, targets_state) -> (Targets, targets_state)``, the state threaded
  through updates (self-play's per-role RAE baselines); default GAE(gamma, lambda).
- ``metrics``: extra metrics from the state after each update; ``init_params``: start from these.

Advantage normalisation (``config.adv_norm``), one rule for the family: ``"rollout"`` (default)
standardises the advantages over the policy-loss entries (``targets.mask``: the acting turns) of the
whole rollout, once per update, before the minibatches. ``"minibatch"`` does the same in each
minibatch (CleanRL, JaxMARL's IPPO); ``"none"`` keeps them raw (SPIRAL's RAE, whose per-role baseline
is the normaliser). Adam (``adam_eps``, default 1e-5 as PureJaxRL) after global-norm clipping; with ``anneal_lr`` the
learning rate falls linearly to 0 over all gradient steps.

Data parallelism (``mesh``, see ``rl.ppo``): the environments (dim 0 of env state, timestep and
carries, dim 1 of the time-major rollout) are split over the mesh's ``data`` axis.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from jaxrl_reason import envs
from jaxrl_reason.models.policies import masked_logits
from jaxrl_reason.parallel.mesh import split_along
from jaxrl_reason.rl.base import ChunkedTrain, Metrics, Policy
from jaxrl_reason.rl.gae import compute_gae
from jaxrl_reason.rl.update import minibatch_epochs
from jaxrl_reason.rl.ppo_loss import masked_mean, ppo_loss
from jaxrl_reason.utils.guard import guard_optimizer
from jaxrl_reason.utils.validation import check_hyperparameters

ADV_NORMS = ("rollout", "minibatch", "none")


@dataclasses.dataclass(frozen=True)
class OnPolicyConfig:
    """Hyperparameters the family shares (names used by every member). A member adds its budget
    (``num_updates``, a field or a property) and its network fields."""

    num_envs: int = 64
    num_steps: int = 16  # env steps per environment per update
    update_epochs: int = 4
    num_minibatches: int = 4  # split the environments
    lr: float = 3e-3
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    adv_norm: str = "rollout"  # see the module docstring
    adam_eps: float = 1e-5  # PureJaxRL's; optax's default is 1e-8

    def __post_init__(self):
        check_hyperparameters(self)
        name = type(self).__name__
        for f in ("num_envs", "num_steps", "update_epochs", "num_minibatches"):
            if getattr(self, f) < 1:
                raise ValueError(f"{name}.{f} must be >= 1, got {getattr(self, f)}")
        if self.num_envs % self.num_minibatches:
            raise ValueError(f"{name}.num_envs={self.num_envs} must be divisible by "
                             f"num_minibatches={self.num_minibatches} (minibatches split environments)")
        if self.adv_norm not in ADV_NORMS:
            raise ValueError(f"{name}.adv_norm must be one of {ADV_NORMS}, got {self.adv_norm!r}")
        if not self.adam_eps > 0:
            raise ValueError(f"{name}.adam_eps must be > 0, got {self.adam_eps}")


class Transition(NamedTuple):
    """One rollout step of ``E`` environments and ``A`` agents (a rollout stacks them: ``[T, E, ...]``)."""

    obs: jax.Array  # [E, A, D] float32
    critic_in: jax.Array  # [E, S] critic_input(ts) ([E, 0] without the hook)
    reset: jax.Array  # [E, A] obs starts an episode
    legal: jax.Array  # [E, A, N]
    action: jax.Array  # [E, A] the action each agent played or would have played
    logp: jax.Array  # [E, A] the learner's log-probability of it
    value: jax.Array  # [E, A]
    partner_logits: jax.Array  # [E, A, N] the frozen partner's ([E, A, 0] without one)
    reward: jax.Array  # [E, A]
    done: jax.Array  # [E, A]
    acted: jax.Array  # [E, A] the learner chose the played action
    returned: jax.Array  # [E] an episode finished at this step
    episode_return: jax.Array  # [E, A] return of the last finished episode
    episode_length: jax.Array  # [E]
    env_metrics: dict  # env.info_metrics(info), [E] each


class Targets(NamedTuple):
    """Per-entry learning targets, ``[T, E, A]`` each."""

    advantages: jax.Array
    returns: jax.Array
    mask: jax.Array  # bool: entries of the policy and entropy terms (and of advantage normalisation)
    value_mask: jax.Array  # bool: entries of the value term


Loss = Callable[[jax.Array, jax.Array, Transition, Targets], tuple[jax.Array, Metrics]]
TargetsFn = Callable[[Transition, jax.Array, Any], tuple[Targets, Any]]


class Partner(NamedTuple):
    """A frozen policy (same network signature) unrolled alongside the learner."""

    graphdef: Any
    params: Any
    seats: tuple[bool, ...] | None = None  # [A]: seats it plays (None: it only runs alongside)


@dataclasses.dataclass(frozen=True)
class Hooks:
    loss: Loss | None = None
    aux_losses: tuple[tuple[str, float, Loss], ...] = ()
    critic_input: Callable[[envs.TimeStep], jax.Array] | None = None
    partner: Partner | None = None
    targets: TargetsFn | None = None
    targets_state: Any = None
    metrics: Callable[[Any], Metrics] | None = None
    init_params: Any = None


@struct.dataclass
class RunnerState:
    params: Any  # nnx.State of the network
    opt_state: Any
    env_state: Any  # batched [E] state of EpisodeStats(AutoReset(env))
    timestep: envs.TimeStep  # batched
    carry: jax.Array  # [E, A, H] recurrent state (H = 0 for feed-forward networks)
    partner_carry: Any  # the partner's, or an empty array
    targets_state: Any  # the targets hook's state (e.g. RAE baselines), or None
    key: jax.Array
    update: jax.Array  # int32 updates done


def flat_obs(ts: envs.TimeStep) -> jax.Array:
    """``[..., A, *obs_shape] -> [..., A, D]`` float32: each agent's observation flattened (``rl.marl`` too)."""
    lead = ts.legal_action_mask.shape[:-1]
    return ts.obs.reshape(*lead, -1).astype(jnp.float32)


def standardise(x: jax.Array, mask: jax.Array) -> jax.Array:
    """``(x - mean) / (std + 1e-8)`` with the mean and std over the ``mask`` entries."""
    mean = masked_mean(x, mask)
    return (x - mean) / (jnp.sqrt(masked_mean(jnp.square(x - mean), mask)) + 1e-8)


def make_optimizer(config: OnPolicyConfig, total_steps: int) -> optax.GradientTransformation:
    """Global-norm clipping then Adam (``config.adam_eps``); linear annealing to 0 over ``total_steps``."""
    lr = optax.linear_schedule(config.lr, 0.0, total_steps) if config.anneal_lr else config.lr
    return guard_optimizer(optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                                       optax.adam(lr, eps=config.adam_eps)))


def ppo_objective(config: OnPolicyConfig) -> Loss:
    """The clipped PPO loss (``rl.ppo_loss``) on a minibatch, masked by ``targets``."""

    def loss(logits, values, traj: Transition, tg: Targets):
        log_probs = jax.nn.log_softmax(logits)
        logp = jnp.take_along_axis(log_probs, traj.action[..., None], -1)[..., 0]
        entropy = -jnp.sum(jnp.where(traj.legal, jnp.exp(log_probs) * log_probs, 0.0), -1)
        return ppo_loss(logp, traj.logp, tg.advantages, values, traj.value, tg.returns, entropy,
                        clip_eps=config.clip_eps, vf_coef=config.vf_coef, ent_coef=config.ent_coef,
                        mask=tg.mask, value_mask=tg.value_mask)

    return loss


def gae_targets(config: OnPolicyConfig) -> TargetsFn:
    """GAE(gamma, lambda) advantages and returns; policy loss on acting turns, values everywhere."""

    def targets(traj: Transition, last_value, state):
        adv, ret = compute_gae(traj.reward, traj.value, traj.done, last_value, config.gamma, config.gae_lambda)
        return Targets(adv, ret, traj.acted, jnp.ones_like(traj.acted)), state

    return targets


def unroll(graphdef, params, carry, obs, reset, *extra):
    """A network over time: ``obs [T, *B, D]``, ``reset [T, *B]`` -> ``(logits, values)`` ``[T, *B, ...]``.

    A network without recurrent state (empty ``carry``) runs once over all steps."""
    net = nnx.merge(graphdef, params)
    if all(x.size == 0 for x in jax.tree.leaves(carry)):
        _, logits, values = net(carry, obs, reset, *extra)
        return logits, values

    def body(c, xs):
        c, logits, value = net(c, *xs)
        return c, (logits, value)

    _, (logits, values) = jax.lax.scan(body, carry, (obs, reset, *extra))
    return logits, values


def _played(env: envs.Environment, actions: jax.Array, ts: envs.TimeStep):
    """Agent actions ``[E, A]`` -> (env action ``[E]`` or ``[E, A]``, acted mask ``[E, A]``)."""
    if not env.turn_based:
        return actions, jnp.ones(actions.shape, bool)
    cp = ts.current_player  # [E]
    acted = jnp.arange(env.num_agents)[None, :] == cp[:, None]
    return jnp.take_along_axis(actions, cp[:, None], axis=1)[:, 0], acted


def make_trainer(config: OnPolicyConfig, env: envs.Environment, build: Callable[[jax.Array], nnx.Module],
                 hooks: Hooks = Hooks(), *, updates_per_chunk: int = 1, mesh=None) -> ChunkedTrain:
    """-> ``ChunkedTrain(init, update, graphdef)``; ``update`` runs ``updates_per_chunk`` updates.

    ``config.num_updates`` (the whole run's) sets the learning-rate schedule; ``build(key)`` makes the
    network (``initial_carry(batch_shape)`` and ``net(carry, obs, reset[, critic_in])``)."""
    if env.action_dim is not None:
        raise ValueError(f"the on-policy trainer handles discrete actions only; {env.name} has "
                         f"action_dim={env.action_dim}")
    wrapped = envs.EpisodeStats(envs.AutoReset(env))
    E, A, T = config.num_envs, env.num_agents, config.num_steps
    split = lambda tree, dim: split_along(tree, mesh, dim)  # dim None: replicated
    graphdef, _ = nnx.split(build(jax.random.key(0)))
    tx = make_optimizer(config, config.num_updates * config.update_epochs * config.num_minibatches)
    main_loss = hooks.loss or ppo_objective(config)
    targets_fn = hooks.targets or gae_targets(config)
    partner = hooks.partner
    critic = hooks.critic_input or (lambda ts: jnp.zeros((ts.done.shape[0], 0)))
    extra = (lambda cin: (cin,)) if hooks.critic_input is not None else (lambda cin: ())
    mix = 1.0 - sum(w for _, w, _ in hooks.aux_losses)

    def place(state: RunnerState) -> RunnerState:
        batched = ("env_state", "timestep", "carry", "partner_carry")
        return state.replace(**{f.name: split(getattr(state, f.name), 0 if f.name in batched else None)
                                for f in dataclasses.fields(state)})

    def apply(params, carry, obs, reset, legal, cin):
        carry, logits, value = nnx.merge(graphdef, params)(carry, obs, reset, *extra(cin))
        return carry, masked_logits(logits, legal), value

    def init(key: jax.Array) -> RunnerState:
        k_params, k_env, k_run = jax.random.split(key, 3)
        net = build(k_params)
        params = nnx.state(net) if hooks.init_params is None else hooks.init_params
        env_state, ts = jax.vmap(wrapped.reset)(jax.random.split(k_env, E))
        p_carry = nnx.merge(partner.graphdef, partner.params).initial_carry((E, A)) if partner else jnp.zeros(())
        return place(RunnerState(params, tx.init(params), env_state, ts, net.initial_carry((E, A)), p_carry,
                                 hooks.targets_state, k_run, jnp.int32(0)))

    def env_step(c, key):
        params, env_state, ts, carry, p_carry, reset = c
        k_act, k_env = jax.random.split(key)
        obs, legal, cin = flat_obs(ts), ts.legal_action_mask, critic(ts)
        carry, logits, value = apply(params, carry, obs, reset, legal, cin)
        action = jax.random.categorical(k_act, logits).astype(jnp.int32)
        env_action, acted = _played(env, action, ts)
        p_logits = jnp.zeros((E, A, 0))
        if partner is not None:
            p_carry, p_logits, _ = nnx.merge(partner.graphdef, partner.params)(p_carry, obs, reset)
            if partner.seats is not None:
                seats = jnp.asarray(partner.seats, bool)
                p_action = jax.random.categorical(jax.random.fold_in(k_act, 1), masked_logits(p_logits, legal))
                action = jnp.where(seats, p_action.astype(jnp.int32), action)
                env_action, acted = _played(env, action, ts)
                acted = acted & ~seats
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[..., None], -1)[..., 0]
        env_state, nts = jax.vmap(wrapped.step)(jax.random.split(k_env, E), env_state, env_action)
        done = jnp.broadcast_to(nts.done[:, None], (E, A))
        info = nts.info
        tr = Transition(obs, cin, reset, legal, action, logp, value, p_logits, nts.reward, done, acted,
                        info["returned_episode"], info["returned_episode_return"], info["returned_episode_length"],
                        wrapped.info_metrics(info))
        return (params, *split((env_state, nts, carry, p_carry, done), 0)), tr

    def loss_fn(params, batch):
        carry0, traj, tg = split(batch, 0)  # env-major minibatch [B, ...]
        traj, tg = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), (traj, tg))  # -> [T, B, ...]
        logits, values = unroll(graphdef, params, carry0, traj.obs, traj.reset, *extra(traj.critic_in))
        logits = masked_logits(logits, traj.legal)
        if config.adv_norm == "minibatch":
            tg = tg._replace(advantages=standardise(tg.advantages, tg.mask))
        loss, metrics = main_loss(logits, values, traj, tg)
        loss = mix * loss
        for name, weight, aux in hooks.aux_losses:
            value, aux_metrics = aux(logits, values, traj, tg)
            loss = loss + weight * value
            metrics = {**metrics, **aux_metrics, name: value}
        return loss, {**metrics, "loss": loss}

    def update_once(state: RunnerState):
        state = place(state)
        key, k_roll, k_perm = jax.random.split(state.key, 3)
        reset0 = jnp.broadcast_to(state.timestep.done[:, None], (E, A))
        (params, env_state, ts, carry, p_carry, _), traj = jax.lax.scan(
            env_step, (state.params, state.env_state, state.timestep, state.carry, state.partner_carry, reset0),
            jax.random.split(k_roll, T))
        last_reset = jnp.broadcast_to(ts.done[:, None], (E, A))
        _, _, last_value = apply(params, carry, flat_obs(ts), last_reset, ts.legal_action_mask, critic(ts))
        tg, targets_state = targets_fn(traj, last_value, state.targets_state)
        if config.adv_norm == "rollout":
            tg = tg._replace(advantages=standardise(tg.advantages, tg.mask))
        env_major = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), (traj, tg))
        (params, opt_state), loss_metrics = minibatch_epochs(
            loss_fn, tx, params, state.opt_state, (state.carry, *env_major), k_perm,
            config.update_epochs, config.num_minibatches)
        finished = traj.returned.astype(jnp.float32)
        count = finished.sum()
        per_episode = lambda x: (x * finished).sum() / jnp.maximum(count, 1.0)
        metrics = {k: v.mean() for k, v in loss_metrics.items()}
        metrics.update(
            episode_return=per_episode(traj.episode_return.mean(-1)),
            episode_return_agent0=per_episode(traj.episode_return[..., 0]),
            episode_length=per_episode(traj.episode_length),
            episodes=count,
            env_steps=(state.update + 1) * E * T,
            **{k: v.mean() for k, v in traj.env_metrics.items()},
        )
        new = place(RunnerState(params, opt_state, env_state, ts, carry, p_carry, targets_state, key,
                                state.update + 1))
        if hooks.metrics is not None:
            metrics.update(hooks.metrics(new))
        return new, metrics

    def update(state: RunnerState):
        return jax.lax.scan(lambda s, _: update_once(s), state, None, length=updates_per_chunk)

    return ChunkedTrain(init, update, graphdef)


def evaluation_policy(env: envs.Environment, graphdef, params, greedy: bool = True) -> tuple[Policy, Any]:
    """``(policy, init_carry)`` of a trained network for ``rl.evaluate.evaluate`` (one environment per call).

    The network is called without a critic input (a centralised critic is not needed to act)."""

    def policy(carry, key, ts: envs.TimeStep):
        reset = jnp.zeros((env.num_agents,), bool)
        carry, logits, _ = nnx.merge(graphdef, params)(carry, flat_obs(ts), reset)
        logits = masked_logits(logits, ts.legal_action_mask)
        action = (jnp.argmax(logits, -1) if greedy else jax.random.categorical(key, logits)).astype(jnp.int32)
        return carry, (action[jnp.maximum(ts.current_player, 0)] if env.turn_based else action)

    return policy, nnx.merge(graphdef, params).initial_carry((env.num_agents,))
