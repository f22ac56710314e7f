"""Wrappers: auto-reset and episode statistics, both pure and jit/vmap friendly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_reason.envs.core import Environment, SplitEnvironment, TimeStep


def where_done(done: jax.Array, fresh, old):
    """Per row of a batch: the pytree ``fresh`` where ``done`` ``[B]`` is True, else ``old``."""
    return jax.tree.map(lambda f, o: jnp.where(done.reshape(done.shape + (1,) * (o.ndim - 1)), f, o), fresh, old)


class Wrapper(Environment):
    """Forwards the static attributes of the wrapped environment.

    ``step`` checks the action like every ``Environment`` (``check_action``, against the wrapped
    environment's ``action_shape()``); a wrapper that changes the action space overrides
    ``action_shape`` / ``action_dim``.
    """

    def __init__(self, env: Environment):
        self.env = env

    def __getattr__(self, name):  # static attributes: num_agents, obs_shape, ...
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    @property
    def turn_based(self):
        return self.env.turn_based

    @property
    def illegal_action_rule(self):
        return self.env.illegal_action_rule

    @property
    def obs_dtype(self):
        return self.env.obs_dtype

    @property
    def action_dim(self):
        return self.env.action_dim

    @property
    def illegal_action_penalty(self):
        return self.env.illegal_action_penalty

    def action_shape(self) -> tuple[int, ...]:
        return self.env.action_shape()

    def info_metrics(self, info: dict) -> dict:
        return self.env.info_metrics(info)

    @property
    def name(self) -> str:
        return f"{type(self).__name__}({self.env.name})"


class AutoReset(Wrapper):
    """Resets a finished episode inside ``step``.

    The returned TimeStep carries the *final* step's reward/terminated/truncated/info
    and the *new* episode's obs, legal mask and current player. With
    ``final_obs=True`` the final step's observation is also kept in
    ``ts.info["final_obs"]`` (same shape as ``obs``; equal to ``obs`` after reset).

    The reset runs under ``lax.cond``: a single (un-vmapped) environment pays for it
    only when an episode ends; under ``vmap`` both branches run. For a
    ``SplitEnvironment`` the fresh *state* is selected first and the observation
    encoded once, so the per-step cost is one ``reset_state`` plus one
    ``observe``; for a plain ``Environment`` it is a full ``step`` plus a full
    ``reset`` (two encodings).

    ``batch_reset`` / ``batch_step`` run a whole batch (leading axis) from ONE key per call,
    instead of ``vmap`` over ``split(key, B)`` keys: the fresh episodes come from one
    ``env.reset_states(key, B)`` call (e.g. TicTacToe's coin flips are B bits of one
    ``jax.random.bits`` draw), so no per-environment key is split when the transition is
    deterministic. Same rules and shapes as ``vmap(step)``; the random draws differ.
    """

    def __init__(self, env: Environment, final_obs: bool = False):
        super().__init__(env)
        self.final_obs = final_obs

    def _with_final_obs(self, ts: TimeStep, final_obs) -> TimeStep:
        return ts.replace(info={**ts.info, "final_obs": final_obs}) if self.final_obs else ts

    def reset(self, key):
        state, ts = self.env.reset(key)
        return state, self._with_final_obs(ts, ts.obs)

    def step(self, key, state, action):
        if isinstance(self.env, SplitEnvironment):
            if self.env.deterministic_transition:  # transition ignores its key: no split needed
                return self._split_step(key, key, state, action)
            return self._split_step(*jax.random.split(key), state, action)
        step_key, reset_key = jax.random.split(key)
        state, ts = self.env.step(step_key, state, action)
        new_state, new_ts = jax.lax.cond(
            ts.done, lambda: self.env.reset(reset_key), lambda: (state, ts)
        )
        new_ts = new_ts.replace(
            reward=ts.reward, terminated=ts.terminated, truncated=ts.truncated, info=ts.info
        )
        return new_state, self._with_final_obs(new_ts, ts.obs)

    def batch_reset(self, key, num: int):
        """``num`` environments from one key: ``(state, ts)``, every leaf with a leading ``[num]``."""
        if num < 1:
            raise ValueError(f"batch_reset needs num >= 1, got {num}")
        if not isinstance(self.env, SplitEnvironment):
            return jax.vmap(self.reset)(jax.random.split(key, num))
        env: SplitEnvironment = self.env
        state = env.reset_states(key, num)
        zeros = jnp.zeros((num, env.num_agents), jnp.float32)
        false = jnp.zeros((num,), bool)
        ts = jax.vmap(env.timestep)(state, zeros, false, false, jax.vmap(env.reset_info)(state))
        return state, self._with_final_obs(ts, ts.obs)

    def batch_step(self, key, state, action):
        """Step a batch (leading axis of ``state`` and ``action``) with ONE key; returns ``(state, ts)``.

        A ``SplitEnvironment`` gets ``split(step_key, num)`` keys for ``transition`` (none when
        ``deterministic_transition``; then ``reset_key = key``), and every finished episode is
        replaced by its row of ``env.reset_states(reset_key, num)``; other environments run
        ``vmap(step)(split(key, num), ...)``. A pure function of ``key``.
        """
        action = jnp.asarray(action)
        if action.ndim < 1:
            raise ValueError(f"batch_step needs a leading batch axis on action, got shape {action.shape}")
        num = action.shape[0]
        if not isinstance(self.env, SplitEnvironment):
            return jax.vmap(self.step)(jax.random.split(key, num), state, action)
        env: SplitEnvironment = self.env
        if env.deterministic_transition:
            out = jax.vmap(env.transition, (None, 0, 0))(key, state, action)
            reset_key = key
        else:
            step_key, reset_key = jax.random.split(key)
            out = jax.vmap(env.transition)(jax.random.split(step_key, num), state, action)
        done = jnp.logical_or(out.terminated, out.truncated)
        new_state = where_done(done, env.reset_states(reset_key, num), out.state)
        ts = jax.vmap(env.timestep)(new_state, out.reward, out.terminated, out.truncated, out.info)
        final_obs = jax.vmap(env.observe)(out.state).obs if self.final_obs else None
        return new_state, self._with_final_obs(ts, final_obs)

    def _split_step(self, step_key, reset_key, state, action):
        env: SplitEnvironment = self.env
        out = env.transition(step_key, state, action)
        done = jnp.logical_or(out.terminated, out.truncated)
        new_state = jax.lax.cond(done, lambda: env.reset_state(reset_key), lambda: out.state)
        ts = env.timestep(new_state, out.reward, out.terminated, out.truncated, out.info)
        final_obs = env.observe(out.state).obs if self.final_obs else None
        return new_state, self._with_final_obs(ts, final_obs)


@struct.dataclass
class EpisodeStatsState:
    env_state: object
    episode_return: jax.Array  # [num_agents]
    episode_length: jax.Array  # int32 scalar
    returned_episode_return: jax.Array  # [num_agents], last finished episode
    returned_episode_length: jax.Array  # int32 scalar


class EpisodeStats(Wrapper):
    """Accumulates per-agent returns and lengths.

    Adds to ``ts.info``: ``returned_episode_return`` ``[num_agents]`` and
    ``returned_episode_length`` of the last finished episode, and
    ``returned_episode`` (bool, True on the step that finished one). Put it
    outside ``AutoReset``: ``EpisodeStats(AutoReset(env))``.
    """

    def _info(self, s: EpisodeStatsState, done):
        return {
            "returned_episode_return": s.returned_episode_return,
            "returned_episode_length": s.returned_episode_length,
            "returned_episode": done,
        }

    def reset(self, key):
        env_state, ts = self.env.reset(key)
        zeros = jnp.zeros((self.env.num_agents,), jnp.float32)
        s = EpisodeStatsState(env_state, zeros, jnp.int32(0), zeros, jnp.int32(0))
        return s, ts.replace(info={**ts.info, **self._info(s, jnp.bool_(False))})

    def step(self, key, state: EpisodeStatsState, action):
        env_state, ts = self.env.step(key, state.env_state, action)
        ret = state.episode_return + ts.reward
        length = state.episode_length + 1
        done = ts.done
        s = EpisodeStatsState(
            env_state=env_state,
            episode_return=jnp.where(done, 0.0, ret),
            episode_length=jnp.where(done, 0, length),
            returned_episode_return=jnp.where(done, ret, state.returned_episode_return),
            returned_episode_length=jnp.where(done, length, state.returned_episode_length),
        )
        return s, ts.replace(info={**ts.info, **self._info(s, done)})
