"""Fault injection on environment inputs: wrong action shapes / dtypes, NaN actions, non-integer counts.

Shape and dtype are static, so the checks must fire while tracing: ``jax.eval_shape`` and ``jax.jit``
raise before anything is compiled, which keeps these tests fast.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_reason.solvers  # noqa: F401  (registers its fgmres_blocksize env: every registered env is swept)
from jaxrl_reason import envs

CASES = [
    (name, kwargs)
    for name in envs.registered_names()
    for kwargs in getattr(envs.env_class(name), "conformance_variants", ({},))
]
IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in kw.items()) or 'default'}" for n, kw in CASES]
KEY = jax.random.key(0)


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def env_state(request):
    name, kwargs = request.param
    env = envs.make(name, **kwargs)
    state, ts = jax.eval_shape(env.reset, KEY)  # abstract: no compilation
    return env, state, ts


def _good(env):
    dtype = jnp.float32 if env.action_dim is not None else jnp.int32
    return jnp.zeros(env.action_shape(), dtype)


def _bad_actions(env):
    """``(label, action)`` pairs that must be rejected."""
    good = _good(env)
    bad = [("extra-axis", good[None]), ("trailing-axis", good[..., None])]
    if good.ndim:
        bad.append(("one-too-many", jnp.zeros((good.shape[0] + 1, *good.shape[1:]), good.dtype)))
    if env.action_dim is None:
        bad += [("float", good.astype(jnp.float32)), ("bool", good.astype(bool))]
        if not good.ndim:
            bad.append(("python-float", 1.0))
    else:
        bad.append(("int", good.astype(jnp.int32)))
    return bad


def test_bad_actions_raise_at_trace_time(env_state):
    env, state, _ = env_state
    step = lambda s, a: env.step(KEY, s, a)
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), state)  # a concrete state, for eager calls
    for label, action in _bad_actions(env):
        with pytest.raises((TypeError, ValueError), match=rf"{env.name}\.step: action must have shape"):
            jax.jit(step)(zeros, action)
        with pytest.raises((TypeError, ValueError), match="action must have shape"):
            jax.eval_shape(step, state, action)  # abstract state: fails while tracing or not at all
        with pytest.raises((TypeError, ValueError), match="action must have shape"):
            env.step(KEY, zeros, action)  # eagerly: raises before any computation


def test_bad_actions_raise_through_wrappers_and_vmap(env_state):
    env, state, _ = env_state
    wrapped = envs.EpisodeStats(envs.AutoReset(env))
    wstate, _ = jax.eval_shape(wrapped.reset, KEY)
    batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct((3, *x.shape), x.dtype), wstate)
    keys = jax.random.split(KEY, 3)
    for label, action in _bad_actions(env):
        action = jnp.asarray(action)
        with pytest.raises((TypeError, ValueError), match="action must have shape"):
            jax.eval_shape(wrapped.step, KEY, wstate, action)
        rows = jnp.broadcast_to(action, (3, *action.shape))
        with pytest.raises((TypeError, ValueError), match="action must have shape"):
            jax.eval_shape(jax.vmap(wrapped.step), keys, batch, rows)
        auto = envs.AutoReset(env)
        astate = jax.tree.map(lambda x: jax.ShapeDtypeStruct((3, *x.shape), x.dtype), state)
        with pytest.raises((TypeError, ValueError), match="action must have shape"):
            jax.eval_shape(auto.batch_step, KEY, astate, rows)


def test_good_actions_still_work(env_state):
    env, state, _ = env_state
    good = _good(env)
    jax.eval_shape(lambda s, a: env.step(KEY, s, a), state, good)
    if env.action_dim is None:  # any integer dtype, numpy scalars and Python ints
        for a in (good.astype(jnp.int8), good.astype(jnp.uint8), np.asarray(good, np.int64)):
            jax.eval_shape(lambda s, a: env.step(KEY, s, a), state, a)
        if not good.ndim:
            jax.eval_shape(lambda s: env.step(KEY, s, 0), state)
            jax.eval_shape(lambda s: env.step(KEY, s, np.int64(0)), state)
    else:
        jax.eval_shape(lambda s, a: env.step(KEY, s, a), state, good.astype(jnp.bfloat16))
    wrapped = envs.EpisodeStats(envs.AutoReset(env))
    wstate, _ = jax.eval_shape(wrapped.reset, KEY)
    jax.eval_shape(wrapped.step, KEY, wstate, good)
    assert wrapped.action_shape() == env.action_shape() and wrapped.action_dim == env.action_dim


def test_user_subclass_is_checked_too():
    catch = envs.make("catch", rows=3, columns=3)

    class Mine(envs.Environment):  # written by a user: no call to check_action anywhere
        num_agents, num_actions, obs_shape, max_episode_steps = 1, 3, (9,), 2

        def reset(self, key):
            return catch.reset(key)

        def step(self, key, state, action):
            return catch.transition(key, state, action).state, None

    env = Mine()
    state, _ = env.reset(KEY)
    env.step(KEY, state, 1)
    with pytest.raises(TypeError, match=r"Mine\.step: .*got shape \(\) dtype float32"):
        env.step(KEY, state, 1.0)
    with pytest.raises(ValueError, match=r"Mine\.step: action must have shape \(\)"):
        jax.jit(env.step)(KEY, state, jnp.zeros((2,), jnp.int32))


def _nan_swarm_step(**kwargs):
    env = envs.make("swarm", control="continuous", num_agents=4, max_steps=5, **kwargs)
    state, _ = jax.jit(env.reset)(KEY)
    action = np.full(env.action_shape(), 0.5, np.float32)
    action[0, 0], action[1, :], action[-1, 1] = np.nan, np.inf, -np.inf
    zeroed = np.where(np.isfinite(action), action, 0.0)
    step = jax.jit(env.step)
    return step(KEY, state, jnp.asarray(action)), step(KEY, state, jnp.asarray(zeroed))


@pytest.mark.parametrize("kwargs", [{}, {"adversary_control": "learned", "dynamics": "point_mass"}],
                         ids=["uavs", "learned-pursuers"])
def test_swarm_nonfinite_action_counts_as_zero_and_is_flagged(kwargs):
    (state, ts), (ref_state, ref_ts) = _nan_swarm_step(**kwargs)
    for leaf in (state.pos, state.vel, state.adv_pos, state.adv_vel, ts.obs, ts.reward):
        assert np.isfinite(np.asarray(leaf)).all()
    jax.tree.map(np.testing.assert_array_equal, state, ref_state)  # same as zeroing the bad components
    flag = np.asarray(ts.info["nonfinite_action"])
    assert flag.dtype == bool and flag.shape == (ts.reward.shape[0],)
    assert flag[0] and flag[1] and flag[-1] and not flag[2:-1].any()
    assert not np.asarray(ref_ts.info["nonfinite_action"]).any()


def test_swarm_flag_is_in_reset_info_and_false_for_discrete():
    env = envs.make("swarm", num_agents=3, max_steps=5)
    state = env.reset_state(KEY)
    np.testing.assert_array_equal(env.reset_info(state)["nonfinite_action"], np.zeros(3, bool))
    flag = jax.jit(lambda s, a: env.transition(KEY, s, a).info["nonfinite_action"])
    np.testing.assert_array_equal(flag(state, jnp.zeros((3,), jnp.int32)), np.zeros(3, bool))


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("hanabi", {"num_players": 2.5}),
        ("hanabi", {"num_players": 2.0}),
        ("hanabi", {"num_players": True}),
        ("hanabi", {"hand_size": 2.5}),
        ("swarm", {"num_agents": 2.5}),
        ("swarm", {"dim": 2.0}),
        ("catch", {"rows": 4.5}),
        ("negotiation", {"max_turns": 3.5}),
        ("fgmres_blocksize", {"n": 24.5}),
        ("fgmres_blocksize", {"n": 24, "block_sizes": (1, 2.5)}),
    ],
)
def test_non_integer_counts_raise(name, kwargs):
    with pytest.raises(TypeError, match="must be (an )?integers?"):
        envs.make(name, **kwargs)
    with pytest.raises(TypeError, match="must be (an )?integers?"):  # the class directly, too
        envs.env_class(name)(**kwargs)


def test_numpy_integer_counts_are_fine():
    assert envs.make("hanabi", num_players=np.int64(3)).num_agents == 3
    assert envs.env_class("catch")(rows=np.int32(4), columns=3).rows == 4
    assert envs.make("hanabi", hand_size=None).config.hand_size == 5
