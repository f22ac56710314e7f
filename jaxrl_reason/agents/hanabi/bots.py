"""Rule-based Hanabi convention bots as pure, jittable policies.

In the spirit of the classic heuristic agents (HLE's SimpleAgent, "Piers"-style
rule lists), each bot looks only at what its seat may know: its own card
knowledge (hints), the other hands, fireworks, discards and tokens. A bot is a
``BotParams`` (static, hashable) and ``bot_action(cfg, params, state) -> int32``.

Rules, in order:
1. play a card known to be playable (every plausible identity is playable);
2. ``play_hinted``: play a rank-hinted card if at least half of its plausible
   identities are playable (a risky "hinted card is a play clue" convention);
3. with an info token: hint the first other player (seat order) holding a
   playable card it does not know yet -- rank first or colour first;
4. discard a card known to be dead, else the oldest unhinted card (slot 0 side);
5. at 8 tokens: the first legal hint; otherwise the first legal move.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxrl_reason.envs.hanabi.game import GameConfig, GameState, legal_moves
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class BotParams:
    name: str = "cautious"
    play_hinted: bool = False
    hint_first: str = "rank"  # "rank" or "colour"

    def __post_init__(self):
        check_hyperparameters(self)
        if self.hint_first not in ("rank", "colour"):
            raise ValueError(f"hint_first must be 'rank' or 'colour', got {self.hint_first!r}")


#: The bots used by the AH2AC2 study: two make the "human" records, one is held out.
BOTS = {
    "cautious": BotParams("cautious", play_hinted=False, hint_first="rank"),
    "discard_oldest": BotParams("discard_oldest", play_hinted=True, hint_first="rank"),
    "colour_cautious": BotParams("colour_cautious", play_hinted=False, hint_first="colour"),
}


def _first(mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(any, index of the first True) of a flat bool array."""
    return mask.any(), jnp.argmax(mask).astype(jnp.int32)


def bot_action(cfg: GameConfig, params: BotParams, state: GameState) -> jax.Array:
    """The move of ``state.cur_player`` (int32); legal whenever the game is not over."""
    n, h, c, r = cfg.num_players, cfg.hand_size, cfg.num_colours, cfg.num_ranks
    p = state.cur_player
    mine = jnp.arange(n) == p
    pick = lambda x: jnp.sum(jnp.where(mine.reshape((n,) + (1,) * (x.ndim - 1)), x, 0), axis=0).astype(x.dtype)
    hand = pick(state.hands)
    has = hand >= 0
    cpl = pick(state.colour_plausible.astype(jnp.int32)) > 0  # [H, C]
    rpl = pick(state.rank_plausible.astype(jnp.int32)) > 0  # [H, R]
    rhd = pick(state.rank_hinted.astype(jnp.int32)) > 0
    chd = pick(state.colour_hinted.astype(jnp.int32)) > 0
    plaus = cpl[:, :, None] & rpl[:, None, :]  # [H, C, R]
    playable = state.fireworks[:, None] == jnp.arange(r)[None, :]  # [C, R]
    dead = state.fireworks[:, None] > jnp.arange(r)[None, :]
    known_play = has & ~jnp.any(plaus & ~playable, axis=(1, 2))
    n_play = jnp.sum(plaus & playable, axis=(1, 2))
    maybe_play = has & rhd & (2 * n_play >= jnp.sum(plaus, axis=(1, 2))) & (n_play > 0)
    known_dead = has & ~jnp.any(plaus & ~dead, axis=(1, 2))
    legal = jnp.sum(jnp.where(mine[:, None], legal_moves(cfg, state), False), axis=0) > 0

    can_play, play_slot = _first(known_play)
    can_play2, play_slot2 = _first(maybe_play)
    can_play2 = can_play2 & params.play_hinted

    # hints: playable cards of others, in seat order, that their holder does not know yet
    rel = cfg.rotate(jnp.arange(n))[:, 1:]  # [N, N-1] static-shaped
    others = jnp.sum(jnp.where(mine[:, None], rel, 0), axis=0)  # [N-1] absolute seats after p
    oh = state.hands[others]  # [N-1, H]
    o_has = oh >= 0
    o_col, o_rank = jnp.where(o_has, oh // r, 0), jnp.where(o_has, oh % r, 0)
    o_playable = o_has & (state.fireworks[o_col] == o_rank)
    o_rhd, o_chd = state.rank_hinted[others], state.colour_hinted[others]
    if params.hint_first == "rank":
        first_hd, second_hd = o_rhd, o_chd
    else:
        first_hd, second_hd = o_chd, o_rhd
    needs = o_playable & ~(first_hd & (second_hd | params.play_hinted))
    can_hint, flat = _first(needs.reshape(-1))
    off, slot = flat // h, flat % h
    col_v = jnp.sum(jnp.where(jnp.arange(n - 1)[:, None] == off, o_col, 0) * (jnp.arange(h) == slot))
    rank_v = jnp.sum(jnp.where(jnp.arange(n - 1)[:, None] == off, o_rank, 0) * (jnp.arange(h) == slot))
    first_known = jnp.sum(jnp.where(jnp.arange(n - 1)[:, None] == off, first_hd, False) & (jnp.arange(h) == slot)) > 0
    rank_action = cfg.rank_hint_start + off * r + rank_v
    col_action = cfg.colour_hint_start + off * c + col_v
    if params.hint_first == "rank":
        hint_action = jnp.where(first_known, col_action, rank_action)
    else:
        hint_action = jnp.where(first_known, rank_action, col_action)
    can_hint = can_hint & (state.info_tokens > 0)

    can_discard = state.info_tokens < cfg.max_info_tokens
    any_dead, dead_slot = _first(known_dead)
    any_old, old_slot = _first(has & ~rhd & ~chd)
    discard_slot = jnp.where(any_dead, dead_slot, jnp.where(any_old, old_slot, 0))
    hints_legal = legal & (jnp.arange(cfg.num_actions) >= cfg.colour_hint_start) & (jnp.arange(cfg.num_actions) < cfg.noop)
    any_legal_hint, legal_hint = _first(hints_legal)
    _, any_move = _first(legal)

    action = jnp.select(
        [can_play, can_play2, can_hint, can_discard, any_legal_hint],
        [h + play_slot, h + play_slot2, hint_action, discard_slot, legal_hint],
        any_move,
    )
    return jnp.where(legal[action], action, any_move).astype(jnp.int32)
