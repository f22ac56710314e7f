"""TicTacToe: standard 3x3 rules, two players, rewards +1 / 0 / -1.

State is two 9-bit integer bitboards (one per player); a win is a test against the eight
precomputed line masks, so a step is a handful of integer ops (no gathers, no sorting).

- Actions ``0..8`` mark cells in row-major order (``0 1 2 / 3 4 5 / 6 7 8``).
- ``first_player``: ``0`` (default, as OpenSpiel), ``1`` or ``"random"`` (as pgx: a coin flip at
  reset, the top bit of ``core.key_hash(key)``: a few integer ops instead of a threefry hash, so
  ``vmap(AutoReset.step)`` computes the reset for every row and selects it, ``cheap_reset``). The first
  mover plays ``X``.
- Observation of agent ``i``: ``[9]`` float32 board from its own view: +1 own mark, -1 the
  opponent's, 0 empty (compact on purpose: consumers pay per observation element).
- ``legal_action_mask[i]`` is the empty cells for the player to move and all False otherwise
  (and for everybody once the game is over).
- Illegal action (occupied cell or id outside ``0..8``): the episode terminates, the offender gets
  ``-illegal_action_penalty`` and the other player 0 (the board is not changed).
- Stepping a finished game is a no-op with zero reward (tree search relies on it).

Written as a ``SplitEnvironment`` (``reset_state`` / ``transition`` / ``observe``), so
``AutoReset`` encodes one observation per step; ``reset_states`` draws a whole batch's coin flips
from one key (``coin_flips``), so ``AutoReset.batch_step`` splits no per-environment keys.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_reason.envs.core import Observation, SplitEnvironment, Transition, key_hash

#: Bit masks of the 8 winning lines (rows, columns, diagonals).
LINES = tuple(
    sum(1 << c for c in line)
    for line in [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
)
FULL = (1 << 9) - 1
_CELL_BITS = np.asarray([1 << i for i in range(9)], np.int32)


@struct.dataclass
class TicTacToeState:
    marks: jax.Array  # [2] int32 bitboards, bit c of marks[p] set = player p owns cell c
    current_player: jax.Array  # int32
    first_player: jax.Array  # int32, the player who plays X
    terminated: jax.Array  # bool


def has_line(bits: jax.Array) -> jax.Array:
    """True where the bitboard ``bits`` (any shape) contains a full line: eight elementwise tests or-ed
    together (no reduction over a short minor axis, which XLA on CPU runs far slower)."""
    return functools.reduce(jnp.logical_or, [(bits & line) == line for line in LINES])


def bits_to_cells(bits: jax.Array) -> jax.Array:
    """``[..., 9]`` bool cells of a bitboard."""
    return (bits[..., None] & _CELL_BITS) != 0


def coin_flips(key, num: int) -> jax.Array:
    """``[num]`` int32 fair coins (0/1): the bits of one ``jax.random.bits`` draw of
    ``ceil(num / 32)`` uint32 words (bit ``i % 32`` of word ``i // 32``), one PRNG call for a batch."""
    words = jax.random.bits(key, (-(-num // 32),), jnp.uint32)
    bits = (words[:, None] >> jnp.arange(32, dtype=jnp.uint32)) & 1
    return bits.reshape(-1)[:num].astype(jnp.int32)


class TicTacToe(SplitEnvironment):
    deterministic_transition = True  # all chance is in reset_state
    cheap_reset = True  # the first player is a bit of the key's hash (core.key_hash), no threefry
    conformance_variants = ({}, {"first_player": "random"})

    def __init__(self, first_player: int | str = 0, illegal_action_penalty: float = 1.0):
        if first_player not in ("random", 0, 1):
            raise ValueError(f"first_player must be 'random', 0 or 1, got {first_player!r}")
        self.first_player = first_player
        self.illegal_action_penalty = float(illegal_action_penalty)
        self.num_agents = 2
        self.num_actions = 9
        self.obs_shape = (9,)
        self.max_episode_steps = 9

    def init_state(self, first_player) -> TicTacToeState:
        """The empty board with ``first_player`` (int) to move as X."""
        fp = jnp.asarray(first_player, jnp.int32)
        return TicTacToeState(
            marks=jnp.zeros(2, jnp.int32), current_player=fp, first_player=fp, terminated=jnp.bool_(False)
        )

    def reset_state(self, key) -> TicTacToeState:
        if self.first_player == "random":
            return self.init_state((key_hash(key) >> 31).astype(jnp.int32))
        return self.init_state(self.first_player)

    def reset_states(self, key, num: int) -> TicTacToeState:
        """``num`` fresh boards; with ``first_player="random"`` the coins are ``coin_flips(key, num)``."""
        if self.first_player == "random":
            return jax.vmap(self.init_state)(coin_flips(key, num))
        return jax.vmap(self.init_state)(jnp.full((num,), self.first_player, jnp.int32))

    def observe(self, s: TicTacToeState) -> Observation:
        m0, m1 = s.marks[0], s.marks[1]
        board0 = ((m0 & _CELL_BITS) != 0).astype(jnp.float32) - ((m1 & _CELL_BITS) != 0)
        empty = ((m0 | m1) & _CELL_BITS == 0) & ~s.terminated
        to_move = jnp.arange(2) == s.current_player
        return Observation(jnp.stack([board0, -board0]), to_move[:, None] & empty[None, :], s.current_player)

    def transition(self, key, state: TicTacToeState, action) -> Transition:
        del key
        a = jnp.asarray(action, jnp.int32)
        p = state.current_player
        me = jnp.arange(2) == p  # selects instead of indexing: no gathers/scatters under vmap
        m0, m1 = state.marks[0], state.marks[1]
        bit = jnp.where((a >= 0) & (a < 9), jnp.left_shift(1, jnp.clip(a, 0, 8)), 0)
        legal = (bit != 0) & (((m0 | m1) & bit) == 0)
        mine = jnp.where(p == 0, m0, m1) | jnp.where(legal, bit, 0)
        marks = jnp.where(me, mine, state.marks)
        won = has_line(mine)
        full = (marks[0] | marks[1]) == FULL
        win_reward = jnp.where(me, 1.0, -1.0)
        reward = jnp.where(
            legal, jnp.where(won, win_reward, 0.0), jnp.where(me, -self.illegal_action_penalty, 0.0)
        )
        done = ~legal | won | full
        live = ~state.terminated
        s = TicTacToeState(
            marks=jnp.where(live, marks, state.marks),
            current_player=jnp.where(live & ~done, 1 - p, p),
            first_player=state.first_player,
            terminated=state.terminated | done,
        )
        return Transition(s, jnp.where(live, reward, 0.0).astype(jnp.float32), s.terminated, jnp.bool_(False), {})
