"""Colour-permutation symmetry of Hanabi (data augmentation, other-play).

``perm`` is a ``[C]`` int array: colour ``c`` becomes ``perm[c]``. Permuting a
state, then stepping with the permuted action, equals stepping then permuting
(tested). Observations of a permuted state are ``encode(permute_state(...))``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_reason.envs.hanabi.game import GameConfig, GameState


def random_permutation(cfg: GameConfig, key: jax.Array) -> jax.Array:
    return jax.random.permutation(key, cfg.num_colours).astype(jnp.int32)


def permute_cards(cfg: GameConfig, cards: jax.Array, perm: jax.Array) -> jax.Array:
    """Card ids (any shape, -1 kept) with colours mapped through ``perm``."""
    r = cfg.num_ranks
    mapped = perm[jnp.clip(cards // r, 0, cfg.num_colours - 1)] * r + cards % r
    return jnp.where(cards >= 0, mapped, cards).astype(jnp.int32)


def _permute_kind_axis(cfg: GameConfig, x: jax.Array, perm: jax.Array) -> jax.Array:
    """``[..., C*R]`` per-card-kind array -> same with colours moved by ``perm``."""
    c, r = cfg.num_colours, cfg.num_ranks
    inv = jnp.argsort(perm)
    return x.reshape(*x.shape[:-1], c, r)[..., inv, :].reshape(x.shape)


def permute_action(cfg: GameConfig, action: jax.Array, perm: jax.Array) -> jax.Array:
    """Colour hints name the permuted colour; every other action is unchanged."""
    a = jnp.asarray(action, jnp.int32)
    start = cfg.colour_hint_start
    is_col = (a >= start) & (a < cfg.rank_hint_start)
    idx = a - start
    mapped = start + (idx // cfg.num_colours) * cfg.num_colours + perm[idx % cfg.num_colours]
    return jnp.where(is_col, mapped, a).astype(jnp.int32)


def permute_state(cfg: GameConfig, state: GameState, perm: jax.Array) -> GameState:
    inv = jnp.argsort(perm)
    return state.replace(
        deck=permute_cards(cfg, state.deck, perm),
        deck_counts=_permute_kind_axis(cfg, state.deck_counts, perm),
        hands=permute_cards(cfg, state.hands, perm),
        colour_plausible=state.colour_plausible[..., inv],
        fireworks=state.fireworks[inv],
        discards=_permute_kind_axis(cfg, state.discards, perm),
        last_action=jnp.where(state.last_action >= 0, permute_action(cfg, state.last_action, perm), -1),
        last_card=permute_cards(cfg, state.last_card, perm),
    )
