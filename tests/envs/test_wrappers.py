"""AutoReset.batch_reset / batch_step (one key per batch step) and the games' reset_states."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason import envs
from jaxrl_reason.envs.games.arena import mover_view
from jaxrl_reason.envs.games.kuhn_poker import DEALS
from jaxrl_reason.envs.games.tictactoe import coin_flips
from testutil import PlainView

B, T = 16, 24  # T > 9: every board finishes and resets at least twice


def _uniform_legal(key, mask):
    return jax.random.categorical(key, jnp.where(mask, 0.0, -1e9)).astype(jnp.int32)


def _rollout(auto, batched: bool):
    """T steps of random legal play; batch_step with one key, or vmap(step) over split keys."""

    def body(carry, key):
        state, ts = carry
        k_act, k_step = jax.random.split(key)
        a = _uniform_legal(k_act, mover_view(ts)[1])
        if batched:
            state, ts = auto.batch_step(k_step, state, a)
        else:
            state, ts = jax.vmap(auto.step)(jax.random.split(k_step, B), state, a)
        return (state, ts), (state, ts)

    init = auto.batch_reset(jax.random.key(0), B) if batched else jax.vmap(auto.reset)(jax.random.split(jax.random.key(0), B))
    return jax.lax.scan(body, init, jax.random.split(jax.random.key(1), T))[1]


@pytest.fixture(scope="module")
def fixed_first_rollouts():
    auto = envs.AutoReset(envs.make("tictactoe", first_player=0), final_obs=True)
    return jax.jit(lambda: (_rollout(auto, True), _rollout(auto, False)))()


def test_batch_step_equals_vmap_step_when_reset_needs_no_randomness(fixed_first_rollouts):
    batched, vmapped = fixed_first_rollouts
    jax.tree.map(np.testing.assert_array_equal, batched, vmapped)
    ts = batched[1]
    assert int(ts.terminated.sum()) >= 2 * B  # many auto-resets happened
    # at a reset the new episode starts empty, player 0 to move, and final_obs keeps the last board
    term = np.asarray(ts.terminated)
    assert (np.asarray(ts.obs)[term] == 0).all() and (np.asarray(ts.current_player)[term] == 0).all()
    assert (np.abs(np.asarray(ts.info["final_obs"])[term]).sum((-1, -2)) >= 5).all()


def test_coin_flips_are_fair_bits_of_one_key():
    c = np.asarray(coin_flips(jax.random.key(0), 4096))
    assert c.shape == (4096,) and c.dtype == np.int32 and set(np.unique(c)) == {0, 1}
    assert abs(c.mean() - 0.5) < 5 * 0.5 / np.sqrt(4096)
    assert abs(np.mean(c[1:] == c[:-1]) - 0.5) < 5 * 0.5 / np.sqrt(4095)  # neighbours independent
    np.testing.assert_array_equal(c, np.asarray(coin_flips(jax.random.key(0), 4096)))
    assert (c != np.asarray(coin_flips(jax.random.key(1), 4096))).any()
    np.testing.assert_array_equal(np.asarray(coin_flips(jax.random.key(0), 37)), c[:37])  # not a multiple of 32


def test_tictactoe_random_reset_states():
    env = envs.make("tictactoe", first_player="random")
    key = jax.random.key(7)
    s = env.reset_states(key, 64)
    coins = np.asarray(coin_flips(key, 64))
    np.testing.assert_array_equal(np.asarray(s.current_player), coins)
    np.testing.assert_array_equal(np.asarray(s.first_player), coins)
    assert (np.asarray(s.marks) == 0).all() and not np.asarray(s.terminated).any()
    assert 0 < coins.sum() < 64


def test_random_first_player_batch_rollout_follows_the_rules():
    auto = envs.AutoReset(envs.make("tictactoe", first_player="random"))
    prev_state, ts = jax.jit(lambda: _rollout(auto, True))()
    fp = np.asarray(prev_state.first_player)
    starts = np.asarray(ts.terminated)  # the boards that were just reset
    assert 0 < fp[starts].mean() < 1  # both players open
    np.testing.assert_array_equal(np.asarray(ts.current_player)[starts], fp[starts])
    r = np.asarray(ts.reward)
    assert (r.sum(-1) == 0).all() and set(np.unique(r)) <= {-1.0, 0.0, 1.0}


def test_kuhn_reset_states_deal_every_deal():
    s = envs.make("kuhn_poker").reset_states(jax.random.key(3), 600)
    cards = np.asarray(s.cards)
    deals = {tuple(d) for d in np.asarray(DEALS)}
    assert {tuple(c) for c in cards} == deals
    assert (np.asarray(s.hist) == 0).all()


def test_batch_api_rejects_bad_input():
    auto = envs.AutoReset(envs.make("tictactoe"))
    state, _ = auto.batch_reset(jax.random.key(0), 2)
    with pytest.raises(ValueError, match="leading batch axis"):
        auto.batch_step(jax.random.key(1), state, 3)
    with pytest.raises(ValueError, match="num >= 1"):
        auto.batch_reset(jax.random.key(0), 0)


def test_batch_step_of_a_plain_environment_is_vmap_step_over_split_keys():
    auto = envs.AutoReset(PlainView(envs.make("catch", rows=3, columns=3)))
    key, n = jax.random.key(5), 8
    state, _ = auto.batch_reset(jax.random.key(4), n)
    a = jnp.arange(n, dtype=jnp.int32) % 3
    got = jax.jit(auto.batch_step)(key, state, a)
    want = jax.jit(jax.vmap(auto.step))(jax.random.split(key, n), state, a)
    jax.tree.map(np.testing.assert_array_equal, got, want)
