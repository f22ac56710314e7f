"""Negotiation (``envs.games.negotiation``): rule tests with hand-written game records, the heuristic expert and
its spec."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import testutil
from jaxrl_reason import envs
from jaxrl_reason.envs.games import GAMES, arena
from jaxrl_reason.envs.games import negotiation as neg
from jaxrl_reason.envs.games import opponents as O
from jaxrl_reason.envs.games.negotiation import ACCEPT, DENY

NEG = envs.make("negotiation")
RECORD = testutil.GameRecord(NEG)
KEY = jax.random.key(0)


# ------------------------------------------------------------------ Negotiation records
def neg_state(values=((1, 6), (6, 1))):
    return NEG.init_state(jnp.asarray(values))


def test_negotiation_trade_accept_and_sign_reward():
    s = neg_state()  # P0 values gold, P1 values wood
    offer = NEG.offer_action(0, 3, 1)  # P0 gives 3 wood, receives 1 gold
    s, ts = RECORD.play(s, [offer])
    assert bool(ts.legal_action_mask[1, ACCEPT])
    s, ts = RECORD.play(s, [ACCEPT])
    np.testing.assert_array_equal(s.inventory, [[7, 11], [13, 9]])
    # gains: P0 = -3*1 + 1*6 = 3 ; P1 = 3*6 - 1*1 = 17
    np.testing.assert_allclose(ts.info["value_change"], [3.0, 17.0])
    assert not bool(ts.legal_action_mask[0, ACCEPT])  # the offer was consumed
    s, ts = RECORD.play(s, [DENY] * 8)
    assert bool(ts.terminated) and int(s.turn) == 10
    np.testing.assert_array_equal(ts.reward, [-1.0, 1.0])


def test_negotiation_accept_on_last_turn_counts():
    s = neg_state()
    s, ts = RECORD.play(s, [DENY] * 8 + [NEG.offer_action(1, 1, 3)])  # P0 (turn 9) gives 1 gold for 3 wood
    assert not bool(ts.done)
    s, ts = RECORD.play(s, [ACCEPT])  # turn 10: P1 accepts, game ends
    assert bool(ts.terminated)
    np.testing.assert_array_equal(s.inventory, [[13, 9], [7, 11]])
    # P0: +3 wood*1 - 1 gold*6 = -3 ; P1: -3*6 + 1*1 = -17 -> P0 wins
    np.testing.assert_array_equal(ts.reward, [1.0, -1.0])


def test_negotiation_pending_offer_lapses_and_counter_offer_replaces():
    s = neg_state()
    s, ts = RECORD.play(s, [NEG.offer_action(0, 1, 1), NEG.offer_action(0, 2, 2)])  # counter-offer
    assert int(s.pending) == NEG.offer_action(0, 2, 2) - 2 and int(s.proposer) == 1
    s, ts = RECORD.play(s, [DENY])
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


# ------------------------------------------------------------------ expert (heuristic) and spec
def test_heuristic_beats_random():
    heur = O.batched(neg.SPEC.opponent("heuristic", NEG))
    rn, _ = arena.play(NEG, (heur, O.batched(O.random_action)), jax.random.key(3), 200)
    assert float(rn[:, 0].mean()) > 0.0


def test_offer_gains_use_the_movers_values():
    s = neg_state()  # player 0 values wood 1, gold 6
    gains = np.asarray(neg.offer_gains(NEG, s))
    give_wood_for_gold = NEG.offer_action(0, 1, 1) - neg.FIRST_OFFER
    give_gold_for_wood = NEG.offer_action(1, 1, 1) - neg.FIRST_OFFER
    assert gains[give_wood_for_gold] == 6 - 1 and gains[give_gold_for_wood] == 1 - 6


def test_spec_registers_the_package():
    assert GAMES["negotiation"] is neg.SPEC and neg.SPEC.env is neg.Negotiation and neg.SPEC.text is neg.NegotiationText
    assert tuple(neg.SPEC.opponents) == ("random", "heuristic") and neg.SPEC.expert == "heuristic"
    assert neg.SPEC.rationale(NEG, neg_state(), 1, None) == "Wood 6 gold 1."
