"""Kuhn Poker: rule tests with hand-written game records and a pgx differential test."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason import envs
from jaxrl_reason.envs.games import kuhn_poker as kp

KUHN = envs.make("kuhn_poker")
_step = {KUHN: jax.jit(KUHN.step)}
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
