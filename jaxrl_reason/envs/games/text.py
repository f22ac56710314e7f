"""Text interface for language-model players: prompts as token ids inside jit, answers parsed back.

The generic machinery: ``GameText`` (the parser and renderer every game's interface subclasses),
``Template`` / ``Slot``, ``encode`` / ``to_str``, the prompt ``STYLES`` and the parse status codes.
Each game's subclass lives in its package (``envs.games.<name>.text``, named by its
``GameSpec.text``); ``envs.games.game_text(env, style)`` builds the one of any registered game.

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
        first_slot = next((i for i, (n, _) in enumerate(self.parts) if n is not None), len(self.parts))
        #: ids every rendering starts with: the constant text before the first slot
        self.prefix_length = sum(t.shape[-1] for _, t in self.parts[:first_slot])

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


def check_style(style: str) -> str:
    """``style`` if it is one of ``STYLES`` (ValueError otherwise)."""
    if style not in STYLES:
        raise ValueError(f"prompt style must be one of {STYLES}, got {style!r}")
    return style


__all__ = [
    "BOXED", "ILLEGAL", "STYLES", "INVALID_ACTION", "NO_ANSWER", "OK", "STATUS_NAMES", "UNKNOWN",
    "GameText", "Slot", "Template", "check_style", "encode", "to_str",
]
