"""Game records in the AH2AC2 / hanab.live JSON style: deck order + action list.

One game::

    {"id": 17, "players": ["a", "b"],
     "deck": [{"suitIndex": 0, "rank": 1}, ...],          # top card first
     "actions": [{"type": 0, "target": 3}, ...],           # 0 play, 1 discard (target = card
                                                           #   order, its index in the deck),
                                                           # 2 colour clue, 3 rank clue
                                                           #   (target = seat, value = suit / rank 1-5)
     "score": 18}

``load_records`` converts every game to our slot-based actions (hand bookkeeping
in Python) and ``replay`` plays all of them at once through the environment
(``vmap`` + ``scan`` over fixed decks), checking legality and the recorded
score. A malformed, illegal or inconsistent game is reported with its id and
reason and skipped; it never stops the run.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.envs.hanabi import encoding, game
from jaxrl_reason.envs.hanabi.game import GameConfig


@dataclass
class Games:
    """Games ready for replay: ``decks`` ``[G, D]``, ``actions`` ``[G, T]`` (-1 after the end),
    ``lengths`` ``[G]``, recorded ``scores`` ``[G]`` (-1 unknown), ``ids``; ``rejected`` (id, reason)."""

    decks: np.ndarray
    actions: np.ndarray
    lengths: np.ndarray
    scores: np.ndarray
    ids: list
    rejected: list = field(default_factory=list)


# ---------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------
def game_to_record(cfg: GameConfig, game_id, deck, actions, score=None, players=None) -> dict:
    """One game (our deck ``[D]`` card ids and slot-based ``actions``) as a record dict."""
    deck = [int(x) for x in deck]
    n, h = cfg.num_players, cfg.hand_size
    orders = [list(range(p * h, (p + 1) * h)) for p in range(n)]
    nxt, out = n * h, []
    for t, a in enumerate(int(x) for x in actions):
        p = t % n
        kind, slot, target, value = (int(v) for v in game.decode_action(cfg, p, a))
        if kind in (0, 1):
            order = orders[p].pop(slot)
            if nxt < len(deck):
                orders[p].append(nxt)
                nxt += 1
            out.append({"type": 0 if kind == 1 else 1, "target": order})
        elif kind in (2, 3):
            out.append({"type": kind, "target": target, "value": value + (kind == 3)})
        else:
            raise ValueError(f"game {game_id}: a no-op cannot be recorded")
    rec = {
        "id": game_id,
        "players": players or [f"player{i}" for i in range(n)],
        "deck": [{"suitIndex": c // cfg.num_ranks, "rank": c % cfg.num_ranks + 1} for c in deck],
        "actions": out,
    }
    if score is not None:
        rec["score"] = int(score)
    return rec


def write_records(path, records: list[dict]) -> pathlib.Path:
    path = pathlib.Path(path)
    path.write_text(json.dumps(records))
    return path


# ---------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------
def record_to_game(cfg: GameConfig, rec: dict) -> tuple[np.ndarray, list[int]]:
    """Deck ``[D]`` and slot-based actions of one record; raises ValueError if malformed."""
    n, h, c, r = cfg.num_players, cfg.hand_size, cfg.num_colours, cfg.num_ranks
    if len(rec.get("players", [None] * n)) != n:
        raise ValueError(f"{len(rec['players'])} players, expected {n}")
    deck = np.asarray([int(card["suitIndex"]) * r + int(card["rank"]) - 1 for card in rec["deck"]], np.int32)
    if deck.shape != (cfg.deck_size,) or not np.array_equal(np.sort(deck), cfg.sorted_deck()):
        raise ValueError("deck is not a permutation of the full Hanabi deck")
    orders = [list(range(p * h, (p + 1) * h)) for p in range(n)]
    nxt, actions = n * h, []
    for t, act in enumerate(rec["actions"]):
        p, kind = t % n, int(act["type"])
        if kind in (0, 1):
            order = int(act["target"])
            if order not in orders[p]:
                raise ValueError(f"action {t}: card {order} is not in player {p}'s hand")
            slot = orders[p].index(order)
            orders[p].pop(slot)
            if nxt < cfg.deck_size:
                orders[p].append(nxt)
                nxt += 1
            actions.append(game.encode_action(cfg, "play" if kind == 0 else "discard", p, slot=slot))
        elif kind in (2, 3):
            target, value = int(act["target"]), int(act["value"]) - (kind == 3)
            if not (0 <= target < n) or target == p:
                raise ValueError(f"action {t}: bad clue target {target}")
            if not 0 <= value < (c if kind == 2 else r):
                raise ValueError(f"action {t}: bad clue value {act['value']}")
            actions.append(game.encode_action(cfg, "colour" if kind == 2 else "rank", p, target=target, value=value))
        elif kind == 4:  # hanab.live "game over" marker
            break
        else:
            raise ValueError(f"action {t}: unknown action type {kind}")
    return deck, actions


def load_records(cfg: GameConfig, source) -> Games:
    """Parse a JSON file / list of record dicts; malformed games go to ``rejected``."""
    if isinstance(source, (str, pathlib.Path)):
        source = json.loads(pathlib.Path(source).read_text())
    decks, acts, scores, ids, rejected = [], [], [], [], []
    for i, rec in enumerate(source):
        gid = rec.get("id", i) if isinstance(rec, dict) else i
        try:
            deck, actions = record_to_game(cfg, rec)
            if len(actions) > cfg.max_turns:
                raise ValueError(f"{len(actions)} actions, more than any game can last")
        except (KeyError, TypeError, ValueError) as err:
            rejected.append((gid, f"malformed: {err}"))
            continue
        decks.append(deck)
        acts.append(actions)
        scores.append(int(rec.get("score", -1)))
        ids.append(gid)
    table = np.full((len(acts), cfg.max_turns), -1, np.int32)
    for i, a in enumerate(acts):
        table[i, : len(a)] = a
    return Games(np.asarray(decks, np.int32).reshape(-1, cfg.deck_size), table,
                 np.asarray([len(a) for a in acts], np.int32), np.asarray(scores, np.int32), ids, rejected)


def replay(cfg: GameConfig, games: Games, obs_mode: str = "canonical", with_obs: bool = True):
    """Replay every game; returns ``(games_ok, data)``.

    ``games_ok`` keeps only the valid games (others are added to ``rejected`` with the
    reason: illegal move at step t, too short / too long, score mismatch). ``data``
    holds time-major-per-game arrays for the valid games: ``obs`` ``[G, T, N, F]``,
    ``legal`` ``[G, T, N, A]``, ``actions`` ``[G, T]``, ``player`` ``[G, T]``,
    ``valid`` ``[G, T]`` (step inside the game) and ``scores`` ``[G]``.
    """

    def one(deck, actions):
        s = game.init_from_deck(cfg, deck)

        def body(carry, a):
            s, bad = carry
            legal = game.legal_moves(cfg, s)
            active = (a >= 0) & ~s.terminal
            mine = jnp.sum(jnp.where((jnp.arange(cfg.num_players) == s.cur_player)[:, None], legal, False), 0)
            ok = mine[jnp.clip(a, 0, cfg.num_actions - 1)] > 0
            bad = jnp.where(active & ~ok & (bad < 0), s.step, bad)
            ns, _ = game.step(cfg, s, jnp.clip(a, 0), jax.random.key(0))
            keep = active & ok & (bad < 0)
            ns = jax.tree.map(lambda x, y: jnp.where(keep, x, y), ns, s)
            out = (encoding.encode(cfg, s, obs_mode) if with_obs else jnp.zeros(()), legal, s.cur_player, active)
            return (ns, bad), out

        (s, bad), out = jax.lax.scan(body, (s, jnp.int32(-1)), actions)
        return s.score, s.terminal, bad, out

    score, terminal, bad, (obs, legal, player, active) = jax.jit(jax.vmap(one))(
        jnp.asarray(games.decks), jnp.asarray(games.actions))
    score, terminal, bad = np.asarray(score), np.asarray(terminal), np.asarray(bad)
    keep = []
    for i, gid in enumerate(games.ids):
        if bad[i] >= 0:
            games.rejected.append((gid, f"illegal move at step {bad[i]}"))
        elif not terminal[i]:
            games.rejected.append((gid, "the record stops before the game is over"))
        elif games.lengths[i] and np.asarray(active[i]).sum() < games.lengths[i]:
            games.rejected.append((gid, "moves recorded after the game was over"))
        elif games.scores[i] >= 0 and games.scores[i] != score[i]:
            games.rejected.append((gid, f"recorded score {games.scores[i]} but replay gives {score[i]}"))
        else:
            keep.append(i)
    keep = np.asarray(keep, np.int64)
    ok = Games(games.decks[keep], games.actions[keep], games.lengths[keep], score[keep],
               [games.ids[i] for i in keep], games.rejected)
    data = {
        "obs": np.asarray(obs)[keep] if with_obs else None,
        "legal": np.asarray(legal)[keep],
        "actions": games.actions[keep],
        "player": np.asarray(player)[keep],
        "valid": np.asarray(active)[keep],
        "scores": score[keep],
    }
    return ok, data
