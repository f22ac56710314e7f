"""Generic API conformance test run on every registered environment.

An environment class may list extra constructor kwargs to test in
``conformance_variants`` (a tuple of dicts); ``({},)`` is used otherwise.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_reason.solvers  # noqa: F401  (registers its fgmres_blocksize env: every registered env is swept)
from jaxrl_reason import envs
from testutil import PlainView

CASES = [
    (name, kwargs)
    for name in envs.registered_names()
    for kwargs in getattr(envs.env_class(name), "conformance_variants", ({},))
]
IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in kw.items()) or 'default'}" for n, kw in CASES]
BATCH = 4


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def env(request):
    name, kwargs = request.param
    return envs.make(name, **kwargs)


def _check_timestep(env, ts, batch=()):
    assert ts.obs.shape == batch + (env.num_agents, *env.obs_shape)
    assert ts.obs.dtype == env.obs_dtype
    assert ts.reward.shape == batch + (env.num_agents,) and ts.reward.dtype == jnp.float32
    assert ts.terminated.shape == batch and ts.terminated.dtype == jnp.bool_
    assert ts.truncated.shape == batch and ts.truncated.dtype == jnp.bool_
    assert ts.legal_action_mask.shape == batch + (env.num_agents, env.num_actions)
    assert ts.legal_action_mask.dtype == jnp.bool_
    assert ts.current_player.shape == batch and ts.current_player.dtype == jnp.int32
    cp = np.asarray(ts.current_player)
    if env.turn_based:
        assert ((cp >= 0) & (cp < env.num_agents)).all()
    else:
        assert (cp == -1).all()


def test_static_attributes(env):
    assert env.num_agents >= 1 and env.num_actions >= 1
    assert isinstance(env.obs_shape, tuple)
    assert env.illegal_action_rule in envs.ILLEGAL_ACTION_RULES
    assert env.max_episode_steps >= 1


def test_reset_step_spec_and_determinism(env):
    reset = jax.jit(env.reset)
    s1, ts1 = reset(jax.random.key(3))
    s2, ts2 = reset(jax.random.key(3))
    _check_timestep(env, ts1)
    chex_equal = lambda a, b: jax.tree.map(np.testing.assert_array_equal, a, b)
    chex_equal((s1, ts1), (s2, ts2))
    action = envs.random_legal_action(jax.random.key(4), env, ts1)
    assert action.shape == env.action_shape()
    step = jax.jit(env.step)
    out1 = step(jax.random.key(5), s1, action)
    out2 = step(jax.random.key(5), s1, action)
    chex_equal(out1, out2)
    _check_timestep(env, out1[1])


def test_vmap_scan_random_play(env):
    """Batched random legal play under jit+vmap+scan with auto-reset."""
    wrapped = envs.EpisodeStats(envs.AutoReset(env))
    steps = 2 * env.max_episode_steps + 2

    @jax.jit
    def rollout(key):
        keys = jax.random.split(key, BATCH)
        state, ts = jax.vmap(wrapped.reset)(keys)

        def body(carry, key):
            state, ts = carry
            k_act, k_step = jax.random.split(key)
            act = jax.vmap(envs.random_legal_action, (0, None, 0))(
                jax.random.split(k_act, BATCH), env, ts
            )
            prev_ts = ts
            state, ts = jax.vmap(wrapped.step)(jax.random.split(k_step, BATCH), state, act)
            return (state, ts), (prev_ts, ts)

        _, (prev, nxt) = jax.lax.scan(body, (state, ts), jax.random.split(key, steps))
        return prev, nxt

    prev, nxt = rollout(jax.random.key(0))
    _check_timestep(env, jax.tree.map(lambda x: x[0], nxt), (BATCH,))
    assert np.isfinite(np.asarray(nxt.reward)).all()
    mask = np.asarray(prev.legal_action_mask)  # states where an action was chosen
    if env.turn_based:
        cp = np.asarray(prev.current_player)
        mine = np.take_along_axis(mask, cp[..., None, None], axis=2)[..., 0, :]
        assert mine.any(-1).all(), "acting player has no legal action"
    else:
        assert mask.any(-1).all(), "an agent has no legal action"
    done = np.asarray(nxt.info["returned_episode"])
    assert done.any(), f"no episode ended within {steps} random steps"
    lengths = np.asarray(nxt.info["returned_episode_length"])[done]
    assert (lengths <= env.max_episode_steps).all() and (lengths >= 1).all()


def test_illegal_action_rule(env):
    if env.illegal_action_rule == "none":
        _, ts = jax.jit(env.reset)(jax.random.key(0))
        assert bool(ts.legal_action_mask.all()), "rule 'none' requires an all-True mask"
        return
    step = jax.jit(env.step)
    reset = jax.jit(env.reset)
    key = jax.random.key(1)
    state, ts = reset(key)
    for i in range(20 * env.max_episode_steps):
        player = int(ts.current_player) if env.turn_based else 0
        illegal = np.flatnonzero(~np.asarray(ts.legal_action_mask[player]))
        if illegal.size and not bool(ts.done):
            action = jnp.int32(illegal[0])
            if not env.turn_based:
                action = jnp.argmax(ts.legal_action_mask, -1).astype(jnp.int32).at[player].set(action)
            _, bad = step(jax.random.key(i), state, action)
            assert bool(bad.terminated), "an illegal action must end the episode"
            expected = np.zeros(env.num_agents, np.float32)
            expected[player] = -env.illegal_action_penalty
            np.testing.assert_allclose(np.asarray(bad.reward), expected)
            return
        key, k1, k2 = jax.random.split(key, 3)
        if bool(ts.done):
            state, ts = reset(k1)
        else:
            state, ts = step(k2, state, envs.random_legal_action(k1, env, ts))
    pytest.skip("random play reached no state with an illegal action")


def test_make_rejects_bad_names_and_kwargs():
    with pytest.raises(ValueError, match="registered environments: .*catch"):
        envs.make("no_such_env")
    with pytest.raises(TypeError, match="accepted: rows, columns"):
        envs.make("catch", bogus=1)


def test_autoreset_split_fast_path_equals_generic_path():
    env = envs.make("catch", rows=4, columns=3)
    assert isinstance(env, envs.SplitEnvironment)

    def rollout(wrapped):
        def body(carry, key):
            state, ts = carry
            k_act, k_step = jax.random.split(key)
            act = envs.random_legal_action(k_act, env, ts)
            state, ts = wrapped.step(k_step, state, act)
            return (state, ts), ts

        init = wrapped.reset(jax.random.key(0))
        return jax.lax.scan(body, init, jax.random.split(jax.random.key(1), 12))[1]

    fast = jax.jit(lambda: rollout(envs.AutoReset(env, final_obs=True)))()
    slow = jax.jit(lambda: rollout(envs.AutoReset(PlainView(env), final_obs=True)))()
    jax.tree.map(np.testing.assert_array_equal, fast, slow)
    assert np.asarray(fast.terminated).sum() >= 3  # several resets happened
    term = np.asarray(fast.terminated)
    # the final observation differs from the fresh episode's one exactly at resets
    changed = (np.asarray(fast.info["final_obs"]) != np.asarray(fast.obs)).any((-1, -2))
    assert (changed == term).all()


def test_deterministic_transition_claim_holds(env):
    """An env that declares ``deterministic_transition`` really ignores the step key."""
    if not (isinstance(env, envs.SplitEnvironment) and env.deterministic_transition):
        return
    state, ts = jax.jit(env.reset)(jax.random.key(0))
    action = jax.jit(lambda k, ts: envs.random_legal_action(k, env, ts))(jax.random.key(1), ts)
    a = jax.jit(env.transition)(jax.random.key(2), state, action)
    b = jax.jit(env.transition)(jax.random.key(3), state, action)
    jax.tree.map(np.testing.assert_array_equal, a, b)


def test_autoreset_gives_the_whole_key_to_reset_when_transition_is_deterministic():
    class DeterministicCatch(type(envs.make("catch"))):
        deterministic_transition = True

    env = DeterministicCatch(rows=2, columns=5)  # every step ends the episode
    auto = envs.AutoReset(env)
    state, _ = auto.reset(jax.random.key(0))
    key = jax.random.key(42)
    new_state, ts = auto.step(key, state, 1)
    assert bool(ts.terminated)
    jax.tree.map(np.testing.assert_array_equal, new_state, env.reset_state(key))


def test_materialize_is_the_identity_on_the_leading_axis():
    from jaxrl_reason.envs.core import materialize

    for x in (jnp.arange(7, dtype=jnp.int32) - 3, jnp.linspace(-1.0, 1.0, 24).reshape(4, 3, 2),
              jnp.asarray([[True, False], [False, True]])):
        got = jax.jit(materialize)(x)
        assert got.shape == x.shape and got.dtype == x.dtype
        np.testing.assert_array_equal(got, x)
    np.testing.assert_array_equal(jax.vmap(materialize)(jnp.arange(12).reshape(3, 4)), jnp.arange(12).reshape(3, 4))


def test_key_hash_bits_are_fair_over_split_keys_and_raw_seeds():
    from jaxrl_reason.envs.core import key_hash

    n = 4096
    tol = lambda m: 5 * 0.5 / np.sqrt(m)
    split = np.asarray(jax.jit(key_hash)(jax.random.split(jax.random.key(0), n)))
    seeds = np.asarray(jax.vmap(lambda s: key_hash(jax.random.key(s)))(jnp.arange(n)))
    legacy = np.asarray(key_hash(jax.random.split(jax.random.PRNGKey(0), n)))  # raw uint32 keys work too
    for h in (split, seeds, legacy):
        assert h.shape == (n,) and h.dtype == np.uint32
        for bit in (31, 30, 16):
            c = (h >> bit) & 1
            assert abs(c.mean() - 0.5) < tol(n)
            assert abs(np.mean(c[1:] == c[:-1]) - 0.5) < tol(n - 1)  # neighbours independent
    assert len(np.unique(split)) > n - 8  # a 32-bit hash: no collapse
    np.testing.assert_array_equal(split, np.asarray(key_hash(jax.random.split(jax.random.key(0), n))))
