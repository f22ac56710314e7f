"""The Environment protocol shared by every environment (see docs/design.md).

An environment is a stateless object holding static configuration; all dynamic
data lives in a ``state`` pytree. ``reset`` and ``step`` are pure functions of
(key, state, action), so they compose with ``jit``, ``vmap`` and ``lax.scan``.
"""

from __future__ import annotations

import abc
import functools
import inspect
import operator
from typing import Any, Callable, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

PRNGKey = jax.Array
State = Any

#: Rules an environment may follow when the acting player picks an illegal action.
ILLEGAL_ACTION_RULES = ("penalty", "none")


@struct.dataclass
class TimeStep:
    """What every agent sees after ``reset`` or ``step``.

    Attributes:
      obs: ``[num_agents, *obs_shape]`` each agent's own view.
      reward: ``[num_agents]`` float32 reward of the last transition.
      terminated: bool scalar, the episode ended by the rules.
      truncated: bool scalar, the episode was cut by a time limit.
      legal_action_mask: ``[num_agents, num_actions]`` bool.
      current_player: int32 scalar; ``-1`` for simultaneous-move environments.
      info: dict of extra arrays (wrappers put e.g. ``final_obs`` here).
    """

    obs: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    legal_action_mask: jax.Array
    current_player: jax.Array
    info: dict = struct.field(default_factory=dict)

    @property
    def done(self) -> jax.Array:
        return jnp.logical_or(self.terminated, self.truncated)


class Environment(abc.ABC):
    """Base class of every environment.

    Subclasses set the static attributes in ``__init__`` and implement
    ``reset`` and ``step``. ``illegal_action_rule`` documents what happens when
    the acting player picks an action outside ``legal_action_mask``:

    - ``"penalty"``: the episode terminates, the offender gets
      ``-illegal_action_penalty`` and every other agent gets 0;
    - ``"none"``: every action is always legal (the mask is all True).

    Input checks, installed on every subclass (users' ones too) by ``__init_subclass__``:

    - ``step`` and ``transition`` run ``check_action`` first: the action's shape must be
      ``action_shape()`` and its dtype integer (discrete) or floating (``action_dim`` set); both
      are static, so a mismatch raises at trace time (``ValueError`` / ``TypeError``), under
      ``jit`` or not. Python ints and numpy scalars are fine (converted by ``jnp.asarray``).
    - ``__init__`` arguments annotated ``int`` (or ``int | None``) must be integers: ``2.5`` or
      ``True`` raise ``TypeError``; numpy ints are fine.
    - Non-finite continuous actions are the environment's to handle, documented in its docstring
      (the swarm: a non-finite component counts as 0 and ``info["nonfinite_action"]`` flags the agent);
      states must stay finite.
    """

    num_agents: int
    num_actions: int
    obs_shape: tuple[int, ...]
    obs_dtype: ClassVar[Any] = jnp.float32
    turn_based: ClassVar[bool] = True
    #: ``[num_agents, act_dim]`` continuous actions when set; else discrete actions.
    action_dim: int | None = None
    illegal_action_rule: ClassVar[str] = "penalty"
    illegal_action_penalty: float = 1.0
    #: Upper bound on episode length in steps (used by tests and wrappers).
    max_episode_steps: int

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for method in ("step", "transition"):
            fn = cls.__dict__.get(method)
            if inspect.isfunction(fn) and not getattr(fn, "__isabstractmethod__", False):
                setattr(cls, method, _action_checked(fn))
        if inspect.isfunction(cls.__dict__.get("__init__")):
            cls.__init__ = _int_args_checked(cls.__init__)

    @property
    def name(self) -> str:
        return type(self).__name__

    @abc.abstractmethod
    def reset(self, key: PRNGKey) -> tuple[State, TimeStep]:
        """Start an episode. Returns ``(state, timestep)``."""

    @abc.abstractmethod
    def step(self, key: PRNGKey, state: State, action: jax.Array) -> tuple[State, TimeStep]:
        """Advance one step. ``action`` has shape ``action_shape()``: a scalar for turn-based games
        (the current player's move), ``[num_agents]`` for simultaneous ones, ``[num_agents,
        action_dim]`` for continuous ones; integer dtype, floating when continuous (checked first)."""

    def info_metrics(self, info: dict) -> dict[str, jax.Array]:
        """The environment's own per-step metrics, read from a timestep's ``info`` (scalars per
        environment). Trainers average these over a rollout and log them next to the return, so a
        generic trainer never names an environment's keys. Default: none."""
        return {}

    def action_shape(self) -> tuple[int, ...]:
        """Shape of the ``action`` argument of ``step``."""
        if self.turn_based:
            return ()
        if self.action_dim is not None:
            return (self.num_agents, self.action_dim)
        return (self.num_agents,)

    def check_action(self, action, where: str = "step") -> jax.Array:
        """``action`` as an array, once its static shape (``action_shape()``) and dtype (integer, or
        floating when ``action_dim`` is set) are checked; raises ``ValueError`` / ``TypeError``."""
        action = jnp.asarray(action)
        want_shape = tuple(self.action_shape())
        continuous = self.action_dim is not None
        kind, kind_name = (jnp.floating, "a floating") if continuous else (jnp.integer, "an integer")
        if action.shape != want_shape or not jnp.issubdtype(action.dtype, kind):
            error = ValueError if action.shape != want_shape else TypeError
            raise error(
                f"{self.name}.{where}: action must have shape {want_shape} and {kind_name} dtype "
                f"({'continuous' if continuous else 'discrete'} actions), got shape {action.shape} "
                f"dtype {action.dtype}"
            )
        return action

    def __repr__(self) -> str:
        return (
            f"{self.name}(num_agents={self.num_agents}, num_actions={self.num_actions}, "
            f"obs_shape={self.obs_shape})"
        )


def _action_checked(fn):
    """``fn(self, key, state, action)`` with ``self.check_action`` run on ``action`` first."""
    if getattr(fn, "_checks_action", False):
        return fn

    @functools.wraps(fn)
    def method(self, key, state, action):
        return fn(self, key, state, self.check_action(action, fn.__name__))

    method._checks_action = True
    return method


#: ``__init__`` annotations checked by ``_int_args_checked``: annotation -> whether None is allowed.
_INT_ANNOTATIONS = {"int": False, "int | None": True, "Optional[int]": True}


def _int_args_checked(init):
    """``init`` rejecting non-integer values (floats, bools) of arguments annotated ``int``."""
    if getattr(init, "_checks_ints", False):
        return init

    @functools.wraps(init)
    def checked(self, *args, **kwargs):
        sig = inspect.signature(checked)  # at call time: follows a ``__signature__`` set later (Swarm)
        for name, value in sig.bind(self, *args, **kwargs).arguments.items():
            param = sig.parameters[name]
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            ann = param.annotation
            none_ok = _INT_ANNOTATIONS.get(ann if isinstance(ann, str) else inspect.formatannotation(ann))
            if none_ok is not None and not (none_ok and value is None) and not _is_int(value):
                raise TypeError(f"{type(self).__name__}: {name} must be an integer, got {value!r}")
        init(self, *args, **kwargs)

    checked._checks_ints = True
    return checked


def _is_int(value) -> bool:
    """True for Python / numpy integers (and integer 0-d arrays), False for bools and floats."""
    if isinstance(value, (bool, np.bool_)) or getattr(value, "dtype", None) == bool:
        return False
    try:
        operator.index(value)
        return True
    except TypeError:
        return False


class Observation(NamedTuple):
    """What ``SplitEnvironment.observe`` derives from a state."""

    obs: jax.Array  # [num_agents, *obs_shape]
    legal_action_mask: jax.Array  # [num_agents, num_actions] bool
    current_player: jax.Array  # int32 scalar, -1 for simultaneous moves


class Transition(NamedTuple):
    """What ``SplitEnvironment.transition`` returns: the next state and the step's outcome."""

    state: State
    reward: jax.Array  # [num_agents] float32
    terminated: jax.Array  # bool scalar
    truncated: jax.Array  # bool scalar
    info: dict


class SplitEnvironment(Environment):
    """An environment written as three pure pieces; ``reset`` and ``step`` are derived.

    - ``reset_state(key) -> state``: a fresh episode, no observation computed;
    - ``transition(key, state, action) -> Transition``: dynamics, rewards, illegal-action rule;
    - ``observe(state) -> Observation``: the (possibly expensive) observation encoding.

    Written this way, ``AutoReset`` selects the fresh state where an episode ended and encodes the
    observation once per step, instead of encoding both the stepped and the reset state (which
    ``vmap`` forces for a plain ``Environment``). ``transition``'s ``info`` must have the same keys
    and shapes as ``reset_info(state)`` (default: no keys).
    """

    #: True when ``transition`` ignores its key (all chance happens in ``reset_state``): ``AutoReset``
    #: then hands its whole key to ``reset_state`` instead of splitting it every step.
    deterministic_transition: ClassVar[bool] = False
    #: True when ``reset_state`` is a few elementwise ops (no threefry hash, no gather): ``vmap(AutoReset.step)``
    #: then computes it for every row and selects it where an episode ended (``reset_done`` without
    #: capacities) instead of compacting the ended rows first, which costs more than such a reset.
    cheap_reset: ClassVar[bool] = False

    @abc.abstractmethod
    def reset_state(self, key: PRNGKey) -> State:
        """A fresh episode's state."""

    @abc.abstractmethod
    def transition(self, key: PRNGKey, state: State, action: jax.Array) -> Transition:
        """Advance one step without encoding the observation."""

    @abc.abstractmethod
    def observe(self, state: State) -> Observation:
        """Every agent's observation, legal mask and the player to act."""

    def reset_states(self, key: PRNGKey, num: int) -> State:
        """``num`` fresh states (leaves ``[num, ...]``) from one key: the batched ``reset_state``.

        Default: ``vmap(reset_state)(split(key, num))``. An environment whose reset needs only a few
        random bits overrides it to draw them for the whole batch in one call (``AutoReset.batch_step``
        then costs no per-environment key split); it must stay a pure function of ``(key, num)``.
        """
        return jax.vmap(self.reset_state)(jax.random.split(key, num))

    def reset_info(self, state: State) -> dict:
        """``info`` of a fresh episode; same structure as ``transition``'s."""
        return {}

    def timestep(self, state: State, reward, terminated, truncated, info) -> TimeStep:
        """Assemble the TimeStep of ``state`` (encodes the observation)."""
        view = self.observe(state)
        return TimeStep(
            obs=view.obs,
            reward=jnp.asarray(reward, jnp.float32),
            terminated=jnp.asarray(terminated, bool),
            truncated=jnp.asarray(truncated, bool),
            legal_action_mask=view.legal_action_mask,
            current_player=jnp.asarray(view.current_player, jnp.int32),
            info=info,
        )

    def reset(self, key: PRNGKey) -> tuple[State, TimeStep]:
        state = self.reset_state(key)
        zeros = jnp.zeros((self.num_agents,), jnp.float32)
        return state, self.timestep(state, zeros, False, False, self.reset_info(state))

    def step(self, key: PRNGKey, state: State, action: jax.Array) -> tuple[State, TimeStep]:
        out = self.transition(key, state, action)
        return out.state, self.timestep(out.state, out.reward, out.terminated, out.truncated, out.info)


def key_hash(key: PRNGKey) -> jax.Array:
    """uint32 hash of one key's data (any shape of key array: one hash per key) in a dozen integer ops instead
    of a threefry hash: the words folded together (``h * 0x9E3779B1 ^ word``), then MurmurHash3's 32-bit
    finaliser. For environments that need a few random bits at reset (TicTacToe's first player): the keys
    an environment receives are outputs of ``split`` / ``fold_in`` (threefry already mixed them), so their
    bits are uniform and independent row to row; the finaliser also spreads raw ``key(seed)`` keys (fair,
    neighbouring seeds uncorrelated). The draws made from the key by ``jax.random`` (threefry of the key with
    a counter) are unrelated to them."""
    words = jax.random.key_data(key).astype(jnp.uint32)
    h = functools.reduce(lambda h, w: h * jnp.uint32(0x9E3779B1) ^ w, [words[..., i] for i in range(words.shape[-1])])
    for shift, mult in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
        h = (h ^ (h >> shift)) * jnp.uint32(mult)
    return h ^ (h >> 16)


def materialize(x: jax.Array) -> jax.Array:
    """``x`` (leading axis ``[B]``), computed once: an identity gather along the leading axis. XLA's fusion
    does not duplicate a gather into its consumers, while it copies a cheap elementwise producer into every
    consumer fusion: without this, a caller's action computation (e.g. a random legal-action sampler) would
    be recomputed inside each output of a batched step (on CPU, TicTacToe's random-action loop at B = 4096
    took 1.5x as long)."""
    return x[jnp.arange(x.shape[0])]


def custom_batched(per_env: Callable, batched: Callable, jvp_of: Callable | None = None) -> Callable:
    """``per_env`` (a pure function of one environment's arrays) whose ``jax.vmap`` runs ``batched``.

    ``batched(*args)`` gets every argument with a leading batch axis ``[B, ...]`` (those the vmap left
    unbatched are broadcast to it first) and returns every output batched; row for row it must give what
    ``per_env`` gives (a batching rule, ``jax.custom_batching.custom_vmap``, so a user's ``jax.vmap`` reaches a
    hand-batched program). Nested vmaps batch ``batched`` itself with vmap. Differentiation goes through
    ``per_env``: ``custom_vmap`` alone has no derivative rules, so the function is also a ``jax.custom_jvp``
    whose rule is ``jax.jvp(jvp_of, ...)``; forward mode (``jvp``, ``jacfwd``) uses it directly and reverse
    mode (``grad``, ``vjp``) linearizes and transposes it, batched or not. ``jvp_of`` (default ``per_env``):
    the same function written without ``lax.cond`` (a cond's jvp, batched afterwards when the rule runs under
    ``vmap``, becomes a select that reverse mode cannot transpose).
    """
    fun = jax.custom_batching.custom_vmap(per_env)

    @fun.def_vmap
    def rule(axis_size, in_batched, *args):
        args = jax.tree.map(lambda x, b: x if b else jnp.broadcast_to(x, (axis_size, *x.shape)), args,
                            tuple(in_batched))
        out = batched(*args)
        return out, jax.tree.map(lambda _: True, out)

    fun = jax.custom_jvp(fun)
    fun.defjvp(lambda primals, tangents: jax.jvp(jvp_of or per_env, primals, tangents))
    return functools.wraps(per_env)(fun)


def random_legal_action(key: PRNGKey, env: Environment, ts: TimeStep) -> jax.Array:
    """Uniformly random legal action(s) for ``ts`` (one environment, not batched).

    Turn-based: int32 scalar for ``ts.current_player``. Simultaneous: ``[num_agents]``.
    """
    logits = jnp.where(ts.legal_action_mask, 0.0, -jnp.inf)
    if env.turn_based:
        player = jnp.maximum(ts.current_player, 0)
        return jax.random.categorical(key, logits[player]).astype(jnp.int32)
    if env.action_dim is not None:
        return jax.random.uniform(key, env.action_shape(), minval=-1.0, maxval=1.0)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def illegal_action_outcome(num_agents: int, offender: jax.Array, penalty: float) -> jax.Array:
    """Reward vector ``[num_agents]`` for the ``"penalty"`` rule: ``-penalty`` to the offender."""
    return jnp.where(jnp.arange(num_agents) == offender, -penalty, 0.0).astype(jnp.float32)
