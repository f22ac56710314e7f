"""Rule tests with hand-written game records, property tests and pgx differential tests."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from jaxrl_reason import envs
from jaxrl_reason.envs.games import kuhn_poker as kp
from jaxrl_reason.envs.games.negotiation import ACCEPT, DENY

TTT = envs.make("tictactoe")
KUHN = envs.make("kuhn_poker")
NEG = envs.make("negotiation")
_step = {e: jax.jit(e.step) for e in (TTT, KUHN, NEG)}
KEY = jax.random.key(0)


def view(env, state):
    """TimeStep of ``state`` without stepping (zero reward)."""
    return env.timestep(state, jnp.zeros(2), state.terminated, False, {})


def play(env, state, actions):
    ts = None
    for a in actions:
        assert ts is None or not bool(ts.done), "record continues after the end"
        state, ts = _step[env](KEY, state, jnp.int32(a))
    return state, ts


# ------------------------------------------------------------------ TicTacToe records
def test_ttt_row_win_for_first_player():
    _, ts = play(TTT, TTT.init_state(0), [0, 3, 1, 4, 2])
    assert bool(ts.terminated)
    np.testing.assert_array_equal(ts.reward, [1.0, -1.0])


def test_ttt_diagonal_win_for_second_player_who_moves_first():
    s = TTT.init_state(1)  # player 1 is X
    _, ts = play(TTT, s, [2, 0, 4, 1, 6])
    np.testing.assert_array_equal(ts.reward, [-1.0, 1.0])


def test_ttt_full_board_draw():
    # X: 0 1 5 6 8 ; O: 2 3 4 7  -> no line
    _, ts = play(TTT, TTT.init_state(0), [0, 2, 1, 3, 5, 4, 6, 7, 8])
    assert bool(ts.terminated)
    np.testing.assert_array_equal(ts.reward, [0.0, 0.0])
    assert not bool(ts.legal_action_mask.any())


def test_ttt_win_on_last_move_is_win_not_draw():
    # X: 0 1 5 6 4->? build X win on move 9: X 0 2 3 7 + 8? use X: 1 3 5 6 8? check below
    _, ts = play(TTT, TTT.init_state(0), [0, 1, 2, 4, 3, 5, 7, 6, 8])  # X 0 2 3 7 8 ; O 1 4 5 6
    # X has 6? no; lines for X: (0,3,6)? 6 is O. (2,5,8)? 5 O. (6,7,8)? 6 O -> draw
    np.testing.assert_array_equal(ts.reward, [0.0, 0.0])
    _, ts = play(TTT, TTT.init_state(0), [4, 0, 8, 2, 1, 7, 3, 5, 6])  # X 4 8 1 3 6: (2,4,6)? 2 is O
    assert bool(ts.terminated)
    _, ts = play(TTT, TTT.init_state(0), [0, 1, 2, 4, 3, 5, 7, 8, 6])  # X 0 2 3 7 6 -> (0,3,6)
    np.testing.assert_array_equal(ts.reward, [1.0, -1.0])


def test_ttt_illegal_move_forfeits_and_keeps_board():
    s, ts = play(TTT, TTT.init_state(0), [4])
    s2, ts2 = _step[TTT](KEY, s, jnp.int32(4))
    assert bool(ts2.terminated)
    np.testing.assert_array_equal(ts2.reward, [0.0, -1.0])
    np.testing.assert_array_equal(s2.marks, s.marks)
    _, ts3 = _step[TTT](KEY, s, jnp.int32(-1))
    np.testing.assert_array_equal(ts3.reward, [0.0, -1.0])
    # stepping a finished game is a no-op
    s4, ts4 = _step[TTT](KEY, s2, jnp.int32(0))
    np.testing.assert_array_equal(ts4.reward, [0.0, 0.0])
    np.testing.assert_array_equal(s4.marks, s2.marks)


def test_ttt_bad_config():
    with pytest.raises(ValueError, match="first_player"):
        envs.make("tictactoe", first_player=2)


# ------------------------------------------------------------------ Kuhn records
@pytest.mark.parametrize(
    "cards,actions,reward",
    [
        ((2, 0), [kp.CHECK, kp.CHECK], 1.0),  # K vs J, showdown for 1
        ((0, 1), [kp.BET, kp.FOLD], 1.0),  # fold after bet: bettor wins 1
        ((0, 1), [kp.BET, kp.CALL], -2.0),  # J calls... J bet, Q calls: showdown 2
        ((1, 2), [kp.CHECK, kp.BET, kp.FOLD], -1.0),  # P0 folds after check-bet
        ((2, 1), [kp.CHECK, kp.BET, kp.CALL], 2.0),
    ],
)
def test_kuhn_records(cards, actions, reward):
    _, ts = play(KUHN, KUHN.init_state(cards), actions)
    assert bool(ts.terminated)
    np.testing.assert_array_equal(ts.reward, [reward, -reward])


def test_kuhn_masks_and_illegal():
    s = KUHN.init_state((0, 1))
    ts = view(KUHN, s)
    np.testing.assert_array_equal(ts.legal_action_mask[0], [True, True, False, False])
    assert not bool(ts.legal_action_mask[1].any())
    s, ts = play(KUHN, s, [kp.BET])
    np.testing.assert_array_equal(ts.legal_action_mask[1], [False, False, True, True])
    _, bad = _step[KUHN](KEY, s, jnp.int32(kp.CHECK))
    assert bool(bad.terminated)
    np.testing.assert_array_equal(bad.reward, [0.0, -1.0])


def test_kuhn_information_sets_are_distinct_observations():
    """Acting player's (card, history) -> observation must be injective (the pgx opening bug)."""
    seen = {}
    for deal in kp.DEALS:
        for hist_actions in ([], [kp.CHECK], [kp.BET], [kp.CHECK, kp.BET]):
            s, ts = play(KUHN, KUHN.init_state(deal), hist_actions) if hist_actions else (
                KUHN.init_state(deal), view(KUHN, KUHN.init_state(deal)))
            p = int(ts.current_player)
            key = (int(deal[p]), len(hist_actions), tuple(hist_actions))
            obs = tuple(np.asarray(ts.obs[p]).tolist())
            assert seen.setdefault(obs, key) == key, (obs, key, seen[obs])
    assert len(seen) == 12
    # the opponent's card never shows in a player's observation
    a = view(KUHN, KUHN.init_state((0, 1))).obs[0]
    b = view(KUHN, KUHN.init_state((0, 2))).obs[0]
    np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------ Negotiation records
def neg_state(values=((1, 6), (6, 1))):
    return NEG.init_state(jnp.asarray(values))


def test_negotiation_trade_accept_and_sign_reward():
    s = neg_state()  # P0 values gold, P1 values wood
    offer = NEG.offer_action(0, 3, 1)  # P0 gives 3 wood, receives 1 gold
    s, ts = play(NEG, s, [offer])
    assert bool(ts.legal_action_mask[1, ACCEPT])
    s, ts = play(NEG, s, [ACCEPT])
    np.testing.assert_array_equal(s.inventory, [[7, 11], [13, 9]])
    # gains: P0 = -3*1 + 1*6 = 3 ; P1 = 3*6 - 1*1 = 17
    np.testing.assert_allclose(ts.info["value_change"], [3.0, 17.0])
    assert not bool(ts.legal_action_mask[0, ACCEPT])  # the offer was consumed
    s, ts = play(NEG, s, [DENY] * 8)
    assert bool(ts.terminated) and int(s.turn) == 10
    np.testing.assert_array_equal(ts.reward, [-1.0, 1.0])


def test_negotiation_accept_on_last_turn_counts():
    s = neg_state()
    s, ts = play(NEG, s, [DENY] * 8 + [NEG.offer_action(1, 1, 3)])  # P0 (turn 9) gives 1 gold for 3 wood
    assert not bool(ts.done)
    s, ts = play(NEG, s, [ACCEPT])  # turn 10: P1 accepts, game ends
    assert bool(ts.terminated)
    np.testing.assert_array_equal(s.inventory, [[13, 9], [7, 11]])
    # P0: +3 wood*1 - 1 gold*6 = -3 ; P1: -3*6 + 1*1 = -17 -> P0 wins
    np.testing.assert_array_equal(ts.reward, [1.0, -1.0])


def test_negotiation_pending_offer_lapses_and_counter_offer_replaces():
    s = neg_state()
    s, ts = play(NEG, s, [NEG.offer_action(0, 1, 1), NEG.offer_action(0, 2, 2)])  # counter-offer
    assert int(s.pending) == NEG.offer_action(0, 2, 2) - 2 and int(s.proposer) == 1
    s, ts = play(NEG, s, [DENY])
    assert int(s.pending) == -1 and not bool(ts.legal_action_mask[1, ACCEPT])


def test_negotiation_infeasible_offer_is_illegal_and_bad_config():
    env = envs.make("negotiation", initial_amount=1, max_qty=2)
    s = env.init_state(jnp.asarray([[1, 6], [6, 1]]))
    ts = env.timestep(s)
    assert not bool(ts.legal_action_mask[0, env.offer_action(0, 2, 1)])
    _, bad = env.step(KEY, s, jnp.int32(env.offer_action(0, 2, 1)))
    np.testing.assert_array_equal(bad.reward, [-1.0, 0.0])
    _, bad = env.step(KEY, s, jnp.int32(ACCEPT))  # nothing pending
    assert bool(bad.terminated)
    with pytest.raises(ValueError, match="reward"):
        envs.make("negotiation", reward="bogus")
    with pytest.raises(ValueError):
        env.offer_action(0, 3, 1)


def test_negotiation_private_values_not_in_opponent_obs():
    a = NEG.timestep(neg_state(((1, 6), (6, 1)))).obs[0]
    b = NEG.timestep(neg_state(((1, 6), (4, 3)))).obs[0]
    np.testing.assert_array_equal(a, b)


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


@settings(max_examples=20, deadline=None)
@given(cells=st.permutations(list(range(9))))
def test_ttt_mask_matches_rules(cells):
    s, ts = TTT.init_state(0), view(TTT, TTT.init_state(0))
    taken = set()
    for c in cells:
        if bool(ts.done):
            break
        expected = np.array([i not in taken for i in range(9)])
        np.testing.assert_array_equal(ts.legal_action_mask[ts.current_player], expected)
        s, ts = _step[TTT](KEY, s, jnp.int32(c))
        taken.add(c)


# ------------------------------------------------------------------ pgx differential tests
@pytest.mark.bench
def test_tictactoe_matches_pgx():
    pgx = pytest.importorskip("pgx")
    penv = pgx.make("tic_tac_toe")
    rng = np.random.default_rng(0)
    pstep = jax.jit(penv.step)
    for g in range(30):
        pstate = penv.init(jax.random.key(g))
        first = int(pstate.current_player)
        s = TTT.init_state(first)
        ts = view(TTT, s)
        while not bool(ts.done):
            legal = np.flatnonzero(np.asarray(pstate.legal_action_mask))
            np.testing.assert_array_equal(np.asarray(ts.legal_action_mask[ts.current_player]), np.asarray(pstate.legal_action_mask))
            assert int(ts.current_player) == int(pstate.current_player)
            a = int(rng.choice(legal))
            pstate = pstep(pstate, jnp.int32(a))
            s, ts = _step[TTT](KEY, s, jnp.int32(a))
            np.testing.assert_array_equal(np.asarray(ts.reward), np.asarray(pstate.rewards))
        assert bool(pstate.terminated)


@pytest.mark.bench
def test_kuhn_matches_pgx():
    pgx = pytest.importorskip("pgx")
    penv = pgx.make("kuhn_poker")
    pstep = jax.jit(penv.step)
    sequences = [["p", "p"], ["p", "b", "p"], ["p", "b", "b"], ["b", "p"], ["b", "b"]]
    for deal in kp.DEALS:
        for seq in sequences:
            pstate = penv.init(jax.random.key(0))
            seat = np.array([int(pstate.current_player), 1 - int(pstate.current_player)])  # our p -> pgx id
            cards = np.zeros(2, np.int32)
            cards[seat] = deal
            pstate = pstate.replace(_cards=jnp.asarray(cards))
            s = KUHN.init_state(deal)
            ts = view(KUHN, s)
            for ch in seq:
                facing = bool(ts.legal_action_mask[ts.current_player, kp.CALL])
                ours = (kp.CALL if facing else kp.BET) if ch == "b" else (kp.FOLD if facing else kp.CHECK)
                pstate = pstep(pstate, jnp.int32(0 if ch == "b" else 1))
                s, ts = _step[KUHN](KEY, s, jnp.int32(ours))
            assert bool(ts.terminated) and bool(pstate.terminated)
            np.testing.assert_array_equal(np.asarray(ts.reward), np.asarray(pstate.rewards)[seat])
