"""Kuhn Poker: 3-card deck (J < Q < K), ante 1, one betting round, two players.

Rules: each player antes 1 and gets one private card. Player 0 acts first:
``check`` or ``bet`` (1 chip). After a check, player 1 may ``check`` (showdown for 1) or ``bet``;
facing a bet a player may ``call`` (showdown for 2) or ``fold`` (loses 1). The higher card wins
a showdown. Rewards are the chips won: ``+-1`` or ``+-2``, zero-sum. Game value for player 0
under Nash play: ``-1/18``.

- Actions: ``0 check``, ``1 bet``, ``2 call``, ``3 fold``; the mask allows ``check, bet`` before
  any bet and ``call, fold`` facing one.
- Public histories (``hist``): ``0 ""``, ``1 "p"``, ``2 "b"``, ``3 "pb"`` (decision points) and
  terminals ``4 "pp"``, ``5 "bp"``, ``6 "bc"``, ``7 "pbp"``, ``8 "pbc"`` (``p`` = check/fold,
  ``b`` = bet/call).
- Observation of agent ``i``: ``[4]`` float32 ``[card, a1, a2, a3]``: own card ``-1/0/+1`` for
  ``J/Q/K`` and the public actions so far (``-1`` check/fold, ``+1`` bet/call, ``0`` not yet).
  Every information set (own card + public history) is a distinct observation, including the
  opening one (``[c, 0, 0, 0]``) vs player 1 after a check (``[c, -1, 0, 0]``).
- Illegal action (or an id outside ``0..3``): the episode terminates, the offender gets
  ``-illegal_action_penalty``, the other player 0. Stepping a finished game is a no-op.
- A ``SplitEnvironment``: ``AutoReset`` encodes one observation per step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_reason.envs.core import Observation, SplitEnvironment, Transition

CHECK, BET, CALL, FOLD = 0, 1, 2, 3
ACTION_NAMES = ("check", "bet", "call", "fold")
CARD_NAMES = ("J", "Q", "K")
HISTORIES = ("", "p", "b", "pb", "pp", "bp", "bc", "pbp", "pbc")
NUM_DECISION_HISTORIES = 4
# next history for (hist, action) at the 4 decision points; -1 marks an illegal action
_NEXT = np.asarray([[1, 2, -1, -1], [4, 3, -1, -1], [-1, -1, 6, 5], [-1, -1, 8, 7]], np.int32)
# public actions of each history as observation entries (-1 pass, +1 bet, 0 none)
_HIST_OBS = np.asarray(
    [[0, 0, 0], [-1, 0, 0], [1, 0, 0], [-1, 1, 0], [-1, -1, 0], [1, -1, 0], [1, 1, 0],
     [-1, 1, -1], [-1, 1, 1]],
    np.float32,
)
# reward of player 0 at a terminal history: _SHOWDOWN * sign(card0 - card1) + _FOLD
_SHOWDOWN = np.asarray([0, 0, 0, 0, 1, 0, 2, 0, 2], np.float32)
_FOLD = np.asarray([0, 0, 0, 0, 0, 1, 0, -1, 0], np.float32)
#: the 6 deals (card of player 0, card of player 1)
DEALS = np.asarray([[0, 1], [0, 2], [1, 0], [1, 2], [2, 0], [2, 1]], np.int32)


@struct.dataclass
class KuhnState:
    cards: jax.Array  # [2] int32 in {0: J, 1: Q, 2: K}
    hist: jax.Array  # int32 public history id (see module docstring)
    terminated: jax.Array  # bool

    @property
    def current_player(self) -> jax.Array:
        """Player to act: 1 at histories ``p`` and ``b``, else 0."""
        return ((self.hist == 1) | (self.hist == 2)).astype(jnp.int32)


class KuhnPoker(SplitEnvironment):
    deterministic_transition = True  # all chance is in reset_state

    def __init__(self, illegal_action_penalty: float = 1.0):
        self.illegal_action_penalty = float(illegal_action_penalty)
        self.num_agents = 2
        self.num_actions = 4
        self.obs_shape = (4,)
        self.max_episode_steps = 3

    def init_state(self, cards) -> KuhnState:
        """The opening state for ``cards`` ``[2]`` (player 0's, player 1's)."""
        return KuhnState(cards=jnp.asarray(cards, jnp.int32), hist=jnp.int32(0), terminated=jnp.bool_(False))

    def reset_state(self, key) -> KuhnState:
        return self.init_state(jnp.asarray(DEALS)[jax.random.randint(key, (), 0, 6)])

    def reset_states(self, key, num: int) -> KuhnState:
        """``num`` deals from one ``randint`` draw (one PRNG call for the batch)."""
        return jax.vmap(self.init_state)(jnp.asarray(DEALS)[jax.random.randint(key, (num,), 0, 6)])

    def observe(self, s: KuhnState) -> Observation:
        h = jnp.asarray(_HIST_OBS)[s.hist]  # [3]
        card = (s.cards - 1).astype(jnp.float32)  # [2]
        obs = jnp.concatenate([card[:, None], jnp.broadcast_to(h, (2, 3))], axis=1)
        facing_bet = (s.hist == 2) | (s.hist == 3)
        legal = (jnp.arange(4) >= 2) == facing_bet  # check/bet, or call/fold facing a bet
        cp = s.current_player
        return Observation(obs, (jnp.arange(2) == cp)[:, None] & (legal & ~s.terminated)[None, :], cp)

    def transition(self, key, state: KuhnState, action) -> Transition:
        del key
        a = jnp.asarray(action, jnp.int32)
        h = jnp.minimum(state.hist, NUM_DECISION_HISTORIES - 1)
        nxt = jnp.asarray(_NEXT)[h, jnp.clip(a, 0, 3)]
        legal = (a >= 0) & (a < 4) & (nxt >= 0)
        hist = jnp.where(legal, nxt, state.hist)
        sign = jnp.where(state.cards[0] > state.cards[1], 1.0, -1.0)
        r0 = jnp.asarray(_SHOWDOWN)[hist] * sign + jnp.asarray(_FOLD)[hist]
        me = jnp.arange(2) == state.current_player
        reward = jnp.where(legal, jnp.stack([r0, -r0]), jnp.where(me, -self.illegal_action_penalty, 0.0))
        live = ~state.terminated
        s = KuhnState(
            cards=state.cards,
            hist=jnp.where(live, hist, state.hist),
            terminated=state.terminated | ~legal | (hist >= NUM_DECISION_HISTORIES),
        )
        return Transition(s, jnp.where(live, reward, 0.0).astype(jnp.float32), s.terminated, jnp.bool_(False), {})
