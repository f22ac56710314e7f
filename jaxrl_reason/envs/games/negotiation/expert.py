"""Negotiation's fixed heuristic player (the warm-start expert and the ``heuristic`` opponent).

``heuristic_action(env)`` accepts any offer that raises its own inventory value and otherwise proposes a
random offer that would (else denies); ``offer_gains`` is the value each offer would add to the mover's
inventory (its private values only).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_reason.envs.games.negotiation.rules import (
    ACCEPT,
    DENY,
    FIRST_OFFER,
    Negotiation,
)
from jaxrl_reason.envs.games.opponents import current_mask, uniform_choice


def offer_gains(env: Negotiation, state) -> jax.Array:
    """``[num_offers]`` change of the *current player's* own value if it makes each offer and it
    is accepted (uses only that player's private values)."""
    me = jnp.arange(2) == state.current_player
    v = jnp.where(me[:, None], state.values, 0).sum(0)  # [2]
    r, g, w = (jnp.asarray(x) for x in (env.offer_give_res, env.offer_give, env.offer_recv))
    return jnp.where(r == 0, v[1] * w - v[0] * g, v[0] * w - v[1] * g)


def heuristic_action(env: Negotiation):
    """A fixed heuristic player for ``env`` as ``fn(key, state, ts) -> action``."""

    def act(key, state, ts):
        gains = offer_gains(env, state)
        # the pending offer was made by the opponent: my gain is minus its proposer-side value
        me = jnp.arange(2) == state.current_player
        v = jnp.where(me[:, None], state.values, 0).sum(0)
        delta = -env.trade_delta(jnp.maximum(state.pending, 0))  # my inventory change
        accept_gain = (v * delta).sum()
        mask = current_mask(ts)
        good = mask[FIRST_OFFER:] & (gains > 0)
        offer = FIRST_OFFER + uniform_choice(key, good)
        fallback = jnp.where(good.any(), offer, DENY)
        return jnp.where(mask[ACCEPT] & (accept_gain > 0), ACCEPT, fallback).astype(jnp.int32)

    return act
