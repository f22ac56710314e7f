"""The SPIRAL language model's tokenizer, the per-byte tables that render and parse game text in its ids
inside jit, and the adapter to the reasoning tasks' tokenizer.

    tok = spiral_tokenizer()          # ByteTokenizer(extra_special=("<unk>",)): 264 ids (the presets)
    byte_ids(tok)                     # [256] byte -> LM id (here byte + 8): game prompts, rendered in jit
    table, lens = token_bytes(tok)    # [V, K], [V]: LM id -> its ASCII bytes: generated answers, parsed in jit
    table = id_table(CharTokenizer(), tok)   # task id -> LM id (``evaluation.TaskView``)

The presets' tokenizer: ids ``0..7`` are the special tokens ``<pad> <bos> <eos> <think> </think>
<answer> </answer> <unk>`` (the character tokenizer's, same ids), ids ``8..263`` are bytes (byte ``b``
-> ``b + 8``). Why bytes and not the tasks' character tokenizer: the game text needs characters
(``\\``, ``{``, ``|``, newline) that it does not have. Nothing here is a global vocabulary: the
experiment constructs the tokenizer and hands it to ``LMGame.make``, ``warm_start``,
``SpiralTrainer`` and the evaluation.

Any other tokenizer works when it spells every character of the game text as one token, e.g. a
checkpoint's byte-level BPE (Qwen2/3, Llama 3, DeepSeek-V3: every ASCII byte is a token):

- Prompts (``byte_ids``): the games render text as bytes in jit (``envs/games/text.py``), mapped to
  the LM id of each byte alone (``Tokenizer.char_ids``: ``tokenizer.encode(chr(b))``). A prompt therefore
  reaches the LM spelled one token per character: a valid id sequence, though not the tokenizer's canonical one
  (``"Your card"`` is 9 ids, not 2), after the tokenizer's bos (a Qwen tokenizer names none:
  ``HFTokenizer`` falls back to ``<|im_start|>``); no chat template is applied. ``check_text`` raises
  one ValueError naming the tokenizer and the first character of a game's text that is not a single token.
- Answers (``token_bytes``): each id maps to the ASCII bytes it decodes to (at most ``K`` of them,
  ``K <= MAX_TOKEN_BYTES``), so the canonical tokenization of ``\\boxed{bet}`` (``\\``, ``boxed``, ``{``,
  ``bet``, ``}``) parses exactly as its one-token-per-byte spelling; the response's bytes are
  concatenated in jit before the parser reads them. Special tokens, tokens that decode to non-ASCII
  text (or a partial UTF-8 byte) and tokens longer than ``MAX_TOKEN_BYTES`` become one unknown byte (-1),
  which matches nothing: an answer containing one inside ``\\boxed{...}`` does not parse (a forfeit).
  Ids beyond the tokenizer's vocabulary (a model's unused rows) are unknown too. The tables assume
  that a token decodes to the same text alone as in context (true for byte-level BPE; not for
  SentencePiece's ``"▁"`` prefixes).

For the ``ByteTokenizer`` the tables are exactly ``byte + n_special`` and ``id - n_special`` (K = 1),
the ids of the presets.
"""

from __future__ import annotations

import functools

import numpy as np

from jaxrl_reason.models.tokenizer import ByteTokenizer, Tokenizer

MAX_TOKEN_BYTES = 16  # longer tokens (runs of spaces or dashes in a large BPE) parse as one unknown byte
UNKNOWN = -1  # the byte of a token with no ASCII spelling: equals no character


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)  # cached: shared by every caller
    return a


def spiral_tokenizer() -> ByteTokenizer:
    """The presets' LM tokenizer: the 7 default special tokens and ``<unk>`` (ids 0..7), then 256 bytes."""
    return ByteTokenizer(extra_special=("<unk>",))


def byte_offset(tokenizer: Tokenizer) -> int:
    """The id of byte 0 of a ``ByteTokenizer`` (its game text ids are ``byte + offset``); ValueError otherwise."""
    if not isinstance(tokenizer, ByteTokenizer):
        raise ValueError(f"byte_offset needs a ByteTokenizer, got {type(tokenizer).__name__} (use byte_ids)")
    return tokenizer.n_special


@functools.lru_cache(maxsize=16)
def byte_ids(tokenizer: Tokenizer) -> np.ndarray:
    """``[256]`` int32: byte ``b`` -> the id that spells ``chr(b)`` alone, -1 where no single token does
    (``Tokenizer.char_ids``; bytes >= 128 always -1, except for a ``ByteTokenizer``: the game text is ASCII)."""
    if isinstance(tokenizer, ByteTokenizer):
        return _frozen(np.arange(256, dtype=np.int32) + tokenizer.n_special)
    out = np.full(256, -1, np.int32)
    out[:128] = tokenizer.char_ids()
    return _frozen(out)


def check_text(tokenizer: Tokenizer, text: str, what: str = "SPIRAL game text") -> None:
    """ValueError naming ``tokenizer`` and the first character of ``text`` that is not one token."""
    table = byte_ids(tokenizer)
    for ch in text:
        if ord(ch) >= 256 or table[ord(ch)] < 0:
            raise ValueError(
                f"{type(tokenizer).__name__} (vocab {tokenizer.vocab_size}) does not spell {ch!r} (in the {what}) as "
                "one token: SPIRAL renders game text one token per character, so every character of it must be a "
                "single token (as in a byte-level BPE tokenizer)")


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


def id_table(src: Tokenizer, dst: Tokenizer) -> np.ndarray:
    """``src`` id -> ``dst`` id for ``src`` ids ``0..K-1``, int32 ``[K]``.

    Each id is a special token of ``src`` (mapped to the same special token of ``dst``) or one character
    (mapped to ``dst``'s single id of that character); ``K`` is the first id that is neither (for the
    character tokenizer: its 10 unused ids at the end, so ``K = 86``). ValueError when ``dst`` lacks a
    special token of ``src`` or spells a character with several ids."""
    specials = set(src.control_tokens)
    table = []
    for i in range(src.vocab_size):
        s = src.decode([i])
        if s in specials and src.token_to_id(s) == i:
            try:
                table.append(dst.token_to_id(s))
            except KeyError:
                raise ValueError(f"{type(dst).__name__} has no special token {s!r} (id {i} of the "
                                 f"{type(src).__name__})") from None
        elif len(s) == 1 and src.encode(s) == [i]:
            ids = dst.encode(s)
            if len(ids) != 1:
                raise ValueError(f"{type(dst).__name__} spells {s!r} with {len(ids)} ids, need one")
            table.append(ids[0])
        else:
            break
    return np.asarray(table, np.int32)
