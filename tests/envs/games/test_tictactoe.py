"""TicTacToe (``envs.games.tictactoe``): rule tests with hand-written game records, a mask property test, the
minimax expert, its spec and a pgx differential test."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import testutil
from jaxrl_reason import envs
from jaxrl_reason.envs.games import GAMES, arena
from jaxrl_reason.envs.games import opponents as O
from jaxrl_reason.envs.games import tictactoe as ttt

TTT = envs.make("tictactoe")
RECORD = testutil.GameRecord(TTT)
KEY = jax.random.key(0)


# ------------------------------------------------------------------ TicTacToe records
def test_ttt_row_win_for_first_player():
    _, ts = RECORD.play(TTT.init_state(0), [0, 3, 1, 4, 2])
    assert bool(ts.terminated)
    np.testing.assert_array_equal(ts.reward, [1.0, -1.0])


def test_ttt_diagonal_win_for_second_player_who_moves_first():
    s = TTT.init_state(1)  # player 1 is X
    _, ts = RECORD.play(s, [2, 0, 4, 1, 6])
    np.testing.assert_array_equal(ts.reward, [-1.0, 1.0])


def test_ttt_full_board_draw():
    # X: 0 1 5 6 8 ; O: 2 3 4 7  -> no line
    _, ts = RECORD.play(TTT.init_state(0), [0, 2, 1, 3, 5, 4, 6, 7, 8])
    assert bool(ts.terminated)
    np.testing.assert_array_equal(ts.reward, [0.0, 0.0])
    assert not bool(ts.legal_action_mask.any())


def test_ttt_win_on_last_move_is_win_not_draw():
    # X: 0 1 5 6 4->? build X win on move 9: X 0 2 3 7 + 8? use X: 1 3 5 6 8? check below
    _, ts = RECORD.play(TTT.init_state(0), [0, 1, 2, 4, 3, 5, 7, 6, 8])  # X 0 2 3 7 8 ; O 1 4 5 6
    # X has 6? no; lines for X: (0,3,6)? 6 is O. (2,5,8)? 5 O. (6,7,8)? 6 O -> draw
    np.testing.assert_array_equal(ts.reward, [0.0, 0.0])
    _, ts = RECORD.play(TTT.init_state(0), [4, 0, 8, 2, 1, 7, 3, 5, 6])  # X 4 8 1 3 6: (2,4,6)? 2 is O
    assert bool(ts.terminated)
    _, ts = RECORD.play(TTT.init_state(0), [0, 1, 2, 4, 3, 5, 7, 8, 6])  # X 0 2 3 7 6 -> (0,3,6)
    np.testing.assert_array_equal(ts.reward, [1.0, -1.0])


def test_ttt_illegal_move_forfeits_and_keeps_board():
    s, ts = RECORD.play(TTT.init_state(0), [4])
    s2, ts2 = RECORD.step(KEY, s, jnp.int32(4))
    assert bool(ts2.terminated)
    np.testing.assert_array_equal(ts2.reward, [0.0, -1.0])
    np.testing.assert_array_equal(s2.marks, s.marks)
    _, ts3 = RECORD.step(KEY, s, jnp.int32(-1))
    np.testing.assert_array_equal(ts3.reward, [0.0, -1.0])
    # stepping a finished game is a no-op
    s4, ts4 = RECORD.step(KEY, s2, jnp.int32(0))
    np.testing.assert_array_equal(ts4.reward, [0.0, 0.0])
    np.testing.assert_array_equal(s4.marks, s2.marks)


def test_has_line_on_every_bitboard():
    """``has_line`` on all 512 bitboards (and batched shapes) against the cells: a row, column or diagonal full."""
    bits = jnp.arange(512, dtype=jnp.int32)
    cells = np.asarray(ttt.bits_to_cells(bits)).reshape(512, 3, 3)
    want = (cells.all(1).any(1) | cells.all(2).any(1) | cells[:, [0, 1, 2], [0, 1, 2]].all(1)
            | cells[:, [0, 1, 2], [2, 1, 0]].all(1))
    np.testing.assert_array_equal(jax.jit(ttt.has_line)(bits), want)
    np.testing.assert_array_equal(ttt.has_line(bits.reshape(64, 8)), want.reshape(64, 8))
    assert 0 < want.sum() < 512


def test_ttt_bad_config():
    with pytest.raises(ValueError, match="first_player"):
        envs.make("tictactoe", first_player=2)



@settings(max_examples=20, deadline=None)
@given(cells=st.permutations(list(range(9))))
def test_ttt_mask_matches_rules(cells):
    s, ts = TTT.init_state(0), RECORD.view(TTT.init_state(0))
    taken = set()
    for c in cells:
        if bool(ts.done):
            break
        expected = np.array([i not in taken for i in range(9)])
        np.testing.assert_array_equal(ts.legal_action_mask[ts.current_player], expected)
        s, ts = RECORD.step(KEY, s, jnp.int32(c))
        taken.add(c)


# ------------------------------------------------------------------ expert (minimax) and spec
def test_minimax_table_known_values():
    q = ttt.minimax_table()
    assert q[0].max() == 0 and (q[0] == 0).all()  # every opening move draws
    assert (q.max(1) > -2).sum() == 4520  # non-terminal positions reachable in play
    s = TTT.init_state(0).replace(marks=jnp.asarray([0b11, 0b11000]))  # X to win at 2
    assert int(ttt.minimax_q(s)[2]) == 1


def test_minimax_never_loses_to_random_and_draws_itself():
    play_n = jax.jit(lambda k, p: arena.play(TTT, p, k, 200), static_argnums=1)
    mm, rnd = O.batched(ttt.SPEC.opponent("minimax", TTT)), O.batched(O.random_action)
    r0, ill0 = play_n(jax.random.key(0), (mm, rnd))
    r1, ill1 = play_n(jax.random.key(1), (rnd, mm))
    assert (np.asarray(r0[:, 0]) >= 0).all() and (np.asarray(r1[:, 1]) >= 0).all()
    assert int(ill0) == 0 and int(ill1) == 0
    r, _ = play_n(jax.random.key(2), (mm, mm))
    assert (np.asarray(r) == 0).all()  # perfect play draws


def test_spec_registers_the_package():
    assert GAMES["tictactoe"] is ttt.SPEC and ttt.SPEC.env is ttt.TicTacToe and ttt.SPEC.text is ttt.TicTacToeText
    assert tuple(ttt.SPEC.opponents) == ("random", "minimax") and ttt.SPEC.expert == "minimax"
    assert ttt.SPEC.expert_player(TTT) is ttt.minimax_action
    assert ttt.SPEC.rationale(TTT, None, 0, np.asarray([True, False, True] + [False] * 6)) == "Free 02."


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
        ts = RECORD.view(s)
        while not bool(ts.done):
            legal = np.flatnonzero(np.asarray(pstate.legal_action_mask))
            np.testing.assert_array_equal(np.asarray(ts.legal_action_mask[ts.current_player]), np.asarray(pstate.legal_action_mask))
            assert int(ts.current_player) == int(pstate.current_player)
            a = int(rng.choice(legal))
            pstate = pstep(pstate, jnp.int32(a))
            s, ts = RECORD.step(KEY, s, jnp.int32(a))
            np.testing.assert_array_equal(np.asarray(ts.reward), np.asarray(pstate.rewards))
        assert bool(pstate.terminated)
