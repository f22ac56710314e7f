"""Golden Hanabi games on hand-made decks, symmetry, and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason.envs.hanabi import Hanabi, game, symmetry
from jaxrl_reason.envs.hanabi.game import encode_action

ENV = Hanabi(num_players=2)
CFG = ENV.config
STEP = jax.jit(ENV.step)
RESET = jax.jit(ENV.reset_from_deck)


def card(s):
    return "RYGWB".index(s[0]) * 5 + int(s[1]) - 1


def make_deck(top):
    """Deck starting with the cards named in ``top``; the rest in sorted order."""
    rest = list(CFG.sorted_deck())
    ids = [card(s) for s in top]
    for i in ids:
        rest.remove(i)
    return jnp.asarray(ids + rest, jnp.int32)


def play(deck, actions):
    state, ts = RESET(deck)
    rewards = []
    for a in actions:
        assert bool(ts.legal_action_mask[int(ts.current_player), a]), (a, game.render(CFG, state))
        state, ts = STEP(jax.random.key(0), state, jnp.int32(a))
        rewards.append(float(ts.reward[0]))
    return state, ts, rewards


PLAY0, HINT_R1 = 5, encode_action(CFG, "rank", 1, target=0, value=0)  # P1 hints P0 "ones"


def test_five_returns_a_token():
    # P0 holds R1..R5 and plays slot 0 five times (slots shift left); P1 hints in between.
    deck = make_deck(["R1", "R2", "R3", "R4", "R5", "Y1", "Y2", "Y3", "G1", "G2"])
    hint = encode_action(CFG, "colour", 1, target=0, value=0)
    state, ts, rewards = play(deck, [PLAY0, hint, PLAY0, hint, PLAY0, hint, PLAY0, hint, PLAY0])
    assert rewards == [1, 0, 1, 0, 1, 0, 1, 0, 1]
    assert int(state.score) == 5 and int(state.fireworks[0]) == 5
    assert int(state.info_tokens) == 8 - 4 + 1  # four hints, one token back for R5
    assert not bool(ts.terminated)


def test_five_gives_no_token_at_eight():
    deck = make_deck(["R1", "R2", "R3", "R4", "R5", "Y1", "Y2", "Y3", "G1", "G2"])
    disc1 = encode_action(CFG, "discard", 1, slot=0)
    hint = encode_action(CFG, "colour", 1, target=0, value=0)
    # P1 hints once then discards, keeping tokens at 8 when R5 is played.
    acts = [PLAY0, hint, PLAY0, disc1, PLAY0, hint, PLAY0, disc1, PLAY0]
    state, _, _ = play(deck, acts)
    assert int(state.info_tokens) == 8 and int(state.score) == 5


def test_loss_of_last_life_scores_zero():
    deck = make_deck(["R1", "R3", "R4", "R5", "Y3", "Y1", "Y2", "G1", "G2", "B1"])
    hint = HINT_R1
    state, ts, rewards = play(deck, [PLAY0, hint, PLAY0, hint, PLAY0, hint, PLAY0])
    assert rewards == [1, 0, 0, 0, 0, 0, -1]
    assert bool(ts.terminated) and int(state.score) == 0 and int(state.life_tokens) == 0
    assert list(np.asarray(state.discards)[[card("R4"), card("R5"), card("R3")]]) == [1, 1, 1]


def test_last_round_after_the_deck_runs_out():
    """Both players discard slot 0 (hinting when at 8 tokens): the deck empties after 40
    draws and each player then gets exactly one more turn."""
    deck = make_deck(["R1", "Y1", "G1", "W1", "B1", "R2", "Y2", "G2", "W2", "B2"])
    state, ts = RESET(deck)
    t, empty_at, final_discards = 0, None, 0
    while not bool(ts.terminated):
        p = int(ts.current_player)
        legal = np.asarray(ts.legal_action_mask[p])
        a = 0 if legal[0] else int(np.flatnonzero(legal[2 * CFG.hand_size:])[0]) + 2 * CFG.hand_size
        final_discards += empty_at is not None and a == 0
        state, ts = STEP(jax.random.key(t), state, jnp.int32(a))
        t += 1
        if empty_at is None and int(state.num_dealt) == CFG.deck_size:
            empty_at = t
        assert t < 200
    assert empty_at is not None and t == empty_at + CFG.num_players
    assert int(state.score) == 0 and int(state.life_tokens) == 3
    # discards in the final round draw nothing: they leave empty slots
    assert (np.asarray(state.hands) < 0).sum() == final_discards


def test_illegal_move_keeps_state_and_penalises():
    deck = make_deck([])
    state, ts = RESET(deck)
    new, bad = STEP(jax.random.key(0), state, jnp.int32(0))  # discard at 8 tokens
    assert bool(bad.terminated) and list(np.asarray(bad.reward)) == [-1.0, 0.0]
    np.testing.assert_array_equal(np.asarray(new.hands), np.asarray(state.hands))
    assert int(new.info_tokens) == 8
    again, ts2 = STEP(jax.random.key(0), new, jnp.int32(5))  # stepping a finished game
    assert bool(ts2.terminated) and float(ts2.reward.sum()) == 0.0


def test_bad_config_and_deck():
    with pytest.raises(ValueError, match="2 to 5 players"):
        Hanabi(num_players=6)
    with pytest.raises(ValueError, match="obs_mode"):
        Hanabi(obs_mode="pixels")
    with pytest.raises(ValueError, match="deck must have shape"):
        game.init_from_deck(CFG, jnp.zeros(10, jnp.int32))


def test_colour_permutation_commutes_with_step():
    perm = jnp.asarray([2, 0, 4, 1, 3])
    deck = jnp.asarray(np.random.default_rng(1).permutation(CFG.sorted_deck()))
    state = game.init_from_deck(CFG, deck)
    step = jax.jit(lambda s, a: game.step(CFG, s, a, jax.random.key(0)))
    rng = np.random.default_rng(0)
    permute = jax.jit(lambda s: symmetry.permute_state(CFG, s, perm))
    for _ in range(20):
        legal = np.asarray(game.legal_moves(CFG, state)[int(state.cur_player)])
        a = int(rng.choice(np.flatnonzero(legal)))
        pa = symmetry.permute_action(CFG, a, perm)
        ps = permute(state)
        assert bool(game.legal_moves(CFG, ps)[int(state.cur_player), pa])
        state, r = step(state, a)
        ps2, r2 = step(ps, pa)
        assert int(r) == int(r2)
        jax.tree.map(np.testing.assert_array_equal, permute(state), ps2)
        if bool(state.terminal):
            break
