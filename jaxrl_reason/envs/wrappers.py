"""Wrappers: auto-reset and episode statistics, both pure and jit/vmap friendly."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_reason.envs.core import Environment, SplitEnvironment, TimeStep, custom_batched, materialize


def where_done(done: jax.Array, fresh, old):
    """Per row of a batch: the pytree ``fresh`` where ``done`` ``[B]`` is True, else ``old``."""
    return jax.tree.map(lambda f, o: jnp.where(done.reshape(done.shape + (1,) * (o.ndim - 1)), f, o), fresh, old)


def reset_done(done: jax.Array, stepped, fresh, capacities: tuple[int, ...] = ()):
    """The pytree ``stepped`` (leading axis ``[B]``) with the rows where ``done`` ``[B]`` is True replaced by
    fresh episodes: ``fresh(rows)`` gives them for the rows ``rows`` (``[C]`` int32), ``fresh(None)`` for all B.

    On CPU only what is needed is computed (``lax.switch`` on the number of finished rows): nothing when
    none ended; when at most ``C`` did for the smallest ``C`` of ``capacities`` (increasing) that fits, ``C``
    fresh rows (their indices compacted, then scattered in); else all B, selected where done. The switch
    also materialises ``stepped`` and the result once, so that XLA does not fuse (and repeat) the step into
    every element of the observation encoded from them. Other platforms select over all B fresh rows, as
    ``vmap`` of a ``lax.cond`` does: no conditional, whose predicate a GPU reads back to the host every step
    (not measured: no GPU was available).
    """
    num = done.shape[0]

    def all_rows():
        return where_done(done, fresh(None), stepped)

    def compacted(capacity):
        rows = jnp.nonzero(done, size=capacity, fill_value=num)[0]  # fill rows past the end: dropped
        new = fresh(jnp.minimum(rows, num - 1))
        return jax.tree.map(lambda s, f: s.at[rows].set(f, mode="drop"), stepped, new)

    def on_cpu():
        caps = sorted({c for c in capacities if 0 < c < num})
        n = jnp.sum(done, dtype=jnp.int32)
        index = jnp.where(n == 0, 0, 1 + sum((n > c).astype(jnp.int32) for c in caps))
        branches = [lambda: stepped, *[functools.partial(compacted, c) for c in caps], all_rows]
        return jax.lax.switch(index, branches)

    return jax.lax.platform_dependent(cpu=on_cpu, default=all_rows)


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

    One environment: the reset runs under ``lax.cond``, paid only when an episode ends. For a
    ``SplitEnvironment`` the fresh *state* is selected and the observation encoded once per step
    (``reset_state`` + one ``observe``); a plain ``Environment`` pays a full ``step`` and ``reset``.

    ``jax.vmap(step)`` runs the batched program (``_step_batch``, by a batching rule: ``core.custom_batched``)
    with, row for row, the results of the per-environment ``step``: the transition of the whole batch,
    fresh episodes only for the rows that ended (``reset_done``; an environment whose ``cheap_reset`` is set
    gets its reset computed for every row and selected, no compaction), the observation encoded once.

    ``batch_reset`` / ``batch_step`` run a whole batch (leading axis) from ONE key per call,
    instead of ``vmap`` over ``split(key, B)`` keys: the fresh episodes come from one
    ``env.reset_states(key, B)`` call (e.g. TicTacToe's coin flips are B bits of one
    ``jax.random.bits`` draw), so no per-environment key is split when the transition is
    deterministic. Same program and rules as ``vmap(step)``; the random draws differ.
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
        # built per call (a few Python objects at trace time) so that the wrapper stays copyable and picklable
        one = lambda select: lambda key, state, action: self._step_one(key, state, action, select)
        return custom_batched(one(False), self._vmap_step, one(True))(key, state, action)

    def _step_one(self, key, state, action, select: bool):
        """One environment (what ``vmap(step)`` reproduces row for row). The reset runs under ``lax.cond``;
        ``select``: both computed and selected instead (``step``'s derivative rule: ``custom_batched``)."""
        def if_done(done, fresh, kept):
            if select:
                return jax.tree.map(lambda f, k: jnp.where(done, f, k), fresh(), kept())
            return jax.lax.cond(done, fresh, kept)

        if isinstance(self.env, SplitEnvironment):
            env: SplitEnvironment = self.env
            # a deterministic transition ignores its key: the whole key goes to reset_state, no split
            step_key, reset_key = (key, key) if env.deterministic_transition else jax.random.split(key)
            out = env.transition(step_key, state, action)
            done = jnp.logical_or(out.terminated, out.truncated)
            new_state = if_done(done, lambda: env.reset_state(reset_key), lambda: out.state)
            ts = env.timestep(new_state, out.reward, out.terminated, out.truncated, out.info)
            final_obs = env.observe(out.state).obs if self.final_obs else None
            return new_state, self._with_final_obs(ts, final_obs)
        step_key, reset_key = jax.random.split(key)
        state, ts = self.env.step(step_key, state, action)
        new_state, new_ts = if_done(ts.done, lambda: self.env.reset(reset_key), lambda: (state, ts))
        return new_state, self._finish(new_ts, ts)

    def _finish(self, new_ts: TimeStep, ts: TimeStep) -> TimeStep:
        """The new episode's view with the final step's outcome (plain ``Environment``)."""
        new_ts = new_ts.replace(reward=ts.reward, terminated=ts.terminated, truncated=ts.truncated, info=ts.info)
        return self._with_final_obs(new_ts, ts.obs)

    def _vmap_step(self, key, state, action):
        """``vmap(step)``'s program: ``key`` ``[B]`` keys, ``state`` and ``action`` with a leading ``[B]``."""
        env = self.env
        if isinstance(env, SplitEnvironment) and env.deterministic_transition:
            step_keys, reset_keys = key, key
        else:
            step_keys, reset_keys = jax.vmap(jax.random.split, out_axes=1)(key)
        reset_one = env.reset_state if isinstance(env, SplitEnvironment) else env.reset
        fresh = lambda rows: jax.vmap(reset_one)(reset_keys if rows is None else reset_keys[rows])
        num = action.shape[0]
        cheap = isinstance(env, SplitEnvironment) and env.cheap_reset
        capacities = () if cheap else (num // 8, num // 4, num // 2)
        return self._step_batch(step_keys, fresh, state, action, capacities=capacities)

    def _step_batch(self, step_keys, fresh, state, action, *, shared_key: bool = False,
                    capacities: tuple[int, ...] = ()):
        """The batched step behind ``vmap(step)`` and ``batch_step``: leading axis ``[B]`` on ``state`` and
        ``action``; ``step_keys`` the ``[B]`` transition keys (one key for all rows with ``shared_key``);
        ``fresh(rows)`` -> fresh episodes (``reset_state`` rows, or ``(state, ts)`` of ``reset`` for a plain
        ``Environment``) for the rows ``rows`` (``[C]`` int32, or ``None`` for all B); ``capacities``: see
        ``reset_done``. Returns ``(state, ts)``."""
        env = self.env
        key_axis = None if shared_key else 0
        action = materialize(action)
        if isinstance(env, SplitEnvironment):
            out = jax.vmap(env.transition, (key_axis, 0, 0))(step_keys, state, action)
            done = jnp.logical_or(out.terminated, out.truncated)
            new_state = reset_done(done, out.state, fresh, capacities)
            ts = jax.vmap(env.timestep)(new_state, out.reward, out.terminated, out.truncated, out.info)
            final_obs = jax.vmap(env.observe)(out.state).obs if self.final_obs else None
            return new_state, self._with_final_obs(ts, final_obs)
        state, ts = jax.vmap(env.step, (key_axis, 0, 0))(step_keys, state, action)
        new_state, new_ts = reset_done(ts.done, (state, ts), fresh, capacities)
        return new_state, self._finish(new_ts, ts)

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
            step_keys, reset_key = key, key
        else:
            step_key, reset_key = jax.random.split(key)
            step_keys = jax.random.split(step_key, num)
        fresh = lambda rows: env.reset_states(reset_key, num)  # rows is None: no capacities given
        return self._step_batch(step_keys, fresh, state, action, shared_key=env.deterministic_transition)


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
