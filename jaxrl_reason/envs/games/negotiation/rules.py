"""Simple Negotiation (SPIRAL / TextArena style): trade Wood and Gold under private valuations.

Rules (exact):

- Two resources, ``0 = wood`` and ``1 = gold``. Each player starts with ``initial_amount`` of
  both (default 10). Inventories are public.
- Valuations are private and opposite: at reset a fair coin picks the resource player 0 prefers;
  player 1 prefers the other. Each player draws its value of the preferred resource uniformly
  from ``{4, 5, 6}`` and of the other from ``{1, 2, 3}``.
- Players alternate, player 0 first, for exactly ``max_turns`` turns (default 10); one action a
  turn. Actions: ``0 accept`` (only when the opponent's offer is pending), ``1 deny`` (always
  legal: rejects the pending offer, or passes), and offers
  ``2 + r * Q * Q + (g - 1) * Q + (w - 1)`` = "I give ``g`` of resource ``r`` and receive
  ``w`` of resource ``1 - r``" for ``g, w`` in ``1..Q`` (``Q = max_qty``, default 3). An offer
  is legal when the proposer holds ``g`` of ``r`` and the opponent holds ``w`` of ``1 - r``.
  A new offer replaces a pending one (a counter-offer); accepting executes the trade at once.
  An offer still pending after the last turn lapses. Several trades may happen in one game.
- When the turns are used up, each player's gain is ``D_i = values_i . (inventory_i - initial)``
  and rewards are zero-sum: ``reward="sign"`` (default, SPIRAL): ``+1 / 0 / -1`` by
  ``sign(D_0 - D_1)``; ``reward="margin"``: ``clip((D_0 - D_1) / (6 * initial_amount), -1, 1)``.
  ``ts.info["value_change"]`` always holds ``[D_0, D_1]`` so far.
- Illegal action (or an id out of range): the game ends, the offender gets
  ``-illegal_action_penalty`` and the opponent 0. Stepping a finished game is a no-op.

Observation of agent ``i`` (``[12]`` float32): own values ``/6`` (2), own inventory and the
opponent's ``/ (2 * initial_amount)`` (2 + 2), pending-offer flag and the change of *own*
inventory (wood, gold) if it is accepted ``/ Q`` (3), turns used ``/ max_turns`` (1), whether
it is agent ``i``'s own offer that is pending (1), seat ``i`` (1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_reason.envs.core import Environment, TimeStep

ACCEPT, DENY, FIRST_OFFER = 0, 1, 2
RESOURCE_NAMES = ("wood", "gold")
HIGH_VALUES = (4, 5, 6)
LOW_VALUES = (1, 2, 3)


@struct.dataclass
class NegotiationState:
    inventory: jax.Array  # [2 players, 2 resources] int32
    values: jax.Array  # [2 players, 2 resources] int32 (private)
    pending: jax.Array  # int32 offer index in [0, 2 Q^2) or -1
    proposer: jax.Array  # int32 player who made the pending offer
    turn: jax.Array  # int32 turns played
    current_player: jax.Array  # int32
    terminated: jax.Array  # bool
    reward: jax.Array  # [2] float32


class Negotiation(Environment):
    conformance_variants = ({}, {"max_turns": 3, "max_qty": 2, "reward": "margin"})

    def __init__(
        self,
        max_turns: int = 10,
        max_qty: int = 3,
        initial_amount: int = 10,
        reward: str = "sign",
        illegal_action_penalty: float = 1.0,
    ):
        if max_turns < 1 or max_qty < 1 or initial_amount < 0:
            raise ValueError(
                f"need max_turns >= 1, max_qty >= 1, initial_amount >= 0; got {max_turns}, {max_qty}, "
                f"{initial_amount}"
            )
        if reward not in ("sign", "margin"):
            raise ValueError(f"reward must be 'sign' or 'margin', got {reward!r}")
        self.max_turns, self.max_qty, self.initial_amount = max_turns, max_qty, initial_amount
        self.reward_mode = reward
        self.illegal_action_penalty = float(illegal_action_penalty)
        self.num_agents = 2
        self.num_offers = 2 * max_qty * max_qty
        self.num_actions = FIRST_OFFER + self.num_offers
        self.obs_shape = (12,)
        self.max_episode_steps = max_turns
        o = np.arange(self.num_offers)
        #: per offer: resource given by the proposer, amount given, amount received
        self.offer_give_res = o // (max_qty * max_qty)
        self.offer_give = (o // max_qty) % max_qty + 1
        self.offer_recv = o % max_qty + 1

    def offer_action(self, give_res: int, give: int, recv: int) -> int:
        """Action id of "give ``give`` of ``give_res``, receive ``recv`` of the other"."""
        if give_res not in (0, 1) or not (1 <= give <= self.max_qty and 1 <= recv <= self.max_qty):
            raise ValueError(f"no such offer: give_res={give_res} give={give} recv={recv}")
        return FIRST_OFFER + give_res * self.max_qty**2 + (give - 1) * self.max_qty + (recv - 1)

    def trade_delta(self, offer: jax.Array) -> jax.Array:
        """``[2 resources]`` int32 change of the *proposer's* inventory if ``offer`` is accepted."""
        r = jnp.asarray(self.offer_give_res)[offer]
        g, w = jnp.asarray(self.offer_give)[offer], jnp.asarray(self.offer_recv)[offer]
        return jnp.where(jnp.arange(2) == r, -g, w)

    def value_change(self, s: NegotiationState) -> jax.Array:
        """``[2]`` float32 gains ``D_i`` of each player so far."""
        return ((s.inventory - self.initial_amount) * s.values).sum(-1).astype(jnp.float32)

    def offer_mask(self, s: NegotiationState) -> jax.Array:
        """``[num_offers]`` bool: offers the current player could make."""
        me = jnp.arange(2) == s.current_player
        mine = jnp.where(me[:, None], s.inventory, 0).sum(0)  # [2]
        theirs = jnp.where(me[:, None], 0, s.inventory).sum(0)
        r = self.offer_give_res
        return (jnp.where(r == 0, mine[0], mine[1]) >= self.offer_give) & (
            jnp.where(r == 0, theirs[1], theirs[0]) >= self.offer_recv
        )

    def legal_mask(self, s: NegotiationState) -> jax.Array:
        """``[num_actions]`` bool for the current player (all False once finished)."""
        head = jnp.stack([s.pending >= 0, jnp.bool_(True)])
        return jnp.concatenate([head, self.offer_mask(s)]) & ~s.terminated

    def timestep(self, s: NegotiationState) -> TimeStep:
        seats = jnp.arange(2)
        scale = 1.0 / max(2 * self.initial_amount, 1)
        delta = self.trade_delta(jnp.maximum(s.pending, 0)).astype(jnp.float32)  # proposer's view
        has = s.pending >= 0
        own_offer = (seats == s.proposer) & has  # [2]
        my_delta = jnp.where(own_offer[:, None], delta, -delta) * has / self.max_qty  # [2, 2]
        obs = jnp.concatenate(
            [
                s.values / 6.0,
                s.inventory * scale,
                s.inventory[::-1] * scale,
                jnp.broadcast_to(has, (2,))[:, None],
                my_delta,
                jnp.broadcast_to(s.turn / self.max_turns, (2,))[:, None],
                own_offer[:, None],
                seats[:, None],
            ],
            axis=1,
        ).astype(jnp.float32)
        return TimeStep(
            obs=obs,
            reward=s.reward,
            terminated=s.terminated,
            truncated=jnp.bool_(False),
            legal_action_mask=(seats == s.current_player)[:, None] & self.legal_mask(s)[None, :],
            current_player=s.current_player,
            info={"value_change": self.value_change(s)},
        )

    def init_state(self, values) -> NegotiationState:
        return NegotiationState(
            inventory=jnp.full((2, 2), self.initial_amount, jnp.int32),
            values=jnp.asarray(values, jnp.int32),
            pending=jnp.int32(-1),
            proposer=jnp.int32(0),
            turn=jnp.int32(0),
            current_player=jnp.int32(0),
            terminated=jnp.bool_(False),
            reward=jnp.zeros(2, jnp.float32),
        )

    def reset(self, key):
        k_pref, k_hi, k_lo = jax.random.split(key, 3)
        pref0 = jax.random.bernoulli(k_pref).astype(jnp.int32)  # resource player 0 prefers
        hi = jax.random.randint(k_hi, (2,), HIGH_VALUES[0], HIGH_VALUES[-1] + 1)
        lo = jax.random.randint(k_lo, (2,), LOW_VALUES[0], LOW_VALUES[-1] + 1)
        prefers = jnp.stack([pref0, 1 - pref0])  # [2 players]
        values = jnp.where(jnp.arange(2)[None, :] == prefers[:, None], hi[:, None], lo[:, None])
        s = self.init_state(values)
        return s, self.timestep(s)

    def step(self, key, state: NegotiationState, action):
        del key
        s = state
        a = jnp.asarray(action, jnp.int32)
        mask = self.legal_mask(s)
        legal = (a >= 0) & (a < self.num_actions) & mask[jnp.clip(a, 0, self.num_actions - 1)]
        accept = legal & (a == ACCEPT)
        offer = legal & (a >= FIRST_OFFER)
        # accepting moves the pending trade: proposer += delta, responder -= delta
        delta = self.trade_delta(jnp.maximum(s.pending, 0))
        sign = jnp.where(jnp.arange(2) == s.proposer, 1, -1)[:, None]
        inventory = s.inventory + jnp.where(accept, sign * delta[None, :], 0)
        turn = s.turn + 1
        done = ~legal | (turn >= self.max_turns)
        gains = ((inventory - self.initial_amount) * s.values).sum(-1).astype(jnp.float32)
        diff = gains[0] - gains[1]
        if self.reward_mode == "sign":
            r0 = jnp.sign(diff)
        else:
            r0 = jnp.clip(diff / max(6.0 * self.initial_amount, 1.0), -1.0, 1.0)
        me = jnp.arange(2) == s.current_player
        reward = jnp.where(
            legal, jnp.where(done, jnp.stack([r0, -r0]), 0.0), jnp.where(me, -self.illegal_action_penalty, 0.0)
        )
        live = ~s.terminated
        new = NegotiationState(
            inventory=jnp.where(live, inventory, s.inventory),
            values=s.values,
            pending=jnp.where(live, jnp.where(offer, a - FIRST_OFFER, -1), s.pending),
            proposer=jnp.where(live & offer, s.current_player, s.proposer),
            turn=jnp.where(live, turn, s.turn),
            current_player=jnp.where(live & ~done, 1 - s.current_player, s.current_player),
            terminated=s.terminated | done,
            reward=jnp.where(live, reward, 0.0).astype(jnp.float32),
        )
        return new, self.timestep(new)
