"""Liar's Dice, two players, ``dice`` dice of ``faces`` faces each (default 1 die of 6 faces, OpenSpiel's size).

Rules: each player rolls its dice in secret. Player 0 opens with a bid ``(q, f)``: "at least ``q`` of all
dice show face ``f``". Players alternate; each either raises the bid (a higher bid index, see below) or
calls ``liar`` (not on the opening move). On a call the dice are revealed: if at least ``q`` dice show
``f`` the bidder wins, else the caller; the winner gets ``+1``, the loser ``-1`` (no wild faces).

- Actions: bid ``(q, f)`` (``q`` in ``1..2*dice``, ``f`` in ``1..faces``) is id ``(q - 1) * faces + (f - 1)``
  (ordered by count, then face: raising is any larger id); ``LIAR = num_bids = 2 * dice * faces``.
- Observation of agent ``i``: ``[faces + num_bids + 1]`` float32: own face counts / ``dice``, a one-hot
  of the standing bid, and 1 if agent ``i`` made it.
- Illegal action (or an id outside ``0..num_bids``): the episode ends, the offender gets
  ``-illegal_action_penalty``, the other 0. Stepping a finished game is a no-op. A ``SplitEnvironment``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_reason.envs.core import Observation, SplitEnvironment, Transition


@struct.dataclass
class LiarsDiceState:
    dice: jax.Array  # [2, dice] int32 faces 0..faces-1
    bid: jax.Array  # int32 standing bid id (-1: none yet)
    current_player: jax.Array  # int32 player to act
    terminated: jax.Array  # bool


class LiarsDice(SplitEnvironment):
    deterministic_transition = True  # all chance is in reset_state

    def __init__(self, dice: int = 1, faces: int = 6, illegal_action_penalty: float = 1.0):
        if not 1 <= dice <= 4 or not 2 <= faces <= 9:
            raise ValueError(f"LiarsDice: dice must be in 1..4 and faces in 2..9, got {dice}, {faces}")
        self.dice, self.faces = int(dice), int(faces)
        self.illegal_action_penalty = float(illegal_action_penalty)
        self.num_bids = 2 * self.dice * self.faces
        self.liar = self.num_bids
        self.num_agents = 2
        self.num_actions = self.num_bids + 1
        self.obs_shape = (self.faces + self.num_bids + 1,)
        self.max_episode_steps = self.num_bids + 1

    def bid_of(self, action) -> tuple[jax.Array, jax.Array]:
        """Bid id -> ``(count q in 1..2*dice, face index f - 1 in 0..faces-1)``."""
        return action // self.faces + 1, action % self.faces

    def counts(self, dice: jax.Array) -> jax.Array:
        """``[..., dice]`` faces -> ``[..., faces]`` int32 counts."""
        return (dice[..., None] == jnp.arange(self.faces)).sum(-2).astype(jnp.int32)

    def init_state(self, dice) -> LiarsDiceState:
        """The opening state for ``dice`` ``[2, dice]`` (faces 0..faces-1)."""
        return LiarsDiceState(dice=jnp.asarray(dice, jnp.int32), bid=jnp.int32(-1), current_player=jnp.int32(0),
                              terminated=jnp.bool_(False))

    def reset_state(self, key) -> LiarsDiceState:
        return self.init_state(jax.random.randint(key, (2, self.dice), 0, self.faces))

    def legal_mask(self, s: LiarsDiceState) -> jax.Array:
        """``[num_actions]`` legal actions of the player to act (all False once the game ended)."""
        ids = jnp.arange(self.num_actions)
        return ((ids > s.bid) & (ids < self.liar) | (ids == self.liar) & (s.bid >= 0)) & ~s.terminated

    def observe(self, s: LiarsDiceState) -> Observation:
        own = self.counts(s.dice).astype(jnp.float32) / self.dice  # [2, faces]
        bid = jnp.broadcast_to(jnp.arange(self.num_bids) == s.bid, (2, self.num_bids)).astype(jnp.float32)
        mine = ((jnp.arange(2) != s.current_player) & (s.bid >= 0)).astype(jnp.float32)[:, None]  # the other bid
        obs = jnp.concatenate([own, bid, mine], axis=1)
        me = jnp.arange(2) == s.current_player
        return Observation(obs, me[:, None] & self.legal_mask(s)[None, :], s.current_player)

    def transition(self, key, state: LiarsDiceState, action) -> Transition:
        del key
        a = jnp.asarray(action, jnp.int32)
        legal = (a >= 0) & (a < self.num_actions) & self.legal_mask(state)[jnp.clip(a, 0, self.num_actions - 1)]
        call = legal & (a == self.liar)
        q, f = self.bid_of(jnp.maximum(state.bid, 0))
        true_bid = self.counts(state.dice.reshape(-1))[f] >= q
        me = jnp.arange(2) == state.current_player
        caller_wins = jnp.where(true_bid, -1.0, 1.0)
        reward = jnp.where(legal, jnp.where(call, jnp.where(me, caller_wins, -caller_wins), 0.0),
                           jnp.where(me, -self.illegal_action_penalty, 0.0))
        live = ~state.terminated
        s = LiarsDiceState(
            dice=state.dice,
            bid=jnp.where(live & legal & ~call, a, state.bid),
            current_player=jnp.where(live & legal & ~call, 1 - state.current_player, state.current_player),
            terminated=state.terminated | ~legal | call,
        )
        return Transition(s, jnp.where(live, reward, 0.0).astype(jnp.float32), s.terminated, jnp.bool_(False), {})
