"""Generic fixed players for any game; each game's own players (its expert) live in its package
(``envs.games.<name>.expert``) and are named by its ``GameSpec.opponents``.

- ``random_action``: uniform over the legal actions of the player to move (any game).
- ``current_mask(ts)``: the legal mask of the player to move; ``uniform_choice(key, mask)``: a uniformly
  random index among the True entries of a mask (ties of an expert's best moves, legal moves).

Opponent functions act on one unbatched ``(key, state, ts)``; ``batched(fn)`` vmaps one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_NEG = -1e9


def current_mask(ts) -> jax.Array:
    """``[num_actions]`` legal mask of the player to move (one unbatched timestep)."""
    return jnp.where((jnp.arange(ts.legal_action_mask.shape[0]) == ts.current_player)[:, None],
                     ts.legal_action_mask, False).any(0)


def uniform_choice(key, mask: jax.Array) -> jax.Array:
    """int32 index drawn uniformly among the True entries of ``mask`` ``[n]``."""
    return jax.random.categorical(key, jnp.where(mask, 0.0, _NEG)).astype(jnp.int32)


def random_action(key, state, ts) -> jax.Array:
    """Uniformly random legal action of the player to move."""
    del state
    return uniform_choice(key, current_mask(ts))


def batched(fn):
    """``fn(key, state, ts)`` on one game -> the same on a batch (one key for the batch)."""

    def run(key, state, ts):
        keys = jax.random.split(key, ts.current_player.shape[0])
        return jax.vmap(fn)(keys, state, ts)

    return run
