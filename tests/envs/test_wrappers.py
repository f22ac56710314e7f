"""AutoReset: batch_reset / batch_step (one key per batch step) and the games' reset_states; vmap(step) running
the batched program (reset_done) with the per-environment results."""

import copy
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason import envs
from jaxrl_reason.envs.core import key_hash
from jaxrl_reason.envs.games.arena import mover_view
from jaxrl_reason.envs.games.kuhn_poker import DEALS
from jaxrl_reason.envs.games.tictactoe import coin_flips
from jaxrl_reason.envs.wrappers import reset_done, where_done
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


def test_tictactoe_random_reset_state_is_the_key_hash_top_bit():
    """One board's first player is the top bit of ``core.key_hash(key)`` (no threefry; ``cheap_reset``)."""
    env = envs.make("tictactoe", first_player="random")
    assert env.cheap_reset
    keys = jax.random.split(jax.random.key(9), 256)
    s = jax.vmap(env.reset_state)(keys)
    coins = np.asarray(key_hash(keys) >> 31).astype(np.int32)
    np.testing.assert_array_equal(np.asarray(s.first_player), coins)
    np.testing.assert_array_equal(np.asarray(s.current_player), coins)
    assert 0.3 < coins.mean() < 0.7


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


# --------------------------------------------------------------------------- vmap(AutoReset.step)
VB, VT = 8, 24  # capacities 1, 2, 4: steps with 0, 1-2 and > 2 finished rows take different branches
TINY_HANABI = dict(num_players=2, num_colours=1, hand_size=2, max_info_tokens=3, max_life_tokens=1)
VMAP_CASES = {  # name -> (environment, final_obs)
    "tictactoe-random-first": (lambda: envs.make("tictactoe", first_player="random"), True),
    "kuhn_poker": (lambda: envs.make("kuhn_poker"), False),
    "hanabi-tiny": (lambda: envs.make("hanabi", **TINY_HANABI), True),  # the transition draws: split keys
    "swarm": (lambda: envs.make("swarm", num_agents=2, capture_radius=0.5, max_steps=6), False),  # captures end some
    "plain-tictactoe": (lambda: PlainView(envs.make("tictactoe", first_player="random")), True),  # not split
}


def _keyed_rollout(auto, env, step, batch=VB, steps=VT):
    """``steps`` of random legal play on ``batch`` environments (``step(keys, state, action)`` steps them):
    ``(last (state, ts), every step's (state, ts))``."""

    def body(carry, key):
        state, ts = carry
        k_act, k_step = jax.random.split(key)
        act = jax.vmap(envs.random_legal_action, (0, None, 0))(jax.random.split(k_act, batch), env, ts)
        state, ts = step(jax.random.split(k_step, batch), state, act)
        return (state, ts), (state, ts)

    init = jax.vmap(auto.reset)(jax.random.split(jax.random.key(0), batch))
    return jax.lax.scan(body, init, jax.random.split(jax.random.key(1), steps))


def _same(a, b):
    """Equal; floats to the last bits (XLA may vectorise the batched program's float arithmetic differently
    from the one-environment program's: the swarm's positions differ by an ulp)."""
    if np.issubdtype(np.asarray(a).dtype, np.floating):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", list(VMAP_CASES))
def test_vmap_step_runs_the_batched_program_with_the_per_environment_results(case):
    make, final_obs = VMAP_CASES[case]
    env = make()
    auto = envs.AutoReset(env, final_obs=final_obs)
    one_by_one = lambda keys, s, a: jax.lax.map(lambda x: auto.step(*x), (keys, s, a))  # no vmap: per-env path
    vmapped, looped = jax.jit(lambda: (_keyed_rollout(auto, env, jax.vmap(auto.step))[1],
                                       _keyed_rollout(auto, env, one_by_one)[1]))()
    jax.tree.map(_same, vmapped, looped)
    ended = np.asarray(vmapped[1].done).sum(1)
    assert (ended == 0).any() and ((ended >= 1) & (ended <= 2)).any() and (ended > 2).any(), ended


def test_vmap_step_batched_rule_handles_nested_vmap_and_unbatched_arguments():
    env = envs.make("tictactoe", first_player="random")
    auto = envs.AutoReset(env, final_obs=True)
    grid = lambda tree: jax.tree.map(lambda x: x.reshape(4, 6, *x.shape[1:]), tree)
    one_by_one = lambda k, s, a: jax.lax.map(lambda x: auto.step(*x), (k, s, a))

    @jax.jit
    def run():
        (state, ts), _ = _keyed_rollout(auto, env, jax.vmap(auto.step), 24, 4)  # 24 boards in mid-game
        action = jax.vmap(envs.random_legal_action, (0, None, 0))(jax.random.split(jax.random.key(2), 24), env, ts)
        keys = jax.random.split(jax.random.key(3), 24)
        nested = jax.vmap(jax.vmap(auto.step))(*grid((keys, state, action)))
        shared = jax.vmap(jax.vmap(auto.step, (None, 0, 0)))(grid(keys)[:, 0], *grid((state, action)))
        return (nested, shared), (one_by_one(keys, state, action),
                                  one_by_one(jnp.repeat(grid(keys)[:, 0], 6), state, action))

    got, want = run()
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a.reshape(b.shape), b), got, want)
    assert 0 < int(want[0][1].terminated.sum()) < 24  # some boards ended and were reset


def test_autoreset_step_differentiates_forward_and_reverse_through_the_per_environment_step():
    """jvp, jacfwd and grad of ``vmap(AutoReset.step)`` (its batching rule) equal those of the per-environment
    step, in a batch where some episodes end (reset rows: zero derivative) and some go on."""
    env = envs.make("swarm", num_agents=2, num_targets=1, control="continuous", max_steps=3)
    auto = envs.AutoReset(env)
    keys = jax.random.split(jax.random.key(0), 4)
    act = jnp.full((4, 2, 2), 0.3)

    @jax.jit  # one program (eagerly, each op of the steps compiles on its own)
    def start(keys):  # rows 0, 1 end on the next step (max_steps), rows 2, 3 go on
        fresh, _ = jax.vmap(auto.reset)(keys)
        two_in = jax.vmap(auto.step)(keys, jax.vmap(auto.step)(keys, fresh, act)[0], act)[0]
        return jax.tree.map(lambda a, b: jnp.where(jnp.arange(4).reshape((4,) + (1,) * (a.ndim - 1)) < 2, a, b),
                            two_in, fresh)

    state = start(keys)
    loss = lambda step: lambda a: step(keys, state, a)[0].pos.sum(axis=(1, 2))
    vmapped, one_by_one = loss(jax.vmap(auto.step)), loss(lambda k, s, a: jax.lax.map(lambda x: auto.step(*x),
                                                                                       (k, s, a)))
    tangent = jnp.ones_like(act)
    got, want = jax.jit(lambda a: [(jax.jvp(f, (a,), (tangent,)), jax.jacfwd(f)(a),
                                    jax.grad(lambda a: f(a).sum())(a)) for f in (vmapped, one_by_one)])(act)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-6), got, want)
    (_, dpos), _, grad = got
    np.testing.assert_array_equal(dpos[:2], 0.0)  # reset rows: the fresh episode does not depend on the action
    assert (np.abs(np.asarray(dpos[2:])) > 0).all() and np.abs(np.asarray(grad[2:])).sum() > 0
    np.testing.assert_array_equal(grad[:2], 0.0)
    ended = jax.jit(jax.vmap(auto.step))(keys, state, act)[1].done
    np.testing.assert_array_equal(ended, [True, True, False, False])


def test_autoreset_stays_copyable_and_picklable():
    auto = envs.AutoReset(envs.make("kuhn_poker"), final_obs=True)
    for twin in (copy.deepcopy(auto), pickle.loads(pickle.dumps(auto))):
        assert twin.final_obs and twin.num_actions == auto.num_actions


@pytest.mark.parametrize("ended", [[], [3], [0, 5], [0, 1, 2, 4, 5]])
def test_reset_done_computes_only_the_fresh_rows_needed(ended):
    done = jnp.zeros(6, bool).at[jnp.asarray(ended, jnp.int32)].set(True)
    stepped = {"a": jnp.arange(12.0).reshape(6, 2), "b": jnp.arange(6)}
    table = {"a": -jnp.arange(12.0).reshape(6, 2) - 1, "b": 100 + jnp.arange(6)}
    asked = []

    def fresh(rows):
        asked.append(None if rows is None else rows.shape[0])
        return table if rows is None else jax.tree.map(lambda x: x[rows], table)

    got = jax.jit(lambda d: reset_done(d, stepped, fresh, capacities=(1, 2)))(done)
    jax.tree.map(np.testing.assert_array_equal, got, where_done(done, table, stepped))
    assert sorted(asked, key=str) == [1, 2, None]  # traced: the compacted branches (1, 2 rows) and the full one
