"""The SPIRAL language model's tokenizer, the check that it spells the game text, and the adapter to the
reasoning tasks' tokenizer. The per-byte tables that render and parse game text in its ids inside jit are
the tokenizer package's (``models.tokenizer.spelled``: ``byte_ids``, ``token_bytes``).

    tok = spiral_tokenizer()          # ByteTokenizer(extra_special=("<unk>",)): 264 ids (the presets)
    byte_ids(tok)                     # [256] byte -> LM id (here byte + 8): game prompts, rendered in jit
    table, lens = token_bytes(tok)    # [V, K], [V]: LM id -> its ASCII bytes: generated answers, parsed in jit
    table = id_table(CharTokenizer(), tok)   # task id -> LM id (``evaluation.TaskView``)

The presets' tokenizer: ids ``0..7`` are the special tokens ``<pad> <bos> <eos> <think> </think>
<answer> </answer> <unk>`` (the character tokenizer's, same ids), ids ``8..263`` are bytes (byte ``b``
-> ``b + 8``). Why bytes and not the tasks' character tokenizer: the game text needs characters
(``\\``, ``{``, ``|``, newline) that it does not have. Nothing here is a global vocabulary: the
experiment constructs the tokenizer and hands it to ``LMGame.make``, ``warm_start``,
``spiral_learner`` and the evaluation.

Any other tokenizer works when it spells every character of the game text as one token, e.g. a
checkpoint's byte-level BPE (Qwen2/3, Llama 3, DeepSeek-V3: every ASCII byte is a token):

- Prompts (``byte_ids``): the games render text as bytes in jit (``envs/games/text.py``), mapped to
  the LM id of each byte alone (``Tokenizer.char_ids``: ``tokenizer.encode(chr(b))``). A prompt therefore
  reaches the LM spelled one token per character: a valid id sequence, though not the tokenizer's canonical one
  (``"Your card"`` is 9 ids, not 2), after the tokenizer's bos (a Qwen tokenizer names none:
  ``HFTokenizer`` falls back to ``<|im_start|>``); no chat template is applied. ``check_text`` raises
  one ValueError naming the tokenizer and the first character of a game's text that is not a single token.
- Answers (``token_bytes``): each id maps to the ASCII bytes it decodes to, so the canonical tokenization
  of ``\\boxed{bet}`` parses exactly as its one-token-per-byte spelling; the response's bytes are
  concatenated in jit before the parser reads them. A token with no ASCII spelling (a special token, say)
  is one unknown byte, which matches nothing: an answer containing one inside ``\\boxed{...}`` does not
  parse (a forfeit).

For the ``ByteTokenizer`` the tables are exactly ``byte + n_special`` and ``id - n_special`` (K = 1),
the ids of the presets.
"""

from __future__ import annotations

import numpy as np

from jaxrl_reason.models.tokenizer import ByteTokenizer, Tokenizer, byte_ids


def spiral_tokenizer() -> ByteTokenizer:
    """The presets' LM tokenizer: the 7 default special tokens and ``<unk>`` (ids 0..7), then 256 bytes."""
    return ByteTokenizer(extra_special=("<unk>",))


def check_text(tokenizer: Tokenizer, text: str, what: str = "SPIRAL game text") -> None:
    """ValueError naming ``tokenizer`` and the first character of ``text`` that is not one token."""
    table = byte_ids(tokenizer)
    for ch in text:
        if ord(ch) >= 256 or table[ord(ch)] < 0:
            raise ValueError(
                f"{type(tokenizer).__name__} (vocab {tokenizer.vocab_size}) does not spell {ch!r} (in the {what}) as "
                "one token: SPIRAL renders game text one token per character, so every character of it must be a "
                "single token (as in a byte-level BPE tokenizer)")


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
