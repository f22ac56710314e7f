"""TicTacToe's perfect player (the warm-start expert and the ``minimax`` opponent).

``minimax_table()`` is the exact game-theoretic action-value table of every board (3^9 entries,
computed once in NumPy by retrograde recursion, cached); ``minimax_action`` plays a perfect move inside
jit, breaking ties uniformly at random so matches vary.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.envs.games.opponents import current_mask, uniform_choice
from jaxrl_reason.envs.games.tictactoe.rules import LINES

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
    return uniform_choice(key, (q == q.max()) & current_mask(ts))
