"""Hanabi observation encodings, computed for every observer at once.

``"canonical"``: the Hanabi Learning Environment's canonical encoding (658
features for 2 players), sections in order:

1. hands (``(N-1)*H*K + N``): the other players' cards one-hot (relative seat
   order), then one bit per player (self first) "holds fewer than H cards";
2. board (``D - N*H + K + T + L``): deck size thermometer, fireworks one-hot
   of each colour's top rank, info-token and life thermometers;
3. discards (``C * sum(copies)``): per colour and rank, a thermometer of copies;
4. last action (``2N + 4 + C + R + 2H + K + 2``): acting player (relative),
   move type (play, discard, colour hint, rank hint), hint target (relative),
   colour / rank revealed, cards touched, slot played/discarded, card
   played/discarded, scored, added an info token (all zero on the first turn);
5. card knowledge (``N*H*(K+C+R)``): for each player (self first) and slot,
   the K plausible cards (binary) and the revealed colour and rank.

``"belief"``: as canonical, with the plausible bits replaced by the V0 belief
of JaxMARL / OBL (plausible x remaining copies not discarded nor on the
fireworks, normalised per card). Identical to JaxMARL's observation.

``"compact"``: the same information in fewer features (355 for 2 players):
scalars for deck size, info and lives, discard counts per card kind, and per
slot the C + R plausible colours and ranks plus two "revealed" bits instead
of the K-bit outer product.

Each observer's view is a static rotation of per-player blocks (no argsort,
no per-step permutation).
"""

from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp

from jaxrl_reason.envs.hanabi.game import GameConfig, GameState

OBS_MODES = ("canonical", "belief", "compact")


def section_sizes(cfg: GameConfig, mode: str = "canonical") -> dict[str, int]:
    """Feature count of each section, in order."""
    n, h, c, r, k = cfg.num_players, cfg.hand_size, cfg.num_colours, cfg.num_ranks, cfg.num_cards
    if mode not in OBS_MODES:
        raise ValueError(f"unknown observation mode {mode!r}; choose one of {OBS_MODES}")
    last = 2 * n + 4 + c + r + 2 * h + k + 2
    if mode == "compact":
        return {
            "hands": (n - 1) * h * k + n,
            "board": 3 + k,
            "discards": k,
            "last_action": last,
            "knowledge": n * h * (c + r + 2),
        }
    return {
        "hands": (n - 1) * h * k + n,
        "board": cfg.deck_size - n * h + k + cfg.max_info_tokens + cfg.max_life_tokens,
        "discards": c * sum(cfg.copies),
        "last_action": last,
        "knowledge": n * h * (k + c + r),
    }


def section_slices(cfg: GameConfig, mode: str = "canonical") -> dict[str, slice]:
    out, start = {}, 0
    for name, size in section_sizes(cfg, mode).items():
        out[name] = slice(start, start + size)
        start += size
    return out


def obs_size(cfg: GameConfig, mode: str = "canonical") -> int:
    return sum(section_sizes(cfg, mode).values())


def _discard_index(cfg: GameConfig):
    """Static ``[C*sum(copies)]`` card kind and copy number of each discard bit."""
    kinds, copy = [], []
    for col in range(cfg.num_colours):
        for rank, n_copies in enumerate(cfg.copies):
            kinds += [col * cfg.num_ranks + rank] * n_copies
            copy += list(range(n_copies))
    return np.asarray(kinds, np.int32), np.asarray(copy, np.int32)


def remaining_counts(cfg: GameConfig, state: GameState) -> jax.Array:
    """``[K]`` copies not yet discarded nor on the fireworks (the V0 belief's counts)."""
    played = state.fireworks[:, None] > jnp.arange(cfg.num_ranks)[None, :]
    return jnp.asarray(cfg.card_counts()) - state.discards - played.reshape(-1)


# ---------------------------------------------------------------------------
# canonical / belief: bit-packed words, expanded section by section
# ---------------------------------------------------------------------------
# Every canonical feature is a bit of a small int32 word (one-hot card ids as
# ``1 << card``, the 25 plausible cards of a slot as one mask, the last move's
# fields packed together) or a threshold test ``value > t`` (thermometers).
# ``_words`` packs the state (a few dozen int32); each section is then one
# broadcast shift-and-mask, the per-observer rotation is a static slice, and
# nothing builds one-hots over big tensors or gathers. The result is
# materialised once (optimization barrier) so that consumers (a network, a
# checksum) read it rather than re-fusing the encoder into their own loops.


def _misc_bits(cfg: GameConfig) -> dict[str, int]:
    """Bit offsets inside the packed last-move word."""
    c, r, h = cfg.num_colours, cfg.num_ranks, cfg.hand_size
    return {"move": 0, "colour": 4, "rank": 4 + c, "reveal": 4 + c + r, "slot": 4 + c + r + h,
            "scored": 4 + c + r + 2 * h, "info_added": 5 + c + r + 2 * h}


def _pack(flags: jax.Array, shift=0) -> jax.Array:
    """Pack bool ``flags [..., m]`` into int32 words, flag j at bit ``shift + j``."""
    return jnp.sum(flags.astype(jnp.int32) << (shift + jnp.arange(flags.shape[-1], dtype=jnp.int32)), -1)


def _one_bit(index, valid) -> jax.Array:
    """``1 << index`` where ``valid`` (and ``index >= 0``), else 0 (int32)."""
    valid = valid & (index >= 0)
    return jnp.where(valid, jnp.left_shift(1, jnp.where(valid, index, 0)), 0).astype(jnp.int32)


def _unpack(words: jax.Array, nbits: int, shift: int = 0) -> jax.Array:
    """``[...]`` int32 -> ``[..., nbits]`` bool, bits ``shift .. shift + nbits - 1``."""
    return (words[..., None] >> (shift + jnp.arange(nbits, dtype=jnp.int32))) & 1 > 0


def _words(cfg: GameConfig, state: GameState) -> dict[str, jax.Array]:
    """The state packed into int32 words: per slot ``hand`` / ``plaus`` / ``revealed`` ``[N, H]``,
    per player bits ``missing``, and the last move (``actor``, ``target``, ``misc``, ``card``)."""
    h, c, r = cfg.hand_size, cfg.num_colours, cfg.num_ranks
    mb = _misc_bits(cfg)
    hands = state.hands
    has = hands >= 0
    a = state.last_action
    valid = a >= 0
    is_discard, is_play = a < h, (a >= h) & (a < 2 * h)
    is_col = (a >= cfg.colour_hint_start) & (a < cfg.rank_hint_start)
    is_rank = (a >= cfg.rank_hint_start) & (a < cfg.noop)
    is_hint, moves = is_col | is_rank, is_discard | is_play
    misc = (
        _pack(jnp.stack([is_play, is_discard, is_col, is_rank]), mb["move"])
        | _one_bit(mb["colour"] + (a - cfg.colour_hint_start) % c, is_col)
        | _one_bit(mb["rank"] + (a - cfg.rank_hint_start) % r, is_rank)
        | jnp.where(is_hint, _pack(state.last_reveal, mb["reveal"]), 0)
        | _one_bit(mb["slot"] + a % h, moves)
        | (state.last_scored.astype(jnp.int32) << mb["scored"])
        | (state.last_info_added.astype(jnp.int32) << mb["info_added"])
    )
    rank_mask = _pack(state.rank_plausible)  # [N, H]
    plaus = jnp.sum(jnp.where(state.colour_plausible, rank_mask[..., None] << (r * jnp.arange(c)), 0), -1)
    return {
        "hand": _one_bit(hands, has),
        "missing": _pack(~has.all(axis=1)),
        "plaus": plaus.astype(jnp.int32),
        "revealed": _one_bit(hands // r, state.colour_hinted & has) | _one_bit(c + hands % r, state.rank_hinted & has),
        "actor": _one_bit(state.last_actor, valid),
        "target": _one_bit(state.last_target, valid & is_hint),
        "misc": jnp.where(valid, misc, 0),
        "card": _one_bit(state.last_card, valid & moves),
    }


def _canonical(cfg: GameConfig, state: GameState) -> jax.Array:
    """``[N, F]`` bool canonical observation of every observer."""
    n, h, c, r, k = cfg.num_players, cfg.hand_size, cfg.num_colours, cfg.num_ranks, cfg.num_cards
    w = _words(cfg, state)
    mb = _misc_bits(cfg)
    rel = jnp.asarray(cfg.rel_players())  # observer i, relative seat j -> absolute seat
    fw = state.fireworks
    board = jnp.concatenate([
        cfg.deck_size - state.num_dealt > jnp.arange(cfg.deck_size - n * h),
        (fw[:, None] == jnp.arange(1, r + 1)).reshape(-1),
        state.info_tokens > jnp.arange(cfg.max_info_tokens),
        state.life_tokens > jnp.arange(cfg.max_life_tokens),
    ])
    per_kind = state.discards.reshape(c, r)
    discards = jnp.concatenate([per_kind[:, j, None] > jnp.arange(m) for j, m in enumerate(cfg.copies)], 1)
    shared = jnp.concatenate([
        board, discards.reshape(-1),
    ])
    tail = jnp.concatenate([
        _unpack(w["misc"], mb["scored"] - mb["colour"], mb["colour"]),  # colour, rank, reveal, slot
        _unpack(w["card"], k),
        _unpack(w["misc"], 2, mb["scored"]),  # scored, info added
    ])
    know = jnp.concatenate([_unpack(w["plaus"], k), _unpack(w["revealed"], c + r)], -1)  # [N, H, K+C+R]
    bcast = lambda x: jnp.broadcast_to(x[None], (n, x.shape[0]))
    return jnp.concatenate([
        _unpack(cfg.rotate(w["hand"])[:, 1:], k).reshape(n, -1),  # 1. the others' cards
        (w["missing"] >> rel) & 1 > 0,
        bcast(shared),  # 2-3. board, discards
        (w["actor"] >> rel) & 1 > 0,  # 4. last move
        bcast(_unpack(w["misc"], 4, mb["move"])),
        (w["target"] >> rel) & 1 > 0,
        bcast(tail),
        cfg.rotate(know).reshape(n, -1),  # 5. card knowledge
    ], axis=1)


def encode(cfg: GameConfig, state: GameState, mode: str = "canonical") -> jax.Array:
    """``[N, obs_size]`` float32: every player's observation (row i = player i's view)."""
    if mode not in OBS_MODES:
        raise ValueError(f"unknown observation mode {mode!r}; choose one of {OBS_MODES}")
    if mode == "compact":
        return _compact(cfg, state)
    obs = _canonical(cfg, state).astype(jnp.float32)
    if mode == "belief":
        n, h, k = cfg.num_players, cfg.hand_size, cfg.num_cards
        start = section_slices(cfg)["knowledge"].start
        know = obs[:, start:].reshape(n, n * h, -1)
        plaus = know[..., :k] * remaining_counts(cfg, state).astype(jnp.float32)
        denom = plaus.sum(-1, keepdims=True)
        plaus = jnp.where(denom > 0, plaus / jnp.where(denom > 0, denom, 1.0), 0.0)
        know = jnp.concatenate([plaus, know[..., k:]], -1).reshape(n, -1)
        obs = jnp.concatenate([obs[:, :start], know], axis=1)
    return jax.lax.optimization_barrier(obs)


# ---------------------------------------------------------------------------
# compact
# ---------------------------------------------------------------------------
def _last_action(cfg: GameConfig, state: GameState) -> jax.Array:
    """``[N, last]`` last-action section for every observer (compact mode)."""
    n, h, c, r, k = cfg.num_players, cfg.hand_size, cfg.num_colours, cfg.num_ranks, cfg.num_cards
    a = state.last_action
    valid = a >= 0
    is_discard, is_play = a < h, (a >= h) & (a < 2 * h)
    is_col = (a >= cfg.colour_hint_start) & (a < cfg.rank_hint_start)
    is_rank = (a >= cfg.rank_hint_start) & (a < cfg.noop)
    is_hint = is_col | is_rank
    observers = jnp.arange(n)[:, None]
    actor = (jnp.arange(n)[None, :] == (state.last_actor - observers) % n)
    target = (jnp.arange(n)[None, :] == (state.last_target - observers) % n) & is_hint
    value = jnp.where(is_col, (a - cfg.colour_hint_start) % c, (a - cfg.rank_hint_start) % r)
    move = jnp.stack([is_play, is_discard, is_col, is_rank])
    shared = jnp.concatenate(
        [
            move,
            (jnp.arange(c) == value) & is_col,
            (jnp.arange(r) == value) & is_rank,
            state.last_reveal & is_hint,
            (jnp.arange(h) == a % h) & (is_play | is_discard),
            (jnp.arange(k) == state.last_card) & (is_play | is_discard),
            state.last_scored[None],
            state.last_info_added[None],
        ]
    )
    parts = [actor, jnp.broadcast_to(shared[None, :4], (n, 4)), target, jnp.broadcast_to(shared[None, 4:], (n, shared.shape[0] - 4))]
    return (jnp.concatenate(parts, axis=1) & valid).astype(jnp.float32)


def _compact(cfg: GameConfig, state: GameState) -> jax.Array:
    """``[N, obs_size(cfg, "compact")]`` float32."""
    n, r, k = cfg.num_players, cfg.num_ranks, cfg.num_cards
    f32 = jnp.float32
    hands = state.hands
    has = hands >= 0
    hand_1h = (hands[..., None] == jnp.arange(k)).astype(f32)  # [N, H, K]
    other = cfg.rotate(hand_1h)[:, 1:].reshape(n, -1)
    missing = cfg.rotate(~has.all(axis=1)).astype(f32)
    remaining = cfg.deck_size - state.num_dealt
    fireworks_1h = (state.fireworks[:, None] == jnp.arange(1, r + 1)[None, :]).reshape(-1).astype(f32)
    board = jnp.concatenate(
        [
            jnp.stack([remaining / cfg.deck_size, state.info_tokens / cfg.max_info_tokens,
                       state.life_tokens / cfg.max_life_tokens]).astype(f32),
            fireworks_1h,
        ]
    )
    discards = state.discards.astype(f32) / jnp.asarray(cfg.card_counts(), f32)
    know = jnp.concatenate(
        [state.colour_plausible, state.rank_plausible,
         (state.colour_hinted & has)[..., None], (state.rank_hinted & has)[..., None]],
        axis=-1,
    ).astype(f32)
    knowledge = cfg.rotate(know).reshape(n, -1)
    shared = jnp.broadcast_to(jnp.concatenate([board, discards])[None, :], (n, board.shape[0] + discards.shape[0]))
    return jnp.concatenate([other, missing, shared, _last_action(cfg, state), knowledge], axis=1)


# ---------------------------------------------------------------------------
# decoding (host-side, one observation) -- used by tests and for inspection
# ---------------------------------------------------------------------------
def decode(cfg: GameConfig, obs, mode: str = "canonical") -> dict:
    """Read one observer's ``[obs_size]`` vector back into game quantities (numpy).

    Returns a dict with ``other_hands`` ``[N-1, H]`` card ids (-1 empty),
    ``missing`` ``[N]``, ``deck_size``, ``fireworks`` ``[C]``, ``info_tokens``,
    ``life_tokens``, ``discards`` ``[K]``, ``last_action`` fields,
    ``plausible`` ``[N, H, K]`` (bool; canonical/compact) or ``belief``,
    ``colour_revealed`` / ``rank_revealed`` ``[N, H]`` (-1 when not revealed).
    """
    n, h, c, r, k = cfg.num_players, cfg.hand_size, cfg.num_colours, cfg.num_ranks, cfg.num_cards
    obs = np.asarray(obs, np.float64)
    s = {name: obs[sl] for name, sl in section_slices(cfg, mode).items()}
    out = {}
    hands = s["hands"][: (n - 1) * h * k].reshape(n - 1, h, k)
    out["other_hands"] = np.where(hands.any(-1), hands.argmax(-1), -1)
    out["missing"] = s["hands"][(n - 1) * h * k:].astype(bool)
    b = s["board"]
    if mode == "compact":
        out["deck_size"] = int(round(b[0] * cfg.deck_size))
        out["info_tokens"] = int(round(b[1] * cfg.max_info_tokens))
        out["life_tokens"] = int(round(b[2] * cfg.max_life_tokens))
        fw = b[3:].reshape(c, r)
        out["discards"] = np.rint(s["discards"] * cfg.card_counts()).astype(int)
    else:
        nd = cfg.deck_size - n * h
        out["deck_size"] = int(b[:nd].sum())
        fw = b[nd: nd + k].reshape(c, r)
        out["info_tokens"] = int(b[nd + k: nd + k + cfg.max_info_tokens].sum())
        out["life_tokens"] = int(b[nd + k + cfg.max_info_tokens:].sum())
        kinds, _ = _discard_index(cfg)
        out["discards"] = np.bincount(kinds, weights=s["discards"], minlength=k).astype(int)
    out["fireworks"] = np.where(fw.any(-1), fw.argmax(-1) + 1, 0)
    la = s["last_action"]
    sizes = [n, 4, n, c, r, h, h, k, 1, 1]
    names = ["actor", "move", "target", "colour", "rank", "reveal", "slot", "card", "scored", "info_added"]
    parts = np.split(la, np.cumsum(sizes)[:-1])
    out["last"] = dict(zip(names, parts))
    if mode == "compact":
        kn = s["knowledge"].reshape(n, h, c + r + 2)
        cp, rp = kn[..., :c] > 0, kn[..., c: c + r] > 0
        out["plausible"] = (cp[..., :, None] & rp[..., None, :]).reshape(n, h, k)
        out["colour_hinted"] = kn[..., c + r] > 0
        out["rank_hinted"] = kn[..., c + r + 1] > 0
    else:
        kn = s["knowledge"].reshape(n, h, k + c + r)
        if mode == "belief":
            out["belief"] = kn[..., :k]
            out["plausible"] = kn[..., :k] > 0
        else:
            out["plausible"] = kn[..., :k] > 0
        cr, rr = kn[..., k: k + c], kn[..., k + c:]
        out["colour_revealed"] = np.where(cr.any(-1), cr.argmax(-1), -1)
        out["rank_revealed"] = np.where(rr.any(-1), rr.argmax(-1), -1)
    return out
