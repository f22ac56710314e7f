"""Kuhn Poker (``envs.games.kuhn_poker``): rule tests with hand-written game records, the exact evaluation (values,
exploitability, the time-averaged policy, the information sets), its spec hooks and a pgx differential test."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import testutil
from jaxrl_reason import envs
from jaxrl_reason.envs.games import GAMES
from jaxrl_reason.envs.games import kuhn_poker as kp

KUHN = envs.make("kuhn_poker")
RECORD = testutil.GameRecord(KUHN)
KEY = jax.random.key(0)


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
    _, ts = RECORD.play(KUHN.init_state(cards), actions)
    assert bool(ts.terminated)
    np.testing.assert_array_equal(ts.reward, [reward, -reward])


def test_kuhn_masks_and_illegal():
    s = KUHN.init_state((0, 1))
    ts = RECORD.view(s)
    np.testing.assert_array_equal(ts.legal_action_mask[0], [True, True, False, False])
    assert not bool(ts.legal_action_mask[1].any())
    s, ts = RECORD.play(s, [kp.BET])
    np.testing.assert_array_equal(ts.legal_action_mask[1], [False, False, True, True])
    _, bad = RECORD.step(KEY, s, jnp.int32(kp.CHECK))
    assert bool(bad.terminated)
    np.testing.assert_array_equal(bad.reward, [0.0, -1.0])


def test_kuhn_information_sets_are_distinct_observations():
    """Acting player's (card, history) -> observation must be injective (the pgx opening bug)."""
    seen = {}
    for deal in kp.DEALS:
        for hist_actions in ([], [kp.CHECK], [kp.BET], [kp.CHECK, kp.BET]):
            s, ts = RECORD.play(KUHN.init_state(deal), hist_actions) if hist_actions else (
                KUHN.init_state(deal), RECORD.view(KUHN.init_state(deal)))
            p = int(ts.current_player)
            key = (int(deal[p]), len(hist_actions), tuple(hist_actions))
            obs = tuple(np.asarray(ts.obs[p]).tolist())
            assert seen.setdefault(obs, key) == key, (obs, key, seen[obs])
    assert len(seen) == 12
    # the opponent's card never shows in a player's observation
    a = RECORD.view(KUHN.init_state((0, 1))).obs[0]
    b = RECORD.view(KUHN.init_state((0, 2))).obs[0]
    np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------ exact evaluation (expert)
def test_kuhn_exploitability_known_values():
    np.testing.assert_allclose(kp.exploitability(kp.uniform_policy()), 0.458333, atol=1e-5)
    np.testing.assert_allclose(kp.value(kp.uniform_policy()), 0.125, atol=1e-6)
    for alpha in (0.0, 0.1, 1 / 3):
        nash = kp.nash_policy(alpha)
        np.testing.assert_allclose(kp.value(nash), -1 / 18, atol=1e-6)
        np.testing.assert_allclose(kp.exploitability(nash), 0.0, atol=1e-6)
    # against a uniformly random player (both seats): 0 for the uniform policy itself, 5/36 for Nash
    np.testing.assert_allclose(kp.value_vs_uniform(kp.uniform_policy()), 0.0, atol=1e-6)
    np.testing.assert_allclose(kp.value_vs_uniform(kp.nash_policy(1 / 6)), 5 / 36, atol=1e-6)
    # always-bet is exploitable
    assert float(kp.exploitability(jnp.ones((3, 4)))) > 0.3
    with pytest.raises(ValueError):
        kp.nash_policy(0.5)


def test_kuhn_time_average_is_sequence_form():
    nash = kp.nash_policy(0.2)
    acc = kp.average_update(kp.average_update(kp.average_init(), nash), nash)
    np.testing.assert_allclose(kp.average_policy(acc), nash, atol=1e-6)
    # A always bets first (never reaches "pb"), B always checks: the average plays B's "pb" call rate
    a = jnp.zeros((3, 4)).at[:, 0].set(1.0).at[:, 3].set(0.9)
    b = jnp.zeros((3, 4)).at[:, 3].set(0.1)
    avg = kp.average_policy(kp.average_update(kp.average_update(kp.average_init(), a), b))
    np.testing.assert_allclose(avg[:, 0], 0.5, atol=1e-6)
    np.testing.assert_allclose(avg[:, 3], 0.1, atol=1e-6)
    curve = kp.average_exploitability_curve(jnp.stack([kp.uniform_policy(), nash, nash, nash]))
    assert curve.shape == (4,)
    np.testing.assert_allclose(curve[0], 0.458333, atol=1e-5)
    assert float(curve[-1]) < float(curve[1]) < float(curve[0])


def test_kuhn_infoset_obs_match_env():
    obs, mask = kp.infoset_obs()
    s = KUHN.init_state((2, 0))
    s, ts = KUHN.step(jax.random.key(0), s, jnp.int32(0))  # check -> history "p", player 1 (card J)
    np.testing.assert_array_equal(obs[0, 1], ts.obs[1])
    np.testing.assert_array_equal(mask[0, 1], ts.legal_action_mask[1])


def test_infoset_states_observe_as_infoset_obs():
    """``infosets`` (states, for LM prompts) and ``infoset_obs`` (observations, for networks) are the same 12
    information sets in the same order: each state, seen by its player to act, is that observation."""
    states, player, legal = kp.infosets(KUHN)
    obs, mask = kp.infoset_obs()
    seen = jax.vmap(KUHN.observe)(states)
    rows = jnp.arange(12)
    np.testing.assert_array_equal(seen.obs[rows, player], obs.reshape(12, -1))
    np.testing.assert_array_equal(seen.legal_action_mask[rows, player], mask.reshape(12, -1))
    np.testing.assert_array_equal(legal, mask.reshape(12, -1))
    np.testing.assert_array_equal(states.cards[rows, player], np.repeat(np.arange(3), 4))  # card-major


def test_spec_evaluations_and_policy_metrics():
    spec = GAMES["kuhn_poker"]
    assert spec is kp.SPEC and spec.env is kp.KuhnPoker and spec.text is kp.KuhnPokerText
    assert tuple(spec.opponents) == ("random", "nash") and spec.expert == "nash"
    # evaluations act on action probabilities at the infosets: Nash's probabilities there evaluate as Nash
    _, _, legal = spec.infosets(KUHN)
    pi = kp.nash_policy(kp.TEACHER_ALPHA).reshape(-1)
    aggressive = jnp.where(jnp.arange(12) % 4 < 2, kp.BET, kp.CALL)
    passive = jnp.where(jnp.arange(12) % 4 < 2, kp.CHECK, kp.FOLD)
    probs = (jax.nn.one_hot(aggressive, 4) * pi[:, None] + jax.nn.one_hot(passive, 4) * (1 - pi[:, None]))
    assert bool((probs[~legal] == 0).all())
    np.testing.assert_array_equal(kp.table_from_probs(probs), kp.nash_policy(kp.TEACHER_ALPHA))
    ev = {k: float(f(probs)) for k, f in spec.evaluations.items()}
    assert set(ev) == {"exploitability", "value_vs_random", "value_vs_nash_p0"}
    np.testing.assert_allclose(ev["exploitability"], 0.0, atol=1e-6)
    np.testing.assert_allclose(ev["value_vs_random"], 5 / 36, atol=1e-6)
    np.testing.assert_allclose(ev["value_vs_nash_p0"], -1 / 18, atol=1e-6)
    # policy_metrics reads an observation-level policy: uniform over the legal actions
    m = spec.policy_metrics(lambda obs, mask: mask / mask.sum(-1, keepdims=True))
    np.testing.assert_allclose(m["policy_table"], kp.uniform_policy())
    np.testing.assert_allclose(m["exploitability"], 0.458333, atol=1e-5)


def test_nash_player_plays_its_table():
    act = jax.jit(kp.SPEC.expert_player(KUHN))
    s = KUHN.init_state((2, 0))  # K opens: bets with 3 alpha = 1/2
    bets = [int(act(jax.random.key(i), s, RECORD.view(s))) for i in range(200)]
    assert set(bets) == {kp.CHECK, kp.BET} and 0.35 < np.mean(np.asarray(bets) == kp.BET) < 0.65
    s, ts = RECORD.play(KUHN.init_state((0, 2)), [kp.BET])  # K facing a bet always calls
    assert int(act(KEY, s, ts)) == kp.CALL


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
            ts = RECORD.view(s)
            for ch in seq:
                facing = bool(ts.legal_action_mask[ts.current_player, kp.CALL])
                ours = (kp.CALL if facing else kp.BET) if ch == "b" else (kp.FOLD if facing else kp.CHECK)
                pstate = pstep(pstate, jnp.int32(0 if ch == "b" else 1))
                s, ts = RECORD.step(KEY, s, jnp.int32(ours))
            assert bool(ts.terminated) and bool(pstate.terminated)
            np.testing.assert_array_equal(np.asarray(ts.reward), np.asarray(pstate.rewards)[seat])
