"""Text round trip, forfeit rule, minimax table, Kuhn exploitability, RAE, arena."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason import envs
from jaxrl_reason.envs.games import arena, opponents as O, text
from jaxrl_reason.rl.rae import rae_advantages

GAMES = ["tictactoe", "kuhn_poker", "negotiation"]


@pytest.fixture(scope="module", params=[(g, s) for g in GAMES for s in text.STYLES], ids="-".join)
def game(request):
    name, style = request.param
    env = envs.make(name)
    gt = text.game_text(env, style)
    state, ts = env.reset(jax.random.key(7))
    return env, gt, state, ts


def test_render_in_jit_fixed_length_and_offset(game):
    env, gt, state, ts = game
    render = jax.jit(gt.render, static_argnums=2)
    ids = render(state, ts.current_player, 3)
    assert ids.shape == (gt.prompt_length,) and ids.dtype == jnp.int32
    assert int(ids.min()) >= 3 and int(ids.max()) < 256 + 3
    assert text.to_str(ids, 3) == gt.describe(state, ts.current_player)
    batched = jax.vmap(gt.render, (0, None))(jax.tree.map(lambda x: jnp.stack([x, x]), state), 0)
    assert batched.shape == (2, gt.prompt_length)


def test_text_round_trip_every_legal_action(game):
    env, gt, state, ts = game
    parse = jax.jit(gt.parse, static_argnums=2)
    mask = ts.legal_action_mask[ts.current_player]
    for a in range(env.num_actions):
        ids = jnp.asarray(np.concatenate([text.encode("Let me think. "), gt.answer_ids(a)]))
        action, status = parse(ids, mask, 0)
        assert int(action) == a
        assert int(status) == (text.OK if bool(mask[a]) else text.ILLEGAL)
    # offset ids parse the same
    action, status = parse(jnp.asarray(gt.answer_ids(0, offset=5)), None, 5)
    assert int(action) == 0 and int(status) == text.OK


def test_parser_forfeit_rule(game):
    env, gt, state, ts = game
    a, s = gt.parse_str("I refuse to answer")
    assert (a, s) == (text.INVALID_ACTION, "no_answer")
    assert gt.parse_str("\\boxed{nonsense}") == (text.INVALID_ACTION, "unknown")
    assert gt.parse_str("\\boxed{" + gt.action_strings[0]) == (text.INVALID_ACTION, "no_answer")
    # last boxed wins, case and spaces ignored
    assert gt.parse_str("\\boxed{zzz} no, \\boxed{ " + gt.action_strings[1].upper() + " }")[0] == 1
    # an invalid answer forfeits: -penalty for the mover, 0 for the opponent, game over
    _, out = env.step(jax.random.key(0), state, jnp.int32(text.INVALID_ACTION))
    expected = np.zeros(2)
    expected[int(ts.current_player)] = -env.illegal_action_penalty
    assert bool(out.terminated)
    np.testing.assert_array_equal(out.reward, expected)


@pytest.mark.parametrize("style", text.STYLES)
def test_prompts_hide_private_information(style):
    env = envs.make("kuhn_poker")
    gt = text.game_text(env, style)
    assert gt.describe(env.init_state((0, 1)), 0) == gt.describe(env.init_state((0, 2)), 0)
    assert gt.describe(env.init_state((0, 1)), 0) != gt.describe(env.init_state((1, 2)), 0)
    neg = envs.make("negotiation")
    gn = text.game_text(neg, style)
    a = gn.describe(neg.init_state(jnp.asarray([[1, 6], [6, 1]])), 0)
    assert a == gn.describe(neg.init_state(jnp.asarray([[1, 6], [4, 2]])), 0)
    assert "wood 1, gold 6" in a
    with pytest.raises(ValueError, match="no text interface"):
        text.game_text(envs.make("catch"), style)


def test_compact_style_is_shorter_and_keeps_kuhn_infosets_distinct():
    env = envs.make("kuhn_poker")
    verbose, compact = (text.game_text(env, s) for s in ("verbose", "compact"))
    for g in GAMES:
        e = envs.make(g)
        assert 2 * text.game_text(e, "compact").prompt_length < text.game_text(e, "verbose").prompt_length
    seen = set()
    for card in range(3):
        for hist in range(4):  # the 4 decision points: start, after check, after bet, after check-bet
            mover = int(hist in (1, 2))
            deal = (card, (card + 1) % 3) if mover == 0 else ((card + 1) % 3, card)
            state = env.init_state(deal).replace(hist=jnp.int32(hist))
            seen.add(compact.describe(state, mover))
            assert verbose.describe(state, mover) != compact.describe(state, mover)
    assert len(seen) == 12
    with pytest.raises(ValueError, match="prompt style"):
        text.game_text(env, "terse")


def test_minimax_table_known_values():
    q = O.minimax_table()
    assert q[0].max() == 0 and (q[0] == 0).all()  # every opening move draws
    assert (q.max(1) > -2).sum() == 4520  # non-terminal positions reachable in play
    env = envs.make("tictactoe")
    s = env.init_state(0).replace(marks=jnp.asarray([0b11, 0b11000]))  # X to win at 2
    assert int(O.minimax_q(s)[2]) == 1


def test_kuhn_exploitability_known_values():
    np.testing.assert_allclose(O.kuhn_exploitability(O.kuhn_uniform_policy()), 0.458333, atol=1e-5)
    np.testing.assert_allclose(O.kuhn_value(O.kuhn_uniform_policy()), 0.125, atol=1e-6)
    for alpha in (0.0, 0.1, 1 / 3):
        nash = O.kuhn_nash_policy(alpha)
        np.testing.assert_allclose(O.kuhn_value(nash), -1 / 18, atol=1e-6)
        np.testing.assert_allclose(O.kuhn_exploitability(nash), 0.0, atol=1e-6)
    # against a uniformly random player (both seats): 0 for the uniform policy itself, 5/36 for Nash
    np.testing.assert_allclose(O.kuhn_value_vs_uniform(O.kuhn_uniform_policy()), 0.0, atol=1e-6)
    np.testing.assert_allclose(O.kuhn_value_vs_uniform(O.kuhn_nash_policy(1 / 6)), 5 / 36, atol=1e-6)
    # always-bet is exploitable
    assert float(O.kuhn_exploitability(jnp.ones((3, 4)))) > 0.3
    with pytest.raises(ValueError):
        O.kuhn_nash_policy(0.5)


def test_kuhn_time_average_is_sequence_form():
    nash = O.kuhn_nash_policy(0.2)
    acc = O.kuhn_average_update(O.kuhn_average_update(O.kuhn_average_init(), nash), nash)
    np.testing.assert_allclose(O.kuhn_average_policy(acc), nash, atol=1e-6)
    # A always bets first (never reaches "pb"), B always checks: the average plays B's "pb" call rate
    a = jnp.zeros((3, 4)).at[:, 0].set(1.0).at[:, 3].set(0.9)
    b = jnp.zeros((3, 4)).at[:, 3].set(0.1)
    avg = O.kuhn_average_policy(O.kuhn_average_update(O.kuhn_average_update(O.kuhn_average_init(), a), b))
    np.testing.assert_allclose(avg[:, 0], 0.5, atol=1e-6)
    np.testing.assert_allclose(avg[:, 3], 0.1, atol=1e-6)
    curve = O.kuhn_average_exploitability_curve(jnp.stack([O.kuhn_uniform_policy(), nash, nash, nash]))
    assert curve.shape == (4,)
    np.testing.assert_allclose(curve[0], 0.458333, atol=1e-5)
    assert float(curve[-1]) < float(curve[1]) < float(curve[0])


def test_kuhn_infoset_obs_match_env():
    env = envs.make("kuhn_poker")
    obs, mask = O.kuhn_infoset_obs()
    s = env.init_state((2, 0))
    s, ts = env.step(jax.random.key(0), s, jnp.int32(0))  # check -> history "p", player 1 (card J)
    np.testing.assert_array_equal(obs[0, 1], ts.obs[1])
    np.testing.assert_array_equal(mask[0, 1], ts.legal_action_mask[1])


def test_rae_matches_sequential_reference():
    rng = np.random.default_rng(0)
    returns, games, valid = rng.normal(size=(40, 2)), rng.integers(0, 3, 40), rng.random(40) > 0.3
    b0 = rng.normal(size=(3, 2))
    adv, nb = rae_advantages(b0, returns, games, valid, alpha=0.05)
    b, ref = b0.copy(), np.zeros_like(returns)
    for i in range(40):
        if valid[i]:
            ref[i] = returns[i] - b[games[i]]  # read before the update
            b[games[i]] = 0.95 * b[games[i]] + 0.05 * returns[i]
    np.testing.assert_allclose(adv, ref, atol=1e-5)
    np.testing.assert_allclose(nb, b, atol=1e-5)
    with pytest.raises(ValueError, match="alpha"):
        rae_advantages(b0, returns, alpha=0.0)


def test_minimax_never_loses_to_random_and_heuristic_beats_random():
    env = envs.make("tictactoe")
    play = jax.jit(lambda k, p: arena.play(env, p, k, 200), static_argnums=1)
    mm, rnd = O.batched(O.minimax_action), O.batched(O.random_action)
    r0, ill0 = play(jax.random.key(0), (mm, rnd))
    r1, ill1 = play(jax.random.key(1), (rnd, mm))
    assert (np.asarray(r0[:, 0]) >= 0).all() and (np.asarray(r1[:, 1]) >= 0).all()
    assert int(ill0) == 0 and int(ill1) == 0
    r, _ = play(jax.random.key(2), (mm, mm))
    assert (np.asarray(r) == 0).all()  # perfect play draws
    neg = envs.make("negotiation")
    heur = O.batched(O.negotiation_heuristic_action(neg))
    rn, _ = arena.play(neg, (heur, O.batched(O.random_action)), jax.random.key(3), 200)
    assert float(rn[:, 0].mean()) > 0.0
