"""QMIX (monotone value mixing) with a flashbax replay buffer, whole loop jitted.

Per-agent utilities ``Q_i(o_i, a_i)`` from one parameter-shared network (observation
plus one-hot agent id) are mixed into ``Q_tot = f(Q_1..Q_A; s)`` by a hypernetwork
conditioned on the global state ``s`` whose mixing weights are made non-negative
(``|.|``), so ``dQ_tot/dQ_i >= 0`` and greedy per-agent actions maximise ``Q_tot``.
The team reward is the mean of the agents' rewards. Double-Q targets, Polyak target
networks, epsilon-greedy exploration with a linear schedule.

The trainer takes its pieces as arguments, so a variant needs no edit here:
``agent_net`` (a factory of the shared per-agent network, ``AgentNet``), ``aux_loss``
(a term added to the TD loss, ``AuxLoss``) and ``prior`` (a behaviour policy to start
from, ``Prior``). ``prefill_steps`` of transitions come from the prior (uniformly random
legal actions without one), then ``prior.offline_updates`` gradient steps on that data
alone, then online learning. RMIX (``agents/rally/rmix.py``) is such a variant. Every
environment step, prefill included, counts towards ``total_timesteps``, and the trainer
takes exactly that many: the prefill is rounded up so that the online phase is a whole
number of iterations, and iterations past ``num_iters`` in the last (partial) chunk are
no-ops. The environment's own per-step metrics (``env.info_metrics``) are averaged over
each iteration's steps and logged under their own names.

``mesh="data=8"`` (in a multi-process run ``mesh=None``: data over every device of every process) splits
the environments over the data axis: each device steps its slice; the buffer and the updates follow
the shardings, so the run is the one-device run up to float rounding.

Replay uses ``flashbax.make_flat_buffer`` (a maintained JAX buffer; pairs of
consecutive steps per environment, so ``second`` is the next step).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple

import flashbax as fbx
import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from jaxrl_reason import envs
from jaxrl_reason.models.policies import MLP
from jaxrl_reason.parallel.mesh import data_mesh, split_along
from jaxrl_reason.rl.marl import common
from jaxrl_reason.utils.guard import guard_optimizer
from jaxrl_reason.utils.validation import check_hyperparameters

# behaviour(key, ts) -> actions [A] for ONE environment (vmapped by the trainer).
Behaviour = Callable[[jax.Array, envs.TimeStep], jax.Array]
# restrict(legal [..., A, N], proposal [..., A]) -> legal' [..., A, N]
Restrict = Callable[[jax.Array, jax.Array], jax.Array]
# agent_net(in_dim, num_actions, hidden, *, rngs) -> module with
# module(x [..., A, in_dim], proposal [..., A] int32 | None) -> utilities [..., A, num_actions];
# x is the flat observation plus the one-hot agent id (``agent_input``), proposal the behaviour
# policy's actions (None when acting without a prior); a network may ignore the proposal.
AgentNet = Callable[..., nnx.Module]
# aux_loss(q [B, A, N] legal-masked utilities in first's state, q_taken [B, A] those of first.action,
#          first: Step, online: bool) -> (loss [], metrics {name: []}): added to the TD loss;
#          online is False in the offline phase.
AuxLoss = Callable[[jax.Array, jax.Array, "Step", bool], tuple[jax.Array, dict]]


@dataclasses.dataclass(frozen=True)
class QMIXConfig:
    num_envs: int = 16
    num_steps: int = 4  # env steps per environment between learning phases
    total_timesteps: int = 100_000  # env steps (environments x steps), prefill included
    prefill_steps: int = 2_048  # env steps collected by the behaviour policy first
    iters_per_chunk: int = 50
    updates_per_iter: int = 2
    batch_size: int = 128
    buffer_size: int = 50_000
    lr: float = 5e-4
    gamma: float = 0.97
    eps_start: float = 1.0
    eps_end: float = 0.05
    eps_decay_frac: float = 0.5  # of the online steps
    tau: float = 0.01  # Polyak rate of the target networks
    hidden: int = 64
    mixer_embed: int = 32
    max_grad_norm: float = 10.0
    mesh: str | None = None  # e.g. "data=8": the environments split over the data axis (multi-process: over all)

    def __post_init__(self):
        check_hyperparameters(self)
        for name in ("num_envs", "num_steps", "total_timesteps", "iters_per_chunk", "updates_per_iter",
                     "batch_size", "buffer_size", "hidden", "mixer_embed"):
            if getattr(self, name) < 1:
                raise ValueError(f"QMIXConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.total_timesteps % self.num_envs:
            raise ValueError(f"QMIXConfig.total_timesteps={self.total_timesteps} must be a multiple of "
                             f"num_envs={self.num_envs} (every environment takes the same steps)")
        if self.prefill_steps < 2 * self.num_envs:
            raise ValueError(f"QMIXConfig.prefill_steps={self.prefill_steps} must be >= 2 * num_envs "
                             f"({2 * self.num_envs}) so the buffer can be sampled")
        if self.num_iters < 1:
            raise ValueError("QMIXConfig.total_timesteps leaves no online iteration after the prefill")
        if self.buffer_size < self.prefill_rollout * self.num_envs:
            raise ValueError(f"QMIXConfig.buffer_size must hold at least the prefill "
                             f"({self.prefill_rollout * self.num_envs} steps)")

    @property
    def num_iters(self) -> int:
        """Online iterations (``num_envs * num_steps`` env steps each)."""
        online = self.total_timesteps // self.num_envs - -(-self.prefill_steps // self.num_envs)
        return online // self.num_steps

    @property
    def prefill_rollout(self) -> int:
        """Prefill steps per environment: ``prefill_steps`` rounded up so that prefill plus
        ``num_iters`` iterations is exactly ``total_timesteps``."""
        return self.total_timesteps // self.num_envs - self.num_iters * self.num_steps

    @property
    def num_chunks(self) -> int:
        return -(-self.num_iters // self.iters_per_chunk)


class AgentQ(nnx.Module):
    """Shared per-agent utility network (an ``AgentNet``): ``[..., D] -> [..., num_actions]``,
    the behaviour's proposal ignored."""

    def __init__(self, in_dim: int, num_actions: int, hidden: int, *, rngs: nnx.Rngs):
        self.net = MLP([in_dim, hidden, hidden, num_actions], rngs=rngs)

    def __call__(self, x, proposal=None):
        return self.net(x)


class MonotoneMixer(nnx.Module):
    """QMIX hypernetwork mixer: ``(q [..., A], s [..., S]) -> Q_tot [...]``, monotone in q."""

    def __init__(self, num_agents: int, state_dim: int, embed: int, *, rngs: nnx.Rngs):
        self.A, self.E = num_agents, embed
        self.hyper_w1 = MLP([state_dim, embed, num_agents * embed], rngs=rngs)
        self.hyper_b1 = nnx.Linear(state_dim, embed, rngs=rngs)
        self.hyper_w2 = MLP([state_dim, embed, embed], rngs=rngs)
        self.hyper_b2 = MLP([state_dim, embed, 1], rngs=rngs)

    def __call__(self, q, s):
        w1 = jnp.abs(self.hyper_w1(s)).reshape(*s.shape[:-1], self.A, self.E)
        h = jax.nn.elu(jnp.einsum("...a,...ae->...e", q, w1) + self.hyper_b1(s))
        w2 = jnp.abs(self.hyper_w2(s))
        return jnp.sum(h * w2, -1) + self.hyper_b2(s)[..., 0]


class MixingNets(nnx.Module):
    def __init__(self, agent: nnx.Module, mixer: MonotoneMixer):
        self.agent, self.mixer = agent, mixer


def build_nets(config: QMIXConfig, env: envs.Environment, key: jax.Array, agent_net: AgentNet = AgentQ) -> MixingNets:
    """The agent network (``agent_net`` on ``agent_input``'s width) and the mixer, from one key."""
    in_dim = math.prod(env.obs_shape) + env.num_agents
    rngs = nnx.Rngs(key)
    agent = agent_net(in_dim, env.num_actions, config.hidden, rngs=rngs)
    mixer = MonotoneMixer(env.num_agents, common.global_state_dim(env), config.mixer_embed, rngs=rngs)
    return MixingNets(agent, mixer)


def agent_input(obs: jax.Array) -> jax.Array:
    """``[..., A, D]`` flat observations -> ``[..., A, D + A]`` agent-net input (one-hot agent id)."""
    return common.with_agent_id(obs)


class Prior(NamedTuple):
    """A behaviour policy the learner starts from and leans on (semi-offline QMIX; only ``act`` is required).

    ``act(key, ts) -> [A]``: its actions in ONE environment; they fill the replay buffer first and are
    the ``proposal`` the agent network and ``restrict`` see. ``offline_updates``: gradient steps on that
    prefill alone before online learning. ``explore``: fraction of exploratory actions taken from
    ``act`` (the rest uniformly random). ``td_on_proposal``: the TD target takes the next state's
    proposal instead of the greedy action (SARSA: the mixer then values the prior, and acting greedily
    is one step of policy improvement). ``bonus``: acting only, the proposal's utility + ``bonus``
    before the argmax (keep the prior's choice unless another is better by more). ``restrict(legal,
    proposal) -> legal'`` narrows the actions the learner chooses among (acting, exploring, TD max).
    """

    act: Behaviour
    offline_updates: int = 0
    explore: float = 0.0
    td_on_proposal: bool = False
    bonus: float = 0.0
    restrict: Restrict | None = None

    def check(self) -> None:
        if not callable(self.act):
            raise TypeError(f"Prior.act must be a policy (key, ts) -> actions, got {type(self.act).__name__}")
        if self.offline_updates < 0 or self.bonus < 0 or not 0.0 <= self.explore <= 1.0:
            raise ValueError(f"Prior needs offline_updates >= 0, bonus >= 0 and explore in [0, 1], got "
                             f"{self.offline_updates}, {self.bonus}, {self.explore}")


class Step(NamedTuple):
    """One stored step (per environment): the state acted in and what followed."""

    obs: jax.Array  # [A, D] float32
    gstate: jax.Array  # [S]
    legal: jax.Array  # [A, N] bool
    action: jax.Array  # [A] int32
    reward: jax.Array  # [] team reward (mean over agents)
    done: jax.Array  # [] float32
    from_prior: jax.Array  # [] float32: the action came from the prior policy
    prior_action: jax.Array  # [A] int32 the behaviour policy's proposal in this state


@struct.dataclass
class QMIXState:
    params: Any
    target_params: Any
    opt_state: Any
    buffer: Any
    env_state: Any
    timestep: envs.TimeStep
    key: jax.Array
    env_steps: jax.Array  # int32 environment steps so far (all environments)
    iteration: jax.Array


class ChunkedQMIX(NamedTuple):
    init: Callable[[jax.Array], QMIXState]
    update: Callable[[QMIXState], tuple[QMIXState, dict]]
    graphdef: Any


def uniform_behaviour(env: envs.Environment) -> Behaviour:
    return lambda key, ts: envs.random_legal_action(key, env, ts)


def make_chunked(config: QMIXConfig, env: envs.Environment, agent_net: AgentNet = AgentQ,
                 aux_loss: AuxLoss | None = None, prior: Prior | None = None) -> ChunkedQMIX:
    """``init(key)`` (prefill + offline phase) and ``update(state)`` (online iterations).

    ``agent_net`` builds the shared per-agent network (``AgentNet``; default ``AgentQ``),
    ``aux_loss`` adds a term to the TD loss (``AuxLoss``; its metrics are logged next to
    ``td_loss``), ``prior`` is the behaviour policy to start from (``Prior``; ``None``:
    uniformly random legal actions fill the buffer and nothing else changes).
    """
    common.check_discrete_simultaneous(env, "QMIX")
    if not callable(agent_net):
        raise TypeError(f"agent_net must be a network factory (in_dim, num_actions, hidden, *, rngs), "
                        f"got {agent_net!r}")
    if prior is not None:
        prior.check()
    from_prior = prior is not None
    prior = prior or Prior(uniform_behaviour(env))
    wrapped = envs.EpisodeStats(envs.AutoReset(env))
    E, A = config.num_envs, env.num_agents
    mesh = data_mesh(config.mesh, {"num_envs": E}, "QMIXConfig")
    graphdef, _ = nnx.split(build_nets(config, env, jax.random.key(0), agent_net))
    tx = guard_optimizer(optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(config.lr)))
    buffer = fbx.make_flat_buffer(max_length=config.buffer_size, min_length=2 * E,
                                  sample_batch_size=config.batch_size, add_sequences=True, add_batch_size=E)
    online_steps = config.num_iters * E * config.num_steps
    decay_steps = max(1.0, config.eps_decay_frac * online_steps)

    def agent_q(params, obs, legal, prior_action):
        q = nnx.merge(graphdef, params).agent(agent_input(obs), prior_action)
        return jnp.where(legal, q, -1e9)

    def env_step(params, eps, prior_explore, use_prior):
        """One step of all environments; ``use_prior``: act with the behaviour policy only."""

        def fn(carry, key):
            env_state, ts = split_along(carry, mesh, 0)  # each device steps its slice of the environments
            k_prior, k_rand, k_u1, k_u2, k_env = jax.random.split(key, 5)
            obs = common.flat_obs(ts)
            prior_a = jax.vmap(prior.act)(jax.random.split(k_prior, E), ts)
            legal = restricted(prior, ts.legal_action_mask, prior_a)
            rand_a = jax.random.categorical(k_rand, jnp.where(legal, 0.0, -jnp.inf)).astype(jnp.int32)
            greedy = greedy_action(agent_q(params, obs, legal, prior_a), prior_a, prior.bonus)
            explore_from_prior = jax.random.uniform(k_u1, (E, A)) < prior_explore
            explore = jnp.where(explore_from_prior, prior_a, rand_a)
            explores = jax.random.uniform(k_u2, (E, A)) < eps
            action = jnp.where(use_prior, prior_a, jnp.where(explores, explore, greedy))
            prior_used = use_prior | jnp.all(explores & explore_from_prior, -1)
            env_state, nts = jax.vmap(wrapped.step)(jax.random.split(k_env, E), env_state, action)
            step = Step(obs, common.global_state(ts), legal, action, nts.reward.mean(-1),
                        nts.done.astype(jnp.float32), (prior_used & from_prior).astype(jnp.float32), prior_a)
            stats = (nts.info["returned_episode"], nts.info["returned_episode_return"].mean(-1),
                     wrapped.info_metrics(nts.info))
            return (env_state, nts), (step, stats)

        return fn

    def collect(params, env_state, ts, key, steps, eps, use_prior):
        fn = env_step(params, eps, prior.explore, use_prior)
        (env_state, ts), (traj, stats) = jax.lax.scan(fn, (env_state, ts), jax.random.split(key, steps))
        return env_state, ts, jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), traj), stats

    def loss_fn(params, target_params, first: Step, second: Step, online):
        nets = nnx.merge(graphdef, params)
        q_all = agent_q(params, first.obs, first.legal, first.prior_action)  # [B, A, N]
        q_taken = jnp.take_along_axis(q_all, first.action[..., None], -1)[..., 0]
        q_tot = nets.mixer(q_taken, first.gstate)
        if prior.td_on_proposal:  # evaluate the prior: greedy acting is then policy improvement
            next_a = second.prior_action
        else:
            next_a = jnp.argmax(agent_q(params, second.obs, second.legal, second.prior_action), -1)
        q_next = jnp.take_along_axis(agent_q(target_params, second.obs, second.legal, second.prior_action),
                                     next_a[..., None], -1)[..., 0]
        target_tot = nnx.merge(graphdef, target_params).mixer(q_next, second.gstate)
        y = first.reward + config.gamma * (1.0 - first.done) * jax.lax.stop_gradient(target_tot)
        td = jnp.mean(optax.huber_loss(q_tot, y))
        metrics = {"td_loss": td, "q_tot": q_tot.mean()}
        if aux_loss is None:
            return td, metrics
        aux, aux_metrics = aux_loss(q_all, q_taken, first, online)
        return td + aux, {**metrics, **aux_metrics}

    grad_fn = jax.grad(loss_fn, has_aux=True)

    def learn(params, target_params, opt_state, buf, key, online):
        batch = buffer.sample(buf, key).experience
        grads, metrics = grad_fn(params, target_params, batch.first, batch.second, online)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        target_params = optax.incremental_update(params, target_params, config.tau)
        return params, target_params, opt_state, metrics

    def init(key: jax.Array) -> QMIXState:
        k_net, k_env, k_fill, k_off, k_run = jax.random.split(key, 5)
        params = nnx.state(build_nets(config, env, k_net, agent_net))
        env_state, ts = jax.vmap(wrapped.reset)(jax.random.split(k_env, E))
        dummy = Step(common.flat_obs(ts)[0], common.global_state(ts)[0], ts.legal_action_mask[0],
                     jnp.zeros((A,), jnp.int32), jnp.float32(0), jnp.float32(0), jnp.float32(0),
                     jnp.zeros((A,), jnp.int32))
        buf = buffer.init(dummy)
        env_state, ts, traj, _ = collect(params, env_state, ts, k_fill, config.prefill_rollout, 1.0, True)
        buf = buffer.add(buf, traj)
        opt_state = tx.init(params)
        target_params = params

        def offline(carry, key):
            params, target_params, opt_state = carry
            params, target_params, opt_state, _ = learn(params, target_params, opt_state, buf, key, False)
            return (params, target_params, opt_state), None

        (params, target_params, opt_state), _ = jax.lax.scan(
            offline, (params, target_params, opt_state), jax.random.split(k_off, prior.offline_updates))
        return QMIXState(params, target_params, opt_state, buf, env_state, ts, k_run,
                         jnp.int32(config.prefill_rollout * E), jnp.int32(0))

    def iteration(state: QMIXState, _):
        key, k_col, k_learn = jax.random.split(state.key, 3)
        online_done = state.env_steps - config.prefill_rollout * E
        frac = jnp.clip(online_done / decay_steps, 0.0, 1.0)
        eps = config.eps_start + frac * (config.eps_end - config.eps_start)
        env_state, ts, traj, (finished, ret, env_metrics) = collect(
            state.params, state.env_state, state.timestep, k_col, config.num_steps, eps, False)
        buf = buffer.add(state.buffer, traj)

        def upd(carry, key):
            params, target_params, opt_state = carry
            params, target_params, opt_state, m = learn(params, target_params, opt_state, buf, key, True)
            return (params, target_params, opt_state), m

        (params, target_params, opt_state), m = jax.lax.scan(
            upd, (state.params, state.target_params, state.opt_state),
            jax.random.split(k_learn, config.updates_per_iter))
        n = finished.sum()
        metrics = {k: v.mean() for k, v in m.items()}
        metrics.update(
            episode_return=jnp.where(finished, ret, 0.0).sum() / jnp.maximum(n, 1),
            episodes=n, epsilon=eps, env_steps=state.env_steps + E * config.num_steps,
        )
        clash = sorted(set(env_metrics) & set(metrics))
        if clash:
            raise ValueError(f"{env.name}.info_metrics returns {clash}, names QMIX logs itself; rename them")
        metrics.update({k: v.mean() for k, v in env_metrics.items()})
        new = QMIXState(params, target_params, opt_state, buf, env_state, ts, key,
                        state.env_steps + E * config.num_steps, state.iteration + 1)
        return new, metrics

    def maybe_iteration(state: QMIXState, _):
        """``iteration`` while ``state.iteration < num_iters``, else a no-op (the last chunk may be
        partial): no environment step and no update, so the budget is never overrun."""
        shapes = jax.eval_shape(iteration, state, None)[1]

        def skip(state):
            metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
            return state, {**metrics, "env_steps": state.env_steps}

        return jax.lax.cond(state.iteration < config.num_iters, lambda s: iteration(s, None), skip, state)

    def update(state: QMIXState):
        return jax.lax.scan(maybe_iteration, state, None, length=config.iters_per_chunk)

    return ChunkedQMIX(init, update, graphdef)


def make_train(config: QMIXConfig, env: envs.Environment, agent_net: AgentNet = AgentQ,
               aux_loss: AuxLoss | None = None, prior: Prior | None = None):
    """``train(key) -> {"state", "metrics"}`` running every online iteration (``[num_iters]``)."""
    chunked = make_chunked(dataclasses.replace(config, iters_per_chunk=max(config.num_iters, 1)), env, agent_net,
                           aux_loss, prior)

    def train(key):
        state, metrics = chunked.update(chunked.init(key))
        return {"state": state, "metrics": metrics}

    return train


def restricted(prior: Prior | None, legal: jax.Array, proposal: jax.Array) -> jax.Array:
    """``legal [..., A, N]`` narrowed by ``prior.restrict`` given the proposal ``[..., A]``."""
    return legal if prior is None or prior.restrict is None else prior.restrict(legal, proposal)


def greedy_action(q: jax.Array, proposal: jax.Array | None = None, bonus: float = 0.0) -> jax.Array:
    """``argmax`` of utilities ``[..., A, N]`` -> ``[..., A]`` int32; with a ``bonus`` the proposal
    ``[..., A]`` is kept unless another action's utility beats it by more than the bonus
    (conservative improvement over the prior)."""
    if bonus and proposal is not None:
        q = q + bonus * jax.nn.one_hot(proposal, q.shape[-1])
    return jnp.argmax(q, -1).astype(jnp.int32)


def greedy_policy(graphdef, params, prior: Prior | None = None):
    """``(policy_fn, carry)`` for ``rl.evaluate.evaluate``: greedy per-agent actions of the trained
    networks (``prior`` supplies the proposals, the restriction and the bonus it was trained with)."""

    def policy_fn(carry, key, ts):
        nets = nnx.merge(graphdef, params)
        proposal = prior.act(key, ts) if prior is not None else None
        q = nets.agent(agent_input(common.flat_obs(ts)), proposal)
        legal = restricted(prior, ts.legal_action_mask, proposal)
        return carry, greedy_action(jnp.where(legal, q, -1e9), proposal, prior.bonus if prior else 0.0)

    return policy_fn, jnp.zeros(())
