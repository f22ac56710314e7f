"""Pure Hanabi game logic (full Hanabi Learning Environment rules), pgx style.

Cards are small integers ``card = colour * num_ranks + rank`` (``-1`` = empty
slot); every array is small and dense, every update a one-hot select (no
scatter, no sort, no per-step permutation), so the step vectorises well under
``vmap``.

Rules (HLE): hand size 5 for 2-3 players and 4 for 4-5; 8 information tokens,
3 lives; a hint must touch at least one card and costs a token; a discard
gains a token and is illegal at 8 tokens; completing a colour (playing its 5)
returns a token when below 8; a misplay loses a life and the card goes to the
discard pile; losing the last life ends the game with score 0; after the
deck runs out every player, including the one who drew the last card, gets
exactly one more turn. The new card goes to the last hand slot (slots shift
left), as in HLE and JaxMARL.

Action layout (JaxMARL-compatible, ``A = 2H + (N-1)(C+R) + 1``; 21 for 2
players): ``[0, H)`` discard slot, ``[H, 2H)`` play slot, then colour hints
ordered by relative target ``o = 0..N-2`` (player ``cur+1+o``) and colour,
then rank hints likewise, then a no-op. The no-op is kept so that the layout
(and policies trained on JaxMARL's Hanabi) carry over and so that every agent
always has a legal action: it is the only legal action of the players who are
not to move, and illegal for the player to move.

Dealing. ``state.deck`` always holds all D cards, those drawn so far first
(in draw order). ``init_from_deck`` plays a given deck order (records, golden
games, differential tests). ``init_random`` shuffles lazily: each draw swaps a
uniformly chosen undrawn card into the next position (one step of a
Fisher-Yates shuffle), which yields exactly the distribution of a uniformly
shuffled deck but costs a few passes over D elements per draw instead of a
full shuffle at every (auto-)reset. A finished game's ``deck`` can be recorded
as is.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_reason.utils.validation import check_hyperparameters

COLOURS = "RYGWB"


@dataclasses.dataclass(frozen=True)
class GameConfig:
    """Static game parameters (hashable)."""

    num_players: int = 2
    num_colours: int = 5
    num_ranks: int = 5
    hand_size: int | None = None  # None: 5 for 2-3 players, 4 for 4-5
    max_info_tokens: int = 8
    max_life_tokens: int = 3
    copies: tuple[int, ...] = (3, 2, 2, 2, 1)

    def __post_init__(self):
        check_hyperparameters(self)
        if not 2 <= self.num_players <= 5:
            raise ValueError(f"Hanabi needs 2 to 5 players, got num_players={self.num_players}")
        if not 1 <= self.num_colours <= 5:
            raise ValueError(f"num_colours must be in 1..5, got {self.num_colours}")
        if len(self.copies) != self.num_ranks or min(self.copies) < 1:
            raise ValueError(f"copies needs num_ranks={self.num_ranks} positive entries, got {self.copies}")
        if self.hand_size is None:
            object.__setattr__(self, "hand_size", 5 if self.num_players <= 3 else 4)
        if self.hand_size < 1:
            raise ValueError(f"hand_size must be >= 1, got {self.hand_size}")
        if self.deck_size < self.num_players * self.hand_size:
            raise ValueError("the deck is too small to deal every hand")
        if self.max_info_tokens < 1 or self.max_life_tokens < 1:
            raise ValueError("max_info_tokens and max_life_tokens must be >= 1")

    # -- derived sizes -----------------------------------------------------
    @property
    def num_cards(self) -> int:  # distinct card kinds
        return self.num_colours * self.num_ranks

    @property
    def deck_size(self) -> int:
        return self.num_colours * sum(self.copies)

    @property
    def max_score(self) -> int:
        return self.num_colours * self.num_ranks

    @property
    def num_actions(self) -> int:
        return 2 * self.hand_size + (self.num_players - 1) * (self.num_colours + self.num_ranks) + 1

    @property
    def colour_hint_start(self) -> int:
        return 2 * self.hand_size

    @property
    def rank_hint_start(self) -> int:
        return 2 * self.hand_size + (self.num_players - 1) * self.num_colours

    @property
    def noop(self) -> int:
        return self.num_actions - 1

    @property
    def max_turns(self) -> int:
        """Upper bound on the game length: draws + hints (bounded by tokens) + final round."""
        draws = self.deck_size - self.num_players * self.hand_size
        return draws + (self.max_info_tokens + draws + self.num_colours) + self.num_players

    def card_counts(self) -> np.ndarray:
        """``[C*R]`` copies of each card kind in a full deck."""
        return np.tile(np.asarray(self.copies, np.int32), self.num_colours)

    def sorted_deck(self) -> np.ndarray:
        """``[D]`` every card of the deck in colour-major, rank order."""
        return np.repeat(np.arange(self.num_cards, dtype=np.int32), self.card_counts())

    def rotate(self, x: jax.Array) -> jax.Array:
        """``[N, ...] -> [N, N, ...]`` with ``out[i, j] = x[(i + j) % N]`` (static slices, no gather)."""
        n = self.num_players
        return jnp.stack([jnp.concatenate([x[i:], x[:i]], axis=0) for i in range(n)])

    def rel_players(self) -> np.ndarray:
        """``[N, N]`` static table: ``rel[i, j] = (i + j) % N`` (player j seats after i)."""
        n = self.num_players
        return (np.arange(n)[:, None] + np.arange(n)[None, :]) % n


@struct.dataclass
class GameState:
    """One Hanabi game. Shapes: N players, H slots, C colours, R ranks, D deck, K = C*R.

    deck: ``[D]`` int32 every card, the drawn ones first in draw order (random decks: the
      undrawn rest in an arbitrary order, each draw picks uniformly among them).
    fixed_deck: bool, draw from ``deck`` rather than sampling.
    deck_counts: ``[K]`` int32 undrawn copies of each card kind.
    num_dealt: int32 cards drawn so far (next draw index).
    hands: ``[N, H]`` int32 card ids, -1 = empty slot.
    colour_plausible / rank_plausible: ``[N, H, C]`` / ``[N, H, R]`` bool, what hints
      leave possible for each slot (HLE card knowledge; plausible = outer product).
    colour_hinted / rank_hinted: ``[N, H]`` bool, the card's colour / rank was revealed.
    fireworks: ``[C]`` int32 stack heights; discards: ``[K]`` int32 counts.
    info_tokens, life_tokens, cur_player, step, last_round: int32 scalars.
    score: int32 (0 once the last life is lost); terminal: bool.
    last_*: what the observation reports about the previous move (last_action = -1: none).
    """

    deck: jax.Array
    fixed_deck: jax.Array
    deck_counts: jax.Array
    num_dealt: jax.Array
    hands: jax.Array
    colour_plausible: jax.Array
    rank_plausible: jax.Array
    colour_hinted: jax.Array
    rank_hinted: jax.Array
    fireworks: jax.Array
    discards: jax.Array
    info_tokens: jax.Array
    life_tokens: jax.Array
    cur_player: jax.Array
    step: jax.Array
    last_round: jax.Array
    score: jax.Array
    terminal: jax.Array
    last_action: jax.Array
    last_actor: jax.Array
    last_target: jax.Array
    last_card: jax.Array
    last_scored: jax.Array
    last_info_added: jax.Array
    last_reveal: jax.Array


# ---------------------------------------------------------------------------
# dealing
# ---------------------------------------------------------------------------
def _draw_position(cfg: GameConfig, bits: jax.Array, num_dealt, fixed) -> jax.Array:
    """Deck position of the next card: ``num_dealt`` for a fixed deck, else uniform over the
    undrawn positions. ``bits`` is one uint32 random word; ``bits % n`` has a modulo bias
    below ``n / 2**32`` (< 2e-8), far below anything a game can measure, and costs one
    random word instead of ``randint``'s two."""
    left = jnp.maximum(cfg.deck_size - num_dealt, 1).astype(jnp.uint32)
    return num_dealt + jnp.where(fixed, 0, (bits % left).astype(jnp.int32))


def _swap_draw(deck: jax.Array, num_dealt, j) -> tuple[jax.Array, jax.Array]:
    """Swap ``deck[j]`` into position ``num_dealt``; returns ``(card, deck)`` (one-hot selects)."""
    pos = jnp.arange(deck.shape[-1])
    at_j, at_n = pos == j, pos == num_dealt
    card = jnp.sum(jnp.where(at_j, deck, 0))
    displaced = jnp.sum(jnp.where(at_n, deck, 0))
    return card, jnp.where(at_n, card, jnp.where(at_j, displaced, deck))


def _initial_state(cfg: GameConfig, deck: jax.Array, fixed: bool, hands_flat: jax.Array) -> GameState:
    n, h, c, r = cfg.num_players, cfg.hand_size, cfg.num_colours, cfg.num_ranks
    dealt = n * h
    onehot = hands_flat[:, None] == jnp.arange(cfg.num_cards)
    counts = jnp.asarray(cfg.card_counts()) - onehot.sum(0).astype(jnp.int32)
    return GameState(
        deck=deck.astype(jnp.int32),
        fixed_deck=jnp.bool_(fixed),
        deck_counts=counts,
        num_dealt=jnp.int32(dealt),
        hands=hands_flat.reshape(n, h).astype(jnp.int32),
        colour_plausible=jnp.ones((n, h, c), bool),
        rank_plausible=jnp.ones((n, h, r), bool),
        colour_hinted=jnp.zeros((n, h), bool),
        rank_hinted=jnp.zeros((n, h), bool),
        fireworks=jnp.zeros((c,), jnp.int32),
        discards=jnp.zeros((cfg.num_cards,), jnp.int32),
        info_tokens=jnp.int32(cfg.max_info_tokens),
        life_tokens=jnp.int32(cfg.max_life_tokens),
        cur_player=jnp.int32(0),
        step=jnp.int32(0),
        last_round=jnp.int32(0),
        score=jnp.int32(0),
        terminal=jnp.bool_(False),
        last_action=jnp.int32(-1),
        last_actor=jnp.int32(0),
        last_target=jnp.int32(0),
        last_card=jnp.int32(-1),
        last_scored=jnp.bool_(False),
        last_info_added=jnp.bool_(False),
        last_reveal=jnp.zeros((h,), bool),
    )


def init_from_deck(cfg: GameConfig, deck: jax.Array) -> GameState:
    """Start a game that deals ``deck`` (``[D]`` card ids, top card first) in order."""
    deck = jnp.asarray(deck, jnp.int32)
    if deck.shape != (cfg.deck_size,):
        raise ValueError(f"deck must have shape ({cfg.deck_size},), got {deck.shape}")
    return _initial_state(cfg, deck, True, deck[: cfg.num_players * cfg.hand_size])


def init_random(cfg: GameConfig, key: jax.Array) -> GameState:
    """Start a game with a uniformly random deck: the hands are dealt by the first steps of a
    Fisher-Yates shuffle of the sorted deck, the rest is shuffled lazily as it is drawn."""
    m = cfg.num_players * cfg.hand_size
    deck = jnp.asarray(cfg.sorted_deck())
    bits = jax.random.bits(key, (m,), jnp.uint32)
    cards = []
    for i in range(m):  # static unroll, one random word per card
        card, deck = _swap_draw(deck, i, _draw_position(cfg, bits[i], i, False))
        cards.append(card)
    return _initial_state(cfg, deck, False, jnp.stack(cards))


def complete_deck(cfg: GameConfig, state: GameState) -> np.ndarray:
    """The full deck order of a game (host-side, one game): drawn cards in draw order, then the
    undrawn rest (any order of unseen cards is equally likely)."""
    return np.asarray(state.deck, np.int32).copy()


# ---------------------------------------------------------------------------
# actions
# ---------------------------------------------------------------------------
def decode_action(cfg: GameConfig, player, action):
    """Decode ``action`` taken by ``player``.

    Returns ``(kind, slot, target, value)``: kind 0 discard, 1 play, 2 colour
    hint, 3 rank hint, 4 no-op; ``slot`` for play/discard; ``target`` absolute
    player and ``value`` colour/rank for hints.
    """
    h, n = cfg.hand_size, cfg.num_players
    cs, rs = cfg.colour_hint_start, cfg.rank_hint_start
    a = jnp.asarray(action, jnp.int32)
    kind = jnp.select(
        [a < h, a < 2 * h, a < rs, a < cfg.noop], [0, 1, 2, 3], 4
    ).astype(jnp.int32)
    ci, ri = a - cs, a - rs
    offset = jnp.where(kind == 2, ci // cfg.num_colours, ri // cfg.num_ranks)
    value = jnp.where(kind == 2, ci % cfg.num_colours, ri % cfg.num_ranks)
    target = (player + 1 + offset) % n
    return kind, a % h, target.astype(jnp.int32), value.astype(jnp.int32)


def encode_action(cfg: GameConfig, kind: str, player: int, *, slot: int = 0, target: int = 0, value: int = 0) -> int:
    """Host-side inverse of ``decode_action``; kind in {discard, play, colour, rank, noop}."""
    h, n = cfg.hand_size, cfg.num_players
    offset = (target - player - 1) % n
    if kind == "discard":
        return slot
    if kind == "play":
        return h + slot
    if kind == "colour":
        return cfg.colour_hint_start + offset * cfg.num_colours + value
    if kind == "rank":
        return cfg.rank_hint_start + offset * cfg.num_ranks + value
    if kind == "noop":
        return cfg.noop
    raise ValueError(f"unknown action kind {kind!r}")


def legal_moves(cfg: GameConfig, state: GameState) -> jax.Array:
    """``[N, A]`` bool: the player to move gets the rule-legal moves, the others only the no-op."""
    n = cfg.num_players
    hands = state.hands
    has = hands >= 0  # [N, H]
    discard = has & (state.info_tokens < cfg.max_info_tokens)
    colours = jnp.where(has, hands // cfg.num_ranks, -1)
    ranks = jnp.where(has, hands % cfg.num_ranks, -1)
    col_present = (colours[:, :, None] == jnp.arange(cfg.num_colours)).any(1)  # [N, C]
    rank_present = (ranks[:, :, None] == jnp.arange(cfg.num_ranks)).any(1)  # [N, R]
    can_hint = state.info_tokens > 0
    col_hints = (cfg.rotate(col_present)[:, 1:] & can_hint).reshape(n, -1)
    rank_hints = (cfg.rotate(rank_present)[:, 1:] & can_hint).reshape(n, -1)
    mover = jnp.concatenate(
        [discard, has, col_hints, rank_hints, jnp.zeros((n, 1), bool)], axis=1
    )
    noop_only = jnp.arange(cfg.num_actions) == cfg.noop
    is_cur = (jnp.arange(n) == state.cur_player)[:, None]
    return jnp.where(is_cur, mover, noop_only[None, :])


def is_legal(cfg: GameConfig, state: GameState, action: jax.Array) -> jax.Array:
    """bool scalar: ``action`` is legal for the player to move (the no-op never is).

    Equals ``legal_moves(cfg, state)[state.cur_player, action]`` without building the mask.
    """
    n, r = cfg.num_players, cfg.num_ranks
    a = jnp.asarray(action, jnp.int32)
    kind, slot, target, value = decode_action(cfg, state.cur_player, a)
    mine = jnp.sum(jnp.where((jnp.arange(n) == state.cur_player)[:, None], state.hands, 0), 0)
    theirs = jnp.sum(jnp.where((jnp.arange(n) == target)[:, None], state.hands, 0), 0)
    has_slot = jnp.any((jnp.arange(cfg.hand_size) == slot) & (mine >= 0))
    match = jnp.where(kind == 2, theirs // r, theirs % r) == value
    touches = jnp.any(match & (theirs >= 0))
    ok = jnp.select(
        [kind == 0, kind == 1, kind < 4],
        [has_slot & (state.info_tokens < cfg.max_info_tokens), has_slot, touches & (state.info_tokens > 0)],
        False,
    )
    return ok & (a >= 0) & (a < cfg.num_actions)


# ---------------------------------------------------------------------------
# transition
# ---------------------------------------------------------------------------
def _remove_slot(x: jax.Array, slot: jax.Array, fill: jax.Array) -> jax.Array:
    """Drop ``x[:, slot]`` along axis 1 (the hand axis), shift left, put ``fill`` last."""
    shifted = jnp.concatenate([x[:, 1:], fill[:, None]], axis=1)
    keep = (jnp.arange(x.shape[1]) < slot).reshape((1, -1) + (1,) * (x.ndim - 2))
    return jnp.where(keep, x, shifted)


def step(cfg: GameConfig, state: GameState, action: jax.Array, key: jax.Array) -> tuple[GameState, jax.Array]:
    """Apply the current player's (legal) ``action``. Returns ``(state, reward)``.

    ``reward`` (int32) is the change of score: the fireworks gained, or minus
    the score when the last life is lost. ``key`` is used only to draw from a
    random (lazily dealt) deck.
    """
    n, h, c, r, k = cfg.num_players, cfg.hand_size, cfg.num_colours, cfg.num_ranks, cfg.num_cards
    p = state.cur_player
    kind, slot, target, value = decode_action(cfg, p, action)
    is_discard, is_play = kind == 0, kind == 1
    is_col, is_rank = kind == 2, kind == 3
    is_hint = is_col | is_rank
    moves_card = is_discard | is_play

    player_row = jnp.arange(n) == p  # [N]
    slot_col = jnp.arange(h) == slot  # [H]
    card = jnp.sum(jnp.where(player_row[:, None] & slot_col[None, :], state.hands, 0))
    card = jnp.where(moves_card, card, -1)
    colour, rank = card // r, card % r
    colour_1h = jnp.arange(c) == colour
    height = jnp.sum(jnp.where(colour_1h, state.fireworks, 0))
    good_play = is_play & (rank == height) & (card >= 0)
    bad_play = is_play & ~good_play
    fireworks = state.fireworks + (colour_1h & good_play)
    card_1h = jnp.arange(k) == card
    discards = state.discards + (card_1h & (is_discard | bad_play))
    life_tokens = state.life_tokens - bad_play
    info = state.info_tokens + is_discard - is_hint
    info = jnp.minimum(info, cfg.max_info_tokens)
    completes = good_play & (rank == r - 1) & (info < cfg.max_info_tokens)
    info = info + completes

    # draw a replacement card
    can_draw = moves_card & (state.num_dealt < cfg.deck_size)
    j = _draw_position(cfg, jax.random.bits(key, (), jnp.uint32), state.num_dealt, state.fixed_deck)
    drawn, swapped = _swap_draw(state.deck, state.num_dealt, j)
    new_card = jnp.where(can_draw, drawn, -1)
    deck = jnp.where(can_draw, swapped, state.deck)
    deck_counts = state.deck_counts - ((jnp.arange(k) == new_card) & can_draw)
    num_dealt = state.num_dealt + can_draw

    # hand and knowledge of the player who played / discarded
    fill_h = jnp.full((n,), new_card)
    has_new = jnp.broadcast_to(new_card >= 0, (n,))
    row = player_row[:, None] & moves_card
    hands = jnp.where(row, _remove_slot(state.hands, slot, fill_h), state.hands)
    cpl = jnp.where(row[..., None], _remove_slot(state.colour_plausible, slot, jnp.broadcast_to(has_new[:, None], (n, c))), state.colour_plausible)
    rpl = jnp.where(row[..., None], _remove_slot(state.rank_plausible, slot, jnp.broadcast_to(has_new[:, None], (n, r))), state.rank_plausible)
    no = jnp.zeros((n,), bool)
    chd = jnp.where(row, _remove_slot(state.colour_hinted, slot, no), state.colour_hinted)
    rhd = jnp.where(row, _remove_slot(state.rank_hinted, slot, no), state.rank_hinted)

    # hints: positive and negative information for the target's hand
    tgt = (jnp.arange(n) == target)[:, None] & is_hint  # [N, 1]
    hand_has = state.hands >= 0
    hand_col = jnp.where(hand_has, state.hands // r, -1)
    hand_rank = jnp.where(hand_has, state.hands % r, -1)
    touched = jnp.where(is_col, hand_col == value, hand_rank == value) & tgt  # [N, H]
    untouched = tgt & ~touched
    val_c = jnp.arange(c) == value
    val_r = jnp.arange(r) == value
    cpl = jnp.where((touched & is_col)[..., None], val_c, cpl)
    cpl = jnp.where((untouched & is_col)[..., None], cpl & ~val_c, cpl)
    rpl = jnp.where((touched & is_rank)[..., None], val_r, rpl)
    rpl = jnp.where((untouched & is_rank)[..., None], rpl & ~val_r, rpl)
    chd = chd | (touched & is_col)
    rhd = rhd | (touched & is_rank)
    reveal = jnp.any(touched, axis=0)  # [H] (only the target row can be touched)

    # end of game and score
    total = fireworks.sum()
    out_of_lives = life_tokens <= 0
    last_round = state.last_round + (num_dealt >= cfg.deck_size)
    terminal = out_of_lives | (total == cfg.max_score) | (last_round >= n + 1)
    score = jnp.where(out_of_lives, 0, total).astype(jnp.int32)
    reward = score - state.score

    new = GameState(
        deck=deck,
        fixed_deck=state.fixed_deck,
        deck_counts=deck_counts,
        num_dealt=num_dealt.astype(jnp.int32),
        hands=hands,
        colour_plausible=cpl,
        rank_plausible=rpl,
        colour_hinted=chd,
        rank_hinted=rhd,
        fireworks=fireworks.astype(jnp.int32),
        discards=discards.astype(jnp.int32),
        info_tokens=info.astype(jnp.int32),
        life_tokens=life_tokens.astype(jnp.int32),
        cur_player=((p + 1) % n).astype(jnp.int32),
        step=state.step + 1,
        last_round=last_round.astype(jnp.int32),
        score=score,
        terminal=terminal,
        last_action=jnp.asarray(action, jnp.int32),
        last_actor=p,
        last_target=target,
        last_card=card.astype(jnp.int32),
        last_scored=good_play,
        last_info_added=completes,
        last_reveal=reveal,
    )
    return new, reward


# ---------------------------------------------------------------------------
# host-side helpers
# ---------------------------------------------------------------------------
def card_str(cfg: GameConfig, card: int) -> str:
    if card < 0:
        return "--"
    return f"{COLOURS[card // cfg.num_ranks]}{card % cfg.num_ranks + 1}"


def action_str(cfg: GameConfig, player: int, action: int) -> str:
    kind, slot, target, value = (int(x) for x in decode_action(cfg, player, action))
    if kind == 0:
        return f"discard slot {slot}"
    if kind == 1:
        return f"play slot {slot}"
    if kind == 2:
        return f"hint P{target} colour {COLOURS[value]}"
    if kind == 3:
        return f"hint P{target} rank {value + 1}"
    return "no-op"


def render(cfg: GameConfig, state: GameState) -> str:
    """A short text picture of one game state."""
    lines = [
        f"turn {int(state.step)}  player {int(state.cur_player)} to move  score {int(state.score)}  "
        f"info {int(state.info_tokens)}  lives {int(state.life_tokens)}  deck {cfg.deck_size - int(state.num_dealt)}",
        "fireworks " + " ".join(f"{COLOURS[i]}{int(v)}" for i, v in enumerate(np.asarray(state.fireworks))),
    ]
    for p in range(cfg.num_players):
        lines.append(f"P{p}: " + " ".join(card_str(cfg, int(x)) for x in np.asarray(state.hands[p])))
    return "\n".join(lines)
