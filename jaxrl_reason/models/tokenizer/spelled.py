"""Text spelled one token per character, for code that reads or writes ids inside jit: the per-byte tables
(``byte_ids``: byte -> id, ``token_bytes``: id -> bytes) and ``SpelledTokenizer``, a checkpoint's tokenizer
whose ``encode`` spells. All rest on ``Tokenizer.char_ids`` / ``Tokenizer.spell`` (base.py): the id of
``chr(b)`` is ``encode(chr(b))`` when that is one token decoding back to ``chr(b)``.

    table = byte_ids(tok)              # [256] byte -> id (ByteTokenizer: byte + n_special): text rendered in jit
    table, lens = token_bytes(tok)     # [V, K], [V]: id -> its ASCII bytes: generated text, parsed in jit
    tok = SpelledTokenizer(hf_tok)     # encode spells plain text per character; the rest is hf_tok's
    tok = SpelledTokenizer(hf_tok, tags=dict(zip(R1_TAGS, (" Steps", " So", " answer", " Done"))))
                                       # ... and the R1 tags are words of hf_tok's vocabulary (no new rows)

Any tokenizer that spells every character of the text as one token works, e.g. a checkpoint's byte-level
BPE (Qwen2/3, Llama 3, DeepSeek-V3: every ASCII byte is a token). Text spelled that way is a valid id
sequence, though not the tokenizer's canonical one (``"Your card"`` is 9 ids, not 2).

Reading generated ids (``token_bytes``): each id maps to the ASCII bytes it decodes to (at most ``K`` of
them, ``K <= MAX_TOKEN_BYTES``), so the canonical tokenization of ``\\boxed{bet}`` (``\\``, ``boxed``,
``{``, ``bet``, ``}``) reads exactly as its one-token-per-byte spelling once the bytes are concatenated in
jit. Special tokens, tokens that decode to non-ASCII text (or a partial UTF-8 byte) and tokens longer than
``MAX_TOKEN_BYTES`` become one unknown byte (``UNKNOWN``), which matches nothing; ids beyond the
tokenizer's vocabulary (a model's unused rows) are unknown too. The tables assume that a token decodes to
the same text alone as in context (true for byte-level BPE; not for SentencePiece's ``"▁"`` prefixes).
For the ``ByteTokenizer`` they are exactly ``byte + n_special`` and ``id - n_special`` (K = 1).
"""

from __future__ import annotations

import functools
import re

import numpy as np

from jaxrl_reason.models.tokenizer.base import R1_TAGS, Tokenizer
from jaxrl_reason.models.tokenizer.char import ByteTokenizer

MAX_TOKEN_BYTES = 16  # longer tokens (runs of spaces or dashes in a large BPE) parse as one unknown byte
UNKNOWN = -1  # the byte of a token with no ASCII spelling: equals no character
PRINTABLE = "".join(map(chr, range(32, 127)))  # printable ASCII: what SpelledTokenizer requires


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)  # cached: shared by every caller
    return a


def byte_offset(tokenizer: Tokenizer) -> int:
    """The id of byte 0 of a ``ByteTokenizer`` (its text ids are ``byte + offset``); ValueError otherwise."""
    if not isinstance(tokenizer, ByteTokenizer):
        raise ValueError(f"byte_offset needs a ByteTokenizer, got {type(tokenizer).__name__} (use byte_ids)")
    return tokenizer.n_special


@functools.lru_cache(maxsize=16)
def byte_ids(tokenizer: Tokenizer) -> np.ndarray:
    """``[256]`` int32: byte ``b`` -> the id that spells ``chr(b)`` alone, -1 where no single token does
    (``Tokenizer.char_ids``; bytes >= 128 always -1, except for a ``ByteTokenizer``: its byte ids)."""
    if isinstance(tokenizer, ByteTokenizer):
        return _frozen(np.arange(256, dtype=np.int32) + tokenizer.n_special)
    out = np.full(256, -1, np.int32)
    out[:128] = tokenizer.char_ids()
    return _frozen(out)


@functools.lru_cache(maxsize=16)
def token_bytes(tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """``(table [V, K] int16, lengths [V] int32)``: id ``i`` spells the bytes ``table[i, :lengths[i]]``
    (``V = tokenizer.vocab_size``). A special token, a token with non-ASCII or empty text, or one of more than
    ``MAX_TOKEN_BYTES`` bytes is one unknown byte (``UNKNOWN``); ``K`` is the longest spelling kept."""
    v = tokenizer.vocab_size
    if isinstance(tokenizer, ByteTokenizer):
        table = (np.arange(v, dtype=np.int16) - tokenizer.n_special)[:, None]
        table[table < 0] = UNKNOWN
        return _frozen(table), _frozen(np.ones(v, np.int32))
    special = set()
    for t in tokenizer.control_tokens:
        try:
            special.add(tokenizer.token_to_id(t))
        except KeyError:
            pass
    spelled = []
    for i in range(v):
        s = "" if i in special else tokenizer.decode([i])
        ok = 0 < len(s) <= MAX_TOKEN_BYTES and s.isascii()
        spelled.append(s.encode("ascii") if ok else None)
    k = max((len(s) for s in spelled if s is not None), default=1)
    table = np.full((v, k), UNKNOWN, np.int16)
    lengths = np.ones(v, np.int32)
    for i, s in enumerate(spelled):
        if s is not None:
            table[i, :len(s)] = np.frombuffer(s, np.uint8)
            lengths[i] = len(s)
    return _frozen(table), _frozen(lengths)


def host_bytes(ids, tokenizer: Tokenizer) -> list[int]:
    """Host twin of the in-jit byte stream of generated ids (``token_bytes``): concatenated bytes, -1 unknown."""
    table, lengths = token_bytes(tokenizer)
    out: list[int] = []
    for i in np.asarray(ids).reshape(-1).tolist():
        out.extend(table[i, :lengths[i]].tolist() if 0 <= i < len(table) else [UNKNOWN])
    return out


class SpelledTokenizer(Tokenizer):
    """``inner`` (a checkpoint's tokenizer) with its plain text spelled one token per character.

    ``encode`` writes each character as its single id in ``inner`` (``Tokenizer.spell(text, strict=False)``;
    with ``allow_special``, control-token strings stay their single ids): a valid id sequence that decodes back
    to the text, not ``inner``'s canonical (merged) tokenization, so prompts, gold traces, search traces and
    answers reach the model spelled as the in-jit step check, the step search and the character spans of
    procedure cloning read them (ASTRO, ``experiments/astro.py``; its base SFT teaches the checkpoint that
    spelling). Everything else (decode, ids of named tokens, vocabulary) is ``inner``'s. ValueError naming the
    tokenizer and the first printable ASCII character that is not one token decoding back to itself (true of
    byte-level BPEs: Qwen2/3, Llama 3, DeepSeek-V3; not of SentencePiece vocabularies whose characters carry a
    word-start marker). A token the model generates that merges several characters decodes normally on the
    host, but the in-jit parsers do not read it (``tasks.calc_steps``).

    ``tags`` ({R1 tag: word}, e.g. ``{"<think>": " Steps", ...}``): the R1 tags are read and written as words the
    checkpoint already has (one token each, two or more characters, so spelled text never holds one): its own
    pretrained rows instead of new special tokens (``with_tokens``), which a short fine-tune does not teach.
    ``token_to_id`` / ``encode(allow_special=True)`` give the word's id for a tag, ``decode`` reads it back as
    the tag (so the verifiers and text rewards see R1 responses), and the tags count as control tokens (text
    from data spells them; the in-jit byte tables read them as no character). A tag word the model writes is
    that tag wherever it stands."""

    def __init__(self, inner: Tokenizer, name: str | None = None, tags: dict[str, str] | None = None):
        self.inner, self.name = inner, name or type(inner).__name__
        for attr in ("pad", "bos", "eos", "vocab_size", "add_bos_token", "chat_template", "special_tokens_map"):
            setattr(self, attr, getattr(inner, attr))
        table = inner.char_ids()
        missing = [ch for ch in PRINTABLE if table[ord(ch)] < 0]
        if missing:
            raise ValueError(f"{self.name} does not encode {missing[0]!r} as one token that decodes back to it (encode "
                             f"gives {inner.encode(missing[0])}); ASTRO spells text one token per character, which "
                             "needs every printable ASCII character as a single token (a byte-level BPE: Qwen2/3, "
                             "Llama 3, DeepSeek-V3)")
        if inner.decode(self.encode(PRINTABLE)) != PRINTABLE:
            raise ValueError(f"{self.name} does not decode text spelled one token per character back to the text")
        self.tags = self._tag_ids(tags or {})

    def _tag_ids(self, tags: dict[str, str]) -> dict[str, int]:
        """``tags`` (R1 tag -> a word of ``inner``'s vocabulary) -> {tag: the word's id}, checked: R1 tags only,
        distinct words, each one token of two or more characters (spelled text never holds it: one id per
        character) that is no control token."""
        if set(tags) - set(R1_TAGS):
            raise ValueError(f"{self.name}: tags maps the R1 tags {R1_TAGS}, got {sorted(set(tags) - set(R1_TAGS))}")
        controls = {self.inner.token_to_id(t) for t in self.inner.control_tokens}
        ids = {}
        for tag, word in tags.items():
            i = self.inner.single_token_id(word)
            if i is None or len(word) < 2 or i in controls or self.inner.decode([i]) != word:
                raise ValueError(f"{self.name}: the tag word {word!r} for {tag} must be one token of two or more "
                                 f"characters that decodes back to itself and is no control token (encode gives "
                                 f"{self.inner.encode(word)})")
            ids[tag] = i
        if len(set(ids.values())) != len(ids):
            raise ValueError(f"{self.name}: the tag words must be distinct tokens, got {tags}")
        return ids

    @property
    def control_tokens(self) -> tuple[str, ...]:
        return self.inner.control_tokens + tuple(self.tags)

    def token_to_id(self, token: str) -> int:
        return self.tags[token] if token in self.tags else self.inner.token_to_id(token)

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        if not allow_special:
            return self.inner.spell(text, strict=False)
        parts = re.split(f"({self._control_re.pattern})", text)  # odd parts: control-token strings
        return [i for k, part in enumerate(parts) if part
                for i in ([self.token_to_id(part)] if k % 2 else self.inner.spell(part, strict=False))]

    def decode(self, ids, skip_special: bool = False) -> str:
        """``inner``'s decode, a tag word's id read back as its tag (dropped with ``skip_special``)."""
        if not self.tags:
            return self.inner.decode(ids, skip_special)
        tag_of = {i: t for t, i in self.tags.items()}
        out, run = [], []
        for i in list(ids):
            if int(i) in tag_of:
                out += [self.inner.decode(run, skip_special), "" if skip_special else tag_of[int(i)]]
                run = []
            else:
                run.append(i)
        return "".join(out) + self.inner.decode(run, skip_special)
