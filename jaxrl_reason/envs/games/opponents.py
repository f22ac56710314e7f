"""Fixed opponents and exact evaluation for the games.

- ``random_action``: uniform over the legal actions of the player to move (any game).
- TicTacToe: ``minimax_table()`` is the exact game-theoretic action-value table of every board
  (3^9 entries, computed once in NumPy by retrograde recursion, cached); ``minimax_action`` plays
  a perfect move inside jit, breaking ties uniformly at random so matches vary.
- Kuhn Poker: a policy is a ``[3 cards, 4 decision histories]`` table of the probability of the
  aggressive action (bet at ``""``/``"p"``, call at ``"b"``/``"pb"``); histories fix the player.
  ``kuhn_value`` is player 0's expected payoff, ``kuhn_best_response_values`` the values of exact
  best responses (enumerating the 6 deals), ``kuhn_exploitability = (BR_0 + BR_1) / 2``
  (NashConv / 2; 0 exactly at a Nash equilibrium), ``kuhn_nash_policy(alpha)`` the known Nash
  family (game value -1/18). ``kuhn_average_*`` keep the time-averaged (sequence-form) policy of
  a run of self-play iterates. All are jnp functions, so they run inside training loops.
  ``kuhn_policy_action(pi)`` plays a table; ``kuhn_nash_action`` plays Nash alpha = ``KUHN_TEACHER_ALPHA``.
- Negotiation: ``negotiation_heuristic_action`` accepts any offer that raises its own inventory
  value and otherwise proposes a random offer that would (else denies).

Opponent functions act on one unbatched ``(key, state, ts)``; ``batched(fn)`` vmaps one.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.envs.games.kuhn_poker import CALL, BET
from jaxrl_reason.envs.games.negotiation import ACCEPT, DENY, FIRST_OFFER, Negotiation
from jaxrl_reason.envs.games.tictactoe import LINES

_NEG = -1e9
KUHN_TEACHER_ALPHA = 1.0 / 6.0  # the Nash member SPIRAL's teacher and "nash" opponent play


def current_mask(ts) -> jax.Array:
    """``[num_actions]`` legal mask of the player to move (one unbatched timestep)."""
    return jnp.where((jnp.arange(ts.legal_action_mask.shape[0]) == ts.current_player)[:, None],
                     ts.legal_action_mask, False).any(0)


def random_action(key, state, ts) -> jax.Array:
    """Uniformly random legal action of the player to move."""
    del state
    return jax.random.categorical(key, jnp.where(current_mask(ts), 0.0, _NEG)).astype(jnp.int32)


def batched(fn):
    """``fn(key, state, ts)`` on one game -> the same on a batch (one key for the batch)."""

    def run(key, state, ts):
        keys = jax.random.split(key, ts.current_player.shape[0])
        return jax.vmap(fn)(keys, state, ts)

    return run


# ----------------------------------------------------------------------------- TicTacToe
_POW3 = 3 ** np.arange(9)


@functools.cache
def minimax_table() -> np.ndarray:
    """``[3^9, 9]`` int8: value (+1 win, 0 draw, -1 loss) for the player to move of playing each
    cell under perfect play; ``-2`` for occupied cells. Index: sum_i c_i 3^i with ``c_i`` = 0 empty,
    1 the mover's mark, 2 the opponent's."""
    q = np.full((3**9, 9), -2, np.int8)
    seen = np.zeros(3**9, bool)

    def won(bits):
        return any((bits & line) == line for line in LINES)

    def value(own: int, opp: int) -> int:  # value for the mover of (own, opp) bitboards
        idx = sum(_POW3[i] * ((own >> i & 1) + 2 * (opp >> i & 1)) for i in range(9))
        if not seen[idx]:
            seen[idx] = True
            for a in range(9):
                if (own | opp) >> a & 1:
                    continue
                mine = own | 1 << a
                if won(mine):
                    q[idx, a] = 1
                elif (mine | opp) == 511:
                    q[idx, a] = 0
                else:
                    q[idx, a] = -value(opp, mine)
        return int(q[idx].max())

    value(0, 0)
    return q


def board_index(state) -> jax.Array:
    """Base-3 index (see ``minimax_table``) of a TicTacToe state from the mover's view."""
    p = state.current_player
    own = jnp.where(p == 0, state.marks[0], state.marks[1])
    opp = jnp.where(p == 0, state.marks[1], state.marks[0])
    bits = 1 << jnp.arange(9)
    cells = ((own & bits) != 0).astype(jnp.int32) + 2 * ((opp & bits) != 0)
    return (cells * _POW3).sum()


def minimax_q(state) -> jax.Array:
    """``[9]`` exact action values for the player to move (``-2`` illegal)."""
    return jnp.asarray(minimax_table())[board_index(state)].astype(jnp.int32)


def minimax_action(key, state, ts) -> jax.Array:
    """A perfect TicTacToe move, uniformly among the optimal ones."""
    q = minimax_q(state)
    best = (q == q.max()) & current_mask(ts)
    return jax.random.categorical(key, jnp.where(best, 0.0, _NEG)).astype(jnp.int32)


# ----------------------------------------------------------------------------- Kuhn Poker
def _sign(a, b):
    return jnp.sign(a - b).astype(jnp.float32)


def _pairs():
    """Card of the player in question ``[3, 1]`` and opponent card ``[3, 3]`` with weights."""
    c = jnp.arange(3)
    w = (c[:, None] != c[None, :]) * 0.5  # P(opponent card | own card)
    return c, w


def kuhn_best_response_values(pi: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Exact best-response values: ``(value of a BR player 0 vs pi, value of a BR player 1 vs pi)``.

    ``pi``: ``[3, 4]`` probability of bet/call per (card, decision history)."""
    pi = jnp.asarray(pi, jnp.float32)
    c, w = _pairs()
    s = _sign(c[:, None], c[None, :])  # [own, opp] showdown sign for the first index
    # player 0 (rows: c0, cols: c1); player 1 acts with pi[c1, 1] after a check, pi[c1, 2] after a bet
    bet1_after_check, call1 = pi[:, 1][None, :], pi[:, 2][None, :]
    call_pb = (w * bet1_after_check * 2 * s).sum(1)
    fold_pb = (w * bet1_after_check * -1.0).sum(1)
    check = (w * (1 - bet1_after_check) * s).sum(1) + jnp.maximum(call_pb, fold_pb)
    bet = (w * ((1 - call1) * 1.0 + call1 * 2 * s)).sum(1)
    br0 = jnp.maximum(check, bet).mean()
    # player 1 (rows: c1, cols: c0)
    bet0, call0_pb = pi[:, 0][None, :], pi[:, 3][None, :]
    call_b = (w * bet0 * 2 * s).sum(1)
    fold_b = (w * bet0 * -1.0).sum(1)
    check_p = (w * (1 - bet0) * s).sum(1)
    bet_p = (w * (1 - bet0) * (call0_pb * 2 * s + (1 - call0_pb) * 1.0)).sum(1)
    br1 = (jnp.maximum(call_b, fold_b) + jnp.maximum(check_p, bet_p)).mean()
    return br0, br1


def kuhn_value(pi0: jax.Array, pi1: jax.Array | None = None) -> jax.Array:
    """Player 0's expected payoff when player 0 uses ``pi0`` and player 1 ``pi1`` (default ``pi0``)."""
    pi0 = jnp.asarray(pi0, jnp.float32)
    pi1 = pi0 if pi1 is None else jnp.asarray(pi1, jnp.float32)
    c, w = _pairs()
    s = _sign(c[:, None], c[None, :])
    b0, call0 = pi0[:, 0][:, None], pi0[:, 3][:, None]
    b1, call1 = pi1[:, 1][None, :], pi1[:, 2][None, :]
    v_check = (1 - b1) * s + b1 * (call0 * 2 * s - (1 - call0))
    v_bet = (1 - call1) + call1 * 2 * s
    return (w * (b0 * v_bet + (1 - b0) * v_check)).sum(1).mean()


def kuhn_exploitability(pi: jax.Array) -> jax.Array:
    """``(BR_0(pi) + BR_1(pi)) / 2`` in chips per game; 0 at a Nash equilibrium."""
    br0, br1 = kuhn_best_response_values(pi)
    return 0.5 * (br0 + br1)


def kuhn_nash_policy(alpha: float = 0.0) -> jax.Array:
    """Kuhn's Nash family, ``alpha`` in ``[0, 1/3]``: ``[3, 4]`` bet/call probabilities."""
    if not 0.0 <= alpha <= 1.0 / 3.0:
        raise ValueError(f"alpha must be in [0, 1/3], got {alpha}")
    return jnp.asarray(
        [
            # "",       "p" (P1),  "b" (P1),  "pb" (P0)
            [alpha, 1.0 / 3.0, 0.0, 0.0],  # J
            [0.0, 0.0, 1.0 / 3.0, alpha + 1.0 / 3.0],  # Q
            [3 * alpha, 1.0, 1.0, 1.0],  # K
        ],
        jnp.float32,
    )


def kuhn_policy_action(pi: jax.Array):
    """A Kuhn Poker player ``act(key, state, ts)`` from a ``[3, 4]`` bet/call table."""

    def act(key, state, ts):
        h = jnp.minimum(state.hist, 3)
        card = jnp.where(state.current_player == 0, state.cards[0], state.cards[1])
        aggressive = jax.random.uniform(key) < pi[card, h]
        facing = h >= 2
        return jnp.where(facing, jnp.where(aggressive, 2, 3), jnp.where(aggressive, 1, 0)).astype(jnp.int32)

    return act


def kuhn_nash_action(env=None):
    """The Nash player (alpha = ``KUHN_TEACHER_ALPHA``) as ``act(key, state, ts)`` (``env`` unused)."""
    del env
    return kuhn_policy_action(kuhn_nash_policy(KUHN_TEACHER_ALPHA))


def kuhn_own_reach(pi: jax.Array) -> jax.Array:
    """``[3, 4]`` probability that the acting player's *own* earlier actions lead to each
    information set under ``pi`` (1 everywhere except player 0 at ``"pb"``: ``1 - P(bet)``)."""
    pi = jnp.asarray(pi, jnp.float32)
    return jnp.ones_like(pi).at[:, 3].set(1.0 - pi[:, 0])


def kuhn_average_init() -> tuple[jax.Array, jax.Array]:
    """Empty accumulator ``(numerator [3, 4], denominator [3, 4])`` of ``kuhn_average_update``."""
    return jnp.zeros((3, 4), jnp.float32), jnp.zeros((3, 4), jnp.float32)


def kuhn_average_update(acc, pi: jax.Array, weight=1.0):
    """Add policy ``pi`` (weight ``weight``) to the time-averaged policy.

    The average of mixed strategies is taken in sequence form: at each information set the
    behaviour probabilities are weighted by the player's own reach probability, so the
    resulting behaviour policy plays exactly the average of the iterates' strategies
    (the quantity fictitious play and no-regret self-play converge in)."""
    num, den = acc
    w = weight * kuhn_own_reach(pi)
    return num + w * jnp.asarray(pi, jnp.float32), den + w


def kuhn_average_policy(acc) -> jax.Array:
    """``[3, 4]`` time-averaged policy of an accumulator (0.5 where nothing was added)."""
    num, den = acc
    return jnp.where(den > 0, num / jnp.maximum(den, 1e-30), 0.5)


def kuhn_average_exploitability_curve(tables: jax.Array) -> jax.Array:
    """``[U]`` exploitability of the running time-averaged policy of ``tables`` ``[U, 3, 4]``
    (entry ``u`` averages iterates ``0..u``)."""

    def body(acc, pi):
        acc = kuhn_average_update(acc, pi)
        return acc, kuhn_exploitability(kuhn_average_policy(acc))

    return jax.lax.scan(body, kuhn_average_init(), jnp.asarray(tables, jnp.float32))[1]


def kuhn_uniform_policy() -> jax.Array:
    return jnp.full((3, 4), 0.5, jnp.float32)


def kuhn_value_vs_uniform(pi: jax.Array) -> jax.Array:
    """Expected payoff of ``pi`` against a uniformly random player, both seats equally often
    (chips per game; a Nash policy gets 5/36: +1/9 as player 0, +1/6 as player 1)."""
    u = kuhn_uniform_policy()
    return (kuhn_value(pi, u) - kuhn_value(u, pi)) / 2


def kuhn_infoset_obs() -> tuple[jax.Array, jax.Array]:
    """Observation and legal mask of the acting player at each information set:
    ``([3, 4, 4] obs, [3, 4, 4] mask)`` indexed ``[card, history, ...]``."""
    from jaxrl_reason.envs.games.kuhn_poker import _HIST_OBS

    card = (jnp.arange(3, dtype=jnp.float32) - 1)[:, None, None] * jnp.ones((3, 4, 1))
    hist = jnp.broadcast_to(jnp.asarray(_HIST_OBS[:4]), (3, 4, 3))
    facing = jnp.asarray([False, False, True, True])[None, :, None]
    mask = jnp.where(facing, jnp.asarray([False, False, True, True]), jnp.asarray([True, True, False, False]))
    return jnp.concatenate([card, hist], -1), jnp.broadcast_to(mask, (3, 4, 4))


def kuhn_table_from_probs(probs: jax.Array) -> jax.Array:
    """``[3, 4, 4]`` action probabilities at each information set -> ``[3, 4]`` policy table."""
    return jnp.concatenate([probs[:, :2, BET], probs[:, 2:, CALL]], axis=1)


# ----------------------------------------------------------------------------- Negotiation
def negotiation_gains(env: Negotiation, state) -> jax.Array:
    """``[num_offers]`` change of the *current player's* own value if it makes each offer and it
    is accepted (uses only that player's private values)."""
    me = jnp.arange(2) == state.current_player
    v = jnp.where(me[:, None], state.values, 0).sum(0)  # [2]
    r, g, w = (jnp.asarray(x) for x in (env.offer_give_res, env.offer_give, env.offer_recv))
    return jnp.where(r == 0, v[1] * w - v[0] * g, v[0] * w - v[1] * g)


def negotiation_heuristic_action(env: Negotiation):
    """A fixed heuristic player for ``env`` as ``fn(key, state, ts) -> action``."""

    def act(key, state, ts):
        gains = negotiation_gains(env, state)
        # the pending offer was made by the opponent: my gain is minus its proposer-side value
        me = jnp.arange(2) == state.current_player
        v = jnp.where(me[:, None], state.values, 0).sum(0)
        delta = -env.trade_delta(jnp.maximum(state.pending, 0))  # my inventory change
        accept_gain = (v * delta).sum()
        mask = current_mask(ts)
        good = mask[FIRST_OFFER:] & (gains > 0)
        offer = FIRST_OFFER + jax.random.categorical(key, jnp.where(good, 0.0, _NEG))
        fallback = jnp.where(good.any(), offer, DENY)
        return jnp.where(mask[ACCEPT] & (accept_gain > 0), ACCEPT, fallback).astype(jnp.int32)

    return act
