"""Text interface for language-model players: prompts as token ids inside jit, answers parsed back.

Vocabulary: ids are **byte values plus an offset**: ASCII byte ``b`` becomes id ``b + offset``
(``offset`` is a parameter, default 0), so the vocabulary is ``256 + offset`` ids and a
byte-level tokenizer whose byte ids start at ``offset`` consumes the prompts unchanged.

Renderer: each game has a fixed template of constant text and *slots*; a slot picks one of a
few fixed strings (padded with spaces to one width), so every prompt of a game has one static
length and rendering is a constant array plus a few small table lookups (no Python per step).
Two styles carry the same information: ``"verbose"`` (default: the rules in prose, for pretrained
LMs) and ``"compact"`` (the state in a few short lines, 3-4x fewer tokens: for tiny LMs trained
from scratch, whose compute grows with the prompt and which cannot use the prose anyway).
``render(state, player)`` uses only what ``player`` may see (its own card / valuations, public
history). ``to_str(ids)`` decodes ids back to text (for notebooks and debugging), and
``describe(state, player)`` is the same prompt as a Python string.

Parser (``parse`` on ids, also inside jit): the answer is the content of the **last**
``\\boxed{...}`` in the generated ids; letters are lower-cased and whitespace is dropped before it
is compared with each action's canonical string (``TicTacToe``: ``"4"``; Kuhn Poker: ``"bet"``;
Negotiation: ``"accept"``, ``"deny"``, ``"give 2 wood for 3 gold"``).

Forfeit rule (as SPIRAL): ``parse`` returns ``(action, status)``. ``status`` is ``OK``,
``NO_ANSWER`` (no complete ``\\boxed{...}``), ``UNKNOWN`` (content matches no action) or
``ILLEGAL`` (a known action that the legal mask forbids). For ``NO_ANSWER`` and ``UNKNOWN`` the
action is ``INVALID_ACTION = -1``; for ``ILLEGAL`` it is the named action. Passing that action to
``env.step`` applies the environment's illegal-action rule: the game ends, the offender gets
``-illegal_action_penalty`` (default 1) and the opponent 0 — an unparseable or illegal answer
forfeits the game.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.envs.games import kuhn_poker as kp
from jaxrl_reason.envs.games.kuhn_poker import KuhnPoker
from jaxrl_reason.envs.games.negotiation import FIRST_OFFER, RESOURCE_NAMES, Negotiation
from jaxrl_reason.envs.games.tictactoe import TicTacToe, bits_to_cells

VOCAB_BYTES = 256
INVALID_ACTION = -1
OK, NO_ANSWER, UNKNOWN, ILLEGAL = 0, 1, 2, 3
STATUS_NAMES = ("ok", "no_answer", "unknown", "illegal")
BOXED = "\\boxed{"
STYLES = ("verbose", "compact")


def encode(text: str, offset: int = 0) -> np.ndarray:
    """ASCII ``text`` -> ``[len]`` int32 ids (byte + ``offset``)."""
    return np.frombuffer(text.encode("ascii"), np.uint8).astype(np.int32) + offset


def to_str(ids, offset: int = 0) -> str:
    """Ids -> text; ids outside ``[offset, offset + 256)`` are dropped."""
    b = np.asarray(ids).reshape(-1) - offset
    return bytes(int(x) for x in b if 0 <= x < VOCAB_BYTES).decode("ascii", errors="replace")


@dataclasses.dataclass(frozen=True)
class Slot:
    """A template field: ``choices[i]`` is written when the slot's value is ``i``."""

    name: str
    choices: tuple[str, ...]


class Template:
    """Constant text with slots -> fixed-length id array, rendered inside jit."""

    def __init__(self, parts: Sequence[str | Slot]):
        self.parts = []
        for p in parts:
            if isinstance(p, Slot):
                width = max(len(c) for c in p.choices)
                table = np.stack([encode(c.ljust(width)) for c in p.choices])
                self.parts.append((p.name, table))
            else:
                self.parts.append((None, encode(p)))
        self.length = sum(t.shape[-1] for _, t in self.parts)
        self.slot_names = [n for n, _ in self.parts if n is not None]

    def render(self, values: dict, offset: int = 0) -> jax.Array:
        """``values[name]``: int scalar per slot -> ``[length]`` int32 ids."""
        missing = set(self.slot_names) - set(values)
        if missing:
            raise ValueError(f"template slots without a value: {sorted(missing)}")
        pieces = [
            jnp.asarray(t) if name is None else jnp.asarray(t)[jnp.asarray(values[name], jnp.int32)]
            for name, t in self.parts
        ]
        return jnp.concatenate(pieces) + offset


def _compact_lower(b: jax.Array, valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Drop whitespace and invalid positions, lower-case letters: ``[W]`` bytes -> (``[W]``, length)."""
    space = (b == 32) | (b == 9) | (b == 10) | (b == 13)
    keep = valid & ~space
    lower = jnp.where((b >= 65) & (b <= 90), b + 32, b)
    pos = jnp.where(keep, jnp.cumsum(keep) - 1, b.shape[0])
    out = jnp.zeros_like(b).at[pos].set(lower, mode="drop")
    return out, keep.sum()


class GameText:
    """Shared parser over a game's canonical action strings; subclasses define the template."""

    template: Template
    action_strings: tuple[str, ...]
    game: type | None = None  # the environment class this interface renders (``game_text`` dispatch)
    window: int = 64  # bytes read after "\boxed{"

    def __init__(self, env):
        self.env = env
        canon = [s.lower().replace(" ", "") for s in self.action_strings]
        if len(canon) != env.num_actions or len(set(canon)) != len(canon):
            raise ValueError("action_strings must name every action once")
        if max(len(c) for c in canon) >= self.window:
            raise ValueError("an action string is longer than the parse window")
        self._canon = np.stack([np.pad(encode(c), (0, self.window - len(c))) for c in canon])
        self._canon_len = np.asarray([len(c) for c in canon], np.int32)

    @property
    def prompt_length(self) -> int:
        return self.template.length

    def slot_values(self, state, player) -> dict:
        raise NotImplementedError

    def render(self, state, player, offset: int = 0) -> jax.Array:
        """``[prompt_length]`` int32 ids of ``player``'s prompt (one unbatched state; vmap it)."""
        return self.template.render(self.slot_values(state, jnp.asarray(player, jnp.int32)), offset)

    def describe(self, state, player, offset: int = 0) -> str:
        """The prompt as a Python string (not for jit)."""
        return to_str(self.render(state, player, offset), offset)

    def answer_ids(self, action: int, offset: int = 0) -> np.ndarray:
        """Ids of ``\\boxed{<canonical action string>}``."""
        return encode(BOXED + self.action_strings[int(action)] + "}", offset)

    def parse(self, ids: jax.Array, legal_mask: jax.Array | None = None, offset: int = 0):
        """Generated ``[T]`` ids -> ``(action int32, status int32)`` (see module docstring)."""
        b = jnp.asarray(ids, jnp.int32) - offset
        pat = encode(BOXED)
        n, k = b.shape[0], len(pat)
        padded = jnp.concatenate([b, jnp.full((self.window + k,), -1, jnp.int32)])
        hit = jnp.ones((n,), bool)
        for j in range(k):  # k = 7 static shifts
            hit &= padded[j : j + n] == pat[j]
        found = hit.any()
        start = n - 1 - jnp.argmax(hit[::-1]) + k  # after the last "\boxed{"
        seg = jax.lax.dynamic_slice(padded, (start,), (self.window,))
        close = seg == ord("}")
        closed = close.any()
        end = jnp.argmax(close)
        content, length = _compact_lower(seg, jnp.arange(self.window) < end)
        match = (content[None, :] == self._canon).all(-1) & (length == self._canon_len)
        known = found & closed & match.any()
        action = jnp.where(known, jnp.argmax(match), INVALID_ACTION).astype(jnp.int32)
        status = jnp.where(~(found & closed), NO_ANSWER, jnp.where(known, OK, UNKNOWN))
        if legal_mask is not None:
            legal = jnp.asarray(legal_mask)[jnp.maximum(action, 0)]
            status = jnp.where((status == OK) & ~legal, ILLEGAL, status)
        return action, status.astype(jnp.int32)

    def parse_str(self, text: str, legal_mask=None) -> tuple[int, str]:
        """Convenience for Python strings: ``(action, status name)``."""
        a, s = self.parse(jnp.asarray(encode(text)), legal_mask)
        return int(a), STATUS_NAMES[int(s)]


def _n(values, width=1) -> tuple[str, ...]:
    return tuple(str(v).rjust(width) for v in values)


def check_style(style: str) -> str:
    if style not in STYLES:
        raise ValueError(f"prompt style must be one of {STYLES}, got {style!r}")
    return style


def _short_history(text: str) -> str:
    """``"Player 0 checked, Player 1 bet"`` -> ``"P0 check, P1 bet"`` (compact Kuhn history)."""
    for long, short in (("Player ", "P"), ("checked", "check"), ("folded", "fold"), ("called", "call"),
                        ("no actions yet", "none")):
        text = text.replace(long, short)
    return text


class TicTacToeText(GameText):
    game = TicTacToe
    action_strings = tuple(str(c) for c in range(9))

    def __init__(self, env: TicTacToe, style: str = "verbose"):
        cell = lambda i: Slot(f"cell{i}", (str(i), "X", "O"))
        legal = [Slot(f"legal{i}", ("  ", f" {i}")) for i in range(9)]
        if check_style(style) == "compact":
            parts: list = ["TicTacToe. You are ", Slot("mark", ("X", "O")), ".\n"]
            for r in range(3):
                parts += [cell(3 * r + c) for c in range(3)] + ["\n"]
            parts += ["Legal:", *legal, "\nAnswer \\boxed{n}.\n"]
        else:
            parts = ["Tic-Tac-Toe on a 3x3 board. You play ", Slot("mark", ("X", "O")),
                     " (X moves first). Three in a row wins.\nBoard (free cells show their number):\n"]
            for r in range(3):
                for c in range(3):
                    parts += [" ", cell(3 * r + c), " " if c == 2 else " |"]
                parts.append("\n" if r == 2 else "\n---+---+---\n")
            parts += ["Legal moves:", *legal, "\nYour move. Answer with the cell number as \\boxed{n}.\n"]
        self.template = Template(parts)
        super().__init__(env)

    def slot_values(self, state, player):
        cells = bits_to_cells(state.marks)  # [2, 9]
        x_player = state.first_player
        x_cells = jnp.where(x_player == 0, cells[0], cells[1])
        o_cells = jnp.where(x_player == 0, cells[1], cells[0])
        vals = {"mark": (player != x_player).astype(jnp.int32)}
        empty = ~(x_cells | o_cells)
        for i in range(9):
            vals[f"cell{i}"] = jnp.where(x_cells[i], 1, jnp.where(o_cells[i], 2, 0))
            vals[f"legal{i}"] = (empty[i] & ~state.terminated).astype(jnp.int32)
        return vals


class KuhnPokerText(GameText):
    game = KuhnPoker
    action_strings = kp.ACTION_NAMES
    _HISTORY_TEXT = (
        "no actions yet",
        "Player 0 checked",
        "Player 0 bet",
        "Player 0 checked, Player 1 bet",
        "Player 0 checked, Player 1 checked",
        "Player 0 bet, Player 1 folded",
        "Player 0 bet, Player 1 called",
        "Player 0 checked, Player 1 bet, Player 0 folded",
        "Player 0 checked, Player 1 bet, Player 0 called",
    )

    def __init__(self, env: KuhnPoker, style: str = "verbose"):
        legal = [Slot(f"legal{a}", ("", " " + n)) for a, n in enumerate(kp.ACTION_NAMES)]
        if check_style(style) == "compact":
            self.template = Template([
                "Kuhn Poker. You are P", Slot("player", ("0", "1")), ", card ", Slot("card", kp.CARD_NAMES),
                ".\nHistory: ", Slot("history", tuple(_short_history(h) + "." for h in self._HISTORY_TEXT)),
                "\nLegal:", *legal, "\nAnswer \\boxed{action}.\n",
            ])
        else:
            self.template = Template([
                "Kuhn Poker. Deck: J < Q < K; each player antes 1 chip and holds one card. Player 0 acts "
                "first: check or bet 1; facing a bet: call or fold. Higher card wins at showdown.\n"
                "You are Player ", Slot("player", ("0", "1")), ". Your card: ", Slot("card", kp.CARD_NAMES),
                ".\nHistory: ", Slot("history", tuple(h + "." for h in self._HISTORY_TEXT)), "\nLegal actions:",
                *legal, "\nAnswer with \\boxed{action}.\n",
            ])
        super().__init__(env)

    def slot_values(self, state, player):
        card = jnp.where(player == 0, state.cards[0], state.cards[1])
        facing = (state.hist == 2) | (state.hist == 3)
        live = ~state.terminated & (state.current_player == player)
        legal = [live & ~facing, live & ~facing, live & facing, live & facing]
        vals = {"player": player, "card": card, "history": state.hist}
        vals.update({f"legal{a}": legal[a].astype(jnp.int32) for a in range(4)})
        return vals


class NegotiationText(GameText):
    game = Negotiation

    def __init__(self, env: Negotiation, style: str = "verbose"):
        q = env.max_qty
        self.action_strings = ("accept", "deny") + tuple(
            f"give {g} {RESOURCE_NAMES[r]} for {w} {RESOURCE_NAMES[1 - r]}"
            for r in range(2) for g in range(1, q + 1) for w in range(1, q + 1)
        )
        inv = _n(range(2 * env.initial_amount + 1), 2)
        offers = ("none.",) + tuple(
            f"{who} give{'s' if who != 'you' else ''} {g} {RESOURCE_NAMES[r]} for {w} {RESOURCE_NAMES[1 - r]}."
            for who in ("you", "opponent") for r in range(2) for g in range(1, q + 1) for w in range(1, q + 1)
        )
        turn = Slot("turn", _n(range(1, env.max_turns + 2), 2))
        if check_style(style) == "compact":
            short = ("none.",) + tuple(o.replace("opponent gives", "they give") for o in offers[1:])
            self.template = Template([
                "Negotiation. You are P", Slot("player", ("0", "1")), ", turn ", turn, "/", str(env.max_turns),
                ".\nValues: wood ", Slot("vw", _n(range(7))), ", gold ", Slot("vg", _n(range(7))),
                ".\nYou ", Slot("w0", inv), " wood ", Slot("g0", inv), " gold; opp ", Slot("w1", inv),
                " wood ", Slot("g1", inv), " gold.\nOffer: ", Slot("offer", short),
                f"\n\\boxed{{accept|deny|give G wood for W gold|give G gold for W wood}}, G, W in 1..{q}.\n",
            ])
        else:
            self.template = Template([
                "Negotiation. Trade wood and gold; after ", str(env.max_turns), " turns the player whose "
                "inventory value grew more wins.\nYou are Player ", Slot("player", ("0", "1")),
                ". Turn ", turn, " of ", str(env.max_turns),
                ".\nYour private values: wood ", Slot("vw", _n(range(7))), ", gold ", Slot("vg", _n(range(7))),
                ".\nYou hold ", Slot("w0", inv), " wood and ", Slot("g0", inv), " gold; the opponent holds ",
                Slot("w1", inv), " wood and ", Slot("g1", inv), " gold.\nPending offer: ", Slot("offer", offers),
                "\nActions: \\boxed{accept} (a pending offer from the opponent), \\boxed{deny}, or "
                f"\\boxed{{give G wood for W gold}} / \\boxed{{give G gold for W wood}} with G, W in 1..{q}.\n",
            ])
        super().__init__(env)

    def slot_values(self, state, player):
        me = jnp.arange(2) == player
        mine = jnp.where(me[:, None], state.inventory, 0).sum(0)
        theirs = jnp.where(me[:, None], 0, state.inventory).sum(0)
        vals = jnp.where(me[:, None], state.values, 0).sum(0)
        n_off = self.env.num_offers
        offer = jnp.where(
            state.pending >= 0, 1 + state.pending + jnp.where(state.proposer == player, 0, n_off), 0
        )
        return {
            "player": player, "turn": jnp.minimum(state.turn, self.env.max_turns),
            "vw": vals[0], "vg": vals[1], "w0": mine[0], "g0": mine[1], "w1": theirs[0], "g1": theirs[1],
            "offer": offer,
        }


def _text_classes() -> dict:
    """Env class -> its ``GameText`` subclass: every subclass that names its ``game`` (a game's text
    module, imported with its package by the registry ``envs.games``, declares itself so)."""
    out, todo = {}, list(GameText.__subclasses__())
    while todo:
        cls = todo.pop(0)
        todo += cls.__subclasses__()
        if getattr(cls, "game", None) is not None:
            out.setdefault(cls.game, cls)
    return out


def game_text(env, style: str = "verbose") -> GameText:
    """The text interface of a game environment (unwraps wrappers) in prompt ``style`` (``STYLES``)."""
    classes = _text_classes()
    base = env
    while hasattr(base, "env") and not isinstance(base, tuple(classes)):
        base = base.env
    for cls, text_cls in classes.items():
        if isinstance(base, cls):
            return text_cls(base, style)
    names = ", ".join(c.__name__ for c in classes)
    raise ValueError(f"no text interface for {env!r}; supported: {names}")


__all__ = [
    "BOXED", "ILLEGAL", "STYLES", "INVALID_ACTION", "NO_ANSWER", "OK", "STATUS_NAMES", "UNKNOWN",
    "GameText", "KuhnPokerText", "NegotiationText", "Slot", "Template", "TicTacToeText",
    "encode", "game_text", "to_str", "FIRST_OFFER",
]
