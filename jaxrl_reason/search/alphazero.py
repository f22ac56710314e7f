"""AlphaZero-style agent on mctx: Gumbel MuZero search with the real simulator as the model.

The search tree's embedding is the environment state itself; ``recurrent_fn`` steps the real
environment (vmapped), masks illegal actions in the prior it returns, gives the mover's reward
and uses discount ``-1`` (``0`` once the game is over) because turns alternate in these
two-player zero-sum games, so a child's value is from the opponent's point of view.

Training (PureJaxRL style, one jitted ``iteration``): ``num_envs`` self-play games advance
``num_steps`` moves with search (auto-reset; moves sampled from the improved policy, and
with probability ``explore_eps`` a uniformly random legal move, for state coverage). Policy
targets are the search's action weights. Value targets (``value_target``):

- ``"search"`` (default): the best root Q-value among the actions the search visited, i.e. a
  one-step exact lookahead through the real simulator backed up from the network (and deeper
  search). Iterated, this is approximate minimax value iteration; it does not depend on how the
  game continued, so exploratory moves do not bias it.
- ``"outcome"``: the game's final result for the mover (classic AlphaZero; only steps whose
  episode ended inside the rollout count). With a small search this can lock into a
  self-consistent wrong value (e.g. "the first player always wins"), which is what it did on
  TicTacToe here.

Then ``sgd_steps`` Adam steps on ``cross-entropy + value_coef * MSE``. ``mesh="data=8"`` (in a
multi-process run ``mesh=None``: data over every device of every process) splits the games, and so the
searches, over the data axis; the result is the one-device one up to float rounding. Network: the shared
``MLPActorCritic`` (value passed through ``tanh``) on the mover's observation.
The agent (``AlphaZero.agent``) is network + search at play time.

Env requirements: two players, alternating turns, ``state.current_player`` available, and a
no-op ``step`` on finished games (TicTacToe, Kuhn Poker and Negotiation here).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import mctx
import optax
from flax import nnx, struct

from jaxrl_reason import envs
from jaxrl_reason.envs.games.arena import mover_view
from jaxrl_reason.models.policies import make_policy, masked_logits
from jaxrl_reason.parallel.mesh import data_mesh, replicate, split_along, split_batch
from jaxrl_reason.utils.guard import guard_optimizer
from jaxrl_reason.utils.validation import check_hyperparameters


VALUE_TARGETS = ("search", "outcome")


@dataclasses.dataclass(frozen=True)
class AlphaZeroConfig:
    env: str = "tictactoe"
    num_envs: int = 128
    num_steps: int = 16
    num_simulations: int = 32
    max_num_considered_actions: int = 16
    hidden: tuple[int, ...] = (128, 128)
    lr: float = 3e-3
    sgd_steps: int = 8
    minibatch_size: int = 512
    value_coef: float = 1.0
    #: self-play moves are sampled from the search's improved policy (else the Gumbel action)
    sample_actions: bool = True
    #: probability of a uniformly random legal self-play move (exploration, data only)
    explore_eps: float = 0.0
    value_target: str = "search"
    num_iterations: int = 60
    seed: int = 0
    mesh: str | None = None  # e.g. "data=8": the self-play games split over the data axis (multi-process: over all)

    def __post_init__(self):
        check_hyperparameters(self)
        for f in ("num_envs", "num_steps", "num_simulations", "sgd_steps", "minibatch_size",
                  "num_iterations", "max_num_considered_actions"):
            if getattr(self, f) < 1:
                raise ValueError(f"AlphaZeroConfig.{f} must be >= 1, got {getattr(self, f)}")
        if self.value_target not in VALUE_TARGETS:
            raise ValueError(f"value_target must be one of {VALUE_TARGETS}, got {self.value_target!r}")
        if self.minibatch_size > self.num_envs * self.num_steps:
            raise ValueError("minibatch_size must be <= num_envs * num_steps")


Evaluate = Callable[[object, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def uniform_evaluate(params, obs, mask):
    """Uniform prior and zero value (pure search, as in the mctx-on-pgx anchor)."""
    del params
    return jnp.zeros(mask.shape), jnp.zeros(obs.shape[:1])


def make_recurrent_fn(env, evaluate: Evaluate):
    """``recurrent_fn(params, key, action [B], state) -> (RecurrentFnOutput, state)``."""

    def recurrent_fn(params, key, action, state):
        b = action.shape[0]
        mover = state.current_player
        state, ts = jax.vmap(env.step)(jax.random.split(key, b), state, action)
        reward = jnp.where(mover == 0, ts.reward[:, 0], ts.reward[:, 1])
        obs, mask = mover_view(ts)
        logits, value = evaluate(params, obs, mask)
        logits = jnp.where(mask, logits, -1e9)  # finite: terminal nodes have no legal action
        done = ts.terminated
        out = mctx.RecurrentFnOutput(
            reward=reward,
            discount=jnp.where(done, 0.0, -1.0),
            prior_logits=logits,
            value=jnp.where(done, 0.0, value),
        )
        return out, state

    return recurrent_fn


def search(env, evaluate, params, key, state, ts, num_simulations: int,
           max_num_considered_actions: int = 16, gumbel_scale: float = 1.0) -> mctx.PolicyOutput:
    """One Gumbel MuZero search from each of a batch of states (``state``/``ts`` batched)."""
    obs, mask = mover_view(ts)
    logits, value = evaluate(params, obs, mask)
    root = mctx.RootFnOutput(prior_logits=jnp.where(mask, logits, -1e9), value=value, embedding=state)
    return mctx.gumbel_muzero_policy(
        params, key, root, make_recurrent_fn(env, evaluate),
        num_simulations=num_simulations, invalid_actions=~mask,
        max_num_considered_actions=max_num_considered_actions, gumbel_scale=gumbel_scale,
    )


def network_evaluate(graphdef) -> Evaluate:
    """Evaluate with an ``MLPActorCritic`` given by ``graphdef`` and its params."""

    def evaluate(params, obs, mask):
        model = nnx.merge(graphdef, params)
        _, logits, value = model(None, obs, None)
        return masked_logits(logits, mask), jnp.tanh(value)

    return evaluate


@struct.dataclass
class AlphaZeroState:
    params: object
    opt_state: object
    env_state: object
    ts: object
    key: jax.Array
    iteration: jax.Array


class AlphaZero:
    """Builds the network, ``init(key)``, the jitted ``iteration(state)`` and ``agent``."""

    def __init__(self, config: AlphaZeroConfig, env=None):
        self.config = config
        self.env = env if env is not None else envs.make(config.env)
        if self.env.num_agents != 2 or not self.env.turn_based:
            raise ValueError("AlphaZero needs a two-player turn-based environment")
        model = make_policy("mlp", int(self.env.obs_shape[0]), self.env.num_actions,
                            rngs=nnx.Rngs(0), hidden=config.hidden)
        self.graphdef, _ = nnx.split(model)
        self.evaluate = network_evaluate(self.graphdef)
        self.optimizer = guard_optimizer(optax.adam(config.lr))
        self.auto = envs.AutoReset(self.env)
        self.mesh = data_mesh(config.mesh, {"num_envs": config.num_envs}, "AlphaZeroConfig")
        self.iteration = jax.jit(self._iteration)

    def init(self, key) -> AlphaZeroState:
        k_net, k_env, key = jax.random.split(key, 3)
        model = make_policy("mlp", int(self.env.obs_shape[0]), self.env.num_actions,
                            rngs=nnx.Rngs(k_net), hidden=self.config.hidden)
        params = nnx.state(model)
        env_state, ts = split_batch(jax.vmap(self.auto.reset)(jax.random.split(k_env, self.config.num_envs)),
                                    self.mesh)
        rest = replicate((params, self.optimizer.init(params), key, jnp.int32(0)), self.mesh)
        return AlphaZeroState(rest[0], rest[1], env_state, ts, *rest[2:])

    def agent(self, num_simulations: int, gumbel_scale: float = 0.0):
        """Batched player ``fn(params) -> (key, state, ts) -> action`` for ``arena.play``."""

        def make(params):
            def act(key, state, ts):
                out = search(self.env, self.evaluate, params, key, state, ts, num_simulations,
                             self.config.max_num_considered_actions, gumbel_scale)
                return out.action.astype(jnp.int32)

            return act

        return make

    def _loss(self, params, obs, mask, target, z, valid):
        logits, value = self.evaluate(params, obs, mask)
        ce = -(target * jax.nn.log_softmax(logits)).sum(-1).mean()
        v_loss = (jnp.square(value - z) * valid).sum() / jnp.maximum(valid.sum(), 1.0)
        return ce + self.config.value_coef * v_loss, (ce, v_loss)

    def _iteration(self, s: AlphaZeroState):
        c = self.config
        key, k_roll, k_sgd = jax.random.split(s.key, 3)

        def step(carry, key):
            env_state, ts = split_along(carry, self.mesh, 0)  # each device searches its slice of the games
            k_search, k_env = jax.random.split(key)
            out = search(self.env, self.evaluate, s.params, k_search, env_state, ts,
                         c.num_simulations, c.max_num_considered_actions)
            obs, mask = mover_view(ts)
            k_env, k_act, k_eps, k_rand = jax.random.split(k_env, 4)
            action = out.action
            if c.sample_actions:
                logw = jnp.where(mask, jnp.log(jnp.maximum(out.action_weights, 1e-12)), -1e9)
                action = jax.random.categorical(k_act, logw)
            if c.explore_eps > 0:
                rand = jax.random.categorical(k_rand, jnp.where(mask, 0.0, -1e9))
                action = jnp.where(jax.random.uniform(k_eps, action.shape) < c.explore_eps, rand, action)
            env_state, nts = jax.vmap(self.auto.step)(jax.random.split(k_env, c.num_envs), env_state, action)
            summary = out.search_tree.summary()
            q_best = jnp.where(summary.visit_counts > 0, summary.qvalues, -jnp.inf).max(-1)
            rec = (obs, mask, out.action_weights, ts.current_player, nts.reward, nts.done, q_best)
            return (env_state, nts), rec

        (env_state, ts), (obs, mask, target, mover, reward, done, q_best) = jax.lax.scan(
            step, (s.env_state, s.ts), jax.random.split(k_roll, c.num_steps))

        def backward(carry, x):  # final outcome per seat; valid once the episode end is seen
            ret, seen = carry
            r, d = x
            ret = r + jnp.where(d[:, None], 0.0, ret)
            seen = d | seen
            return (ret, seen), (ret, seen)

        init = (jnp.zeros((c.num_envs, 2)), jnp.zeros((c.num_envs,), bool))
        _, (ret, valid) = jax.lax.scan(backward, init, (reward, done), reverse=True)
        z = jnp.where(mover == 0, ret[..., 0], ret[..., 1])
        seen = valid
        if c.value_target == "search":
            z, valid = jnp.clip(q_best, -1.0, 1.0), jnp.ones_like(valid)
        flat = lambda x: x.reshape((-1,) + x.shape[2:])
        data = tuple(map(flat, (obs, mask, target, z, valid.astype(jnp.float32))))
        n = data[0].shape[0]

        def sgd(carry, key):
            params, opt_state = carry
            idx = jax.random.choice(key, n, (c.minibatch_size,), replace=False)
            batch = tuple(x[idx] for x in data)
            (loss, (ce, vl)), grads = jax.value_and_grad(self._loss, has_aux=True)(params, *batch)
            updates, opt_state = self.optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), (loss, ce, vl)

        (params, opt_state), (loss, ce, vl) = jax.lax.scan(
            sgd, (s.params, s.opt_state), jax.random.split(k_sgd, c.sgd_steps))
        metrics = {"loss": loss.mean(), "policy_ce": ce.mean(), "value_mse": vl.mean(),
                   "episodes": done.sum(), "mean_abs_outcome": jnp.abs(ret[..., 0] * seen).sum() / jnp.maximum(seen.sum(), 1),
                   "mean_value_target": z.mean()}
        return AlphaZeroState(params, opt_state, env_state, ts, key, s.iteration + 1), metrics
