"""The built-in games (TicTacToe, Kuhn Poker, Negotiation): property tests over random play."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_reason import envs

TTT = envs.make("tictactoe")
KUHN = envs.make("kuhn_poker")
NEG = envs.make("negotiation")


# ------------------------------------------------------------------ property tests
@functools.cache
def _episode_fn(env):
    @jax.jit
    def run(key):
        k0, key = jax.random.split(key)
        state, ts = env.reset(k0)

        def body(carry, key):
            state, ts, ret, length = carry
            k1, k2 = jax.random.split(key)
            a = envs.random_legal_action(k1, env, ts)
            p = ts.current_player
            legal_ok = ts.done | ts.legal_action_mask[p, a]
            state2, ts2 = env.step(k2, state, a)
            length = length + (~ts.done).astype(jnp.int32)
            return (state2, ts2, ret + ts2.reward, length), (legal_ok, ts2.reward.sum(), ts.done, ts.legal_action_mask)

        (state, ts, ret, length), (ok, rsum, done, masks) = jax.lax.scan(
            body, (state, ts, jnp.zeros(2), jnp.int32(0)), jax.random.split(key, env.max_episode_steps + 2))
        return ts.done, ret, length, ok, rsum, done, masks

    return run


def _random_episode(env, seed):
    return _episode_fn(env)(jax.random.key(seed))


@pytest.mark.parametrize("env", [TTT, KUHN, NEG], ids=["tictactoe", "kuhn", "negotiation"])
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**30))
def test_random_play_properties(env, seed):
    done, ret, length, ok, rsum, was_done, masks = _random_episode(env, seed)
    assert bool(done) and 1 <= int(length) <= env.max_episode_steps
    assert bool(ok.all())
    np.testing.assert_allclose(np.asarray(rsum), 0.0, atol=1e-6)  # zero-sum every step
    assert abs(float(ret[0])) <= 2.0
    live = ~np.asarray(was_done)
    assert np.asarray(masks)[live].any(-1).sum(-1).min() == 1  # exactly the mover has moves
