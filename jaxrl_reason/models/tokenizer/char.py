"""Tokenizers with reserved special tokens and a fixed alphabet: ``ByteTokenizer`` (UTF-8 bytes) and
``CharTokenizer`` (the synthetic tasks' 96 ids), both on ``_ReservedSpecials``.

    tok = ByteTokenizer(extra_special=("<unk>",))   # 8 specials + 256 bytes (SPIRAL's presets)
    tok = CharTokenizer()                           # 96 ids: the synthetic-task presets

ByteTokenizer ids: 0..n_special-1 are the special tokens (pad=0, bos, eos, <think>, </think>,
<answer>, </answer>, then `extra_special`), followed by the 256 byte values. CharTokenizer ids: the
same 7 special tokens and <unk> (0..7), then 78 characters (digits, `+-*/=()<>,.:;?! `, letters) and
10 unused ids (96 in all); other characters encode as <unk>.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from jaxrl_reason.models.tokenizer.base import DEFAULT_SPECIAL, Tokenizer

CHARS = "0123456789+-*/=()<>,.:;?! " + "abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class _ReservedSpecials(Tokenizer):
    """Special tokens at ids 0..n_special-1, then a fixed alphabet (`_encode_text` / `_decode_text`)."""

    def __init__(self, special: Sequence[str], n_alphabet: int, chat_template: str | dict[str, str] | None):
        self.special = tuple(special)
        if len(set(self.special)) != len(self.special):
            raise ValueError(f"duplicate special tokens in {self.special}")
        self._sid = {s: i for i, s in enumerate(self.special)}
        longest_first = sorted(self.special, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(s) for s in longest_first) + ")")
        self.pad, self.bos, self.eos = "<pad>", "<bos>", "<eos>"
        self.n_special = len(self.special)
        self.vocab_size = self.n_special + n_alphabet
        self.chat_template = chat_template
        self.special_tokens_map = {"bos_token": self.bos, "eos_token": self.eos, "pad_token": self.pad}

    @property
    def control_tokens(self) -> tuple[str, ...]:
        return self.special

    def token_to_id(self, token: str) -> int:
        if token not in self._sid:
            raise KeyError(f"{token!r} is not a special token of this {type(self).__name__}")
        return self._sid[token]

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        ids: list[int] = []
        for part in self._split.split(text) if allow_special else (text,):
            if part in self._sid and allow_special:
                ids.append(self._sid[part])
            elif part:
                ids.extend(self._encode_text(part))
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        out, run = [], []
        for i in np.asarray(ids, np.int64).reshape(-1).tolist():
            if i >= self.n_special:
                run.append(i - self.n_special)
                continue
            out.append(self._decode_text(run))
            run = []
            if not skip_special and i >= 0:
                out.append(self.special[i])
        out.append(self._decode_text(run))
        return "".join(out)

    def _encode_text(self, text: str) -> list[int]:
        raise NotImplementedError

    def _decode_text(self, alphabet_ids: list[int]) -> str:
        raise NotImplementedError


class ByteTokenizer(_ReservedSpecials):
    """UTF-8 bytes + reserved special tokens; vocab_size = n_special + 256. `chat_template`: optional jinja
    source (its control tokens must be among the special tokens to become single ids)."""

    def __init__(self, extra_special: Sequence[str] = (), chat_template: str | dict[str, str] | None = None):
        super().__init__(tuple(DEFAULT_SPECIAL) + tuple(extra_special), 256, chat_template)

    def _encode_text(self, text: str) -> list[int]:
        return [b + self.n_special for b in text.encode("utf-8")]

    def _decode_text(self, alphabet_ids: list[int]) -> str:
        return bytes(min(b, 255) for b in alphabet_ids).decode("utf-8", errors="replace")


class CharTokenizer(_ReservedSpecials):
    """The synthetic tasks' tokenizer: 8 special tokens (pad=0, bos, eos, the 4 R1 tags, <unk>), 78
    characters and 10 unused ids = 96, so a tiny model spells every prompt, trace and answer and emits a
    tag in one token. Characters outside `CHARS` encode as <unk>; unused ids decode as "<unk>"."""

    def __init__(self, chat_template: str | dict[str, str] | None = None):
        super().__init__(tuple(DEFAULT_SPECIAL) + ("<unk>",), 96 - len(DEFAULT_SPECIAL) - 1, chat_template)
        self._cid = {c: i + self.n_special for i, c in enumerate(CHARS)}
        self.unk_id = self._sid["<unk>"]

    def _encode_text(self, text: str) -> list[int]:
        return [self._cid.get(c, self.unk_id) for c in text]

    def _decode_text(self, alphabet_ids: list[int]) -> str:
        return "".join(CHARS[i] if i < len(CHARS) else "<unk>" for i in alphabet_ids)
