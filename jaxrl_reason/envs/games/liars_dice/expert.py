"""A Liar's Dice heuristic player (the warm-start expert): probabilities from the own dice only.

``bid_probs(env, state)``: ``[num_bids]`` probability, given the mover's dice and the opponent's dice
uniform, that each bid is true. ``heuristic_action(env)``: call ``liar`` when the standing bid is
true with probability < 1/2 (or no raise is left); else raise to the most probable legal bid (the
lowest such id on ties). Deterministic: the key is unused.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def _tail(dice: int, faces: int) -> np.ndarray:
    """``[2 * dice + 1]``: P(at least k of the opponent's ``dice`` show a given face), k = 0..2*dice."""
    p = 1.0 / faces
    pmf = [math.comb(dice, j) * p**j * (1 - p) ** (dice - j) for j in range(dice + 1)]
    return np.asarray([sum(pmf[k:]) for k in range(2 * dice + 1)], np.float32)


def bid_probs(env, state) -> jax.Array:
    """``[num_bids]`` probability that each bid holds, seen by the player to act."""
    mine = jnp.where(state.current_player == 0, state.dice[0], state.dice[1])
    own = env.counts(mine)  # [faces]
    q, f = env.bid_of(jnp.arange(env.num_bids))
    need = jnp.clip(q - own[f], 0, 2 * env.dice)
    return jnp.asarray(_tail(env.dice, env.faces))[need]


def heuristic_action(env):
    """The heuristic as ``act(key, state, ts) -> action`` (one unbatched game)."""

    def act(key, state, ts):
        del key, ts
        probs = bid_probs(env, state)
        legal = env.legal_mask(state)
        doubt = (state.bid >= 0) & (probs[jnp.maximum(state.bid, 0)] < 0.5)
        raises = legal[: env.num_bids]
        best = jnp.argmax(jnp.where(raises, probs, -1.0))
        return jnp.where(doubt | ~raises.any(), env.liar, best).astype(jnp.int32)

    return act
