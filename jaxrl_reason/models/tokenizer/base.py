"""The ``Tokenizer`` base class every tokenizer of the package derives from: subclasses give ``encode``,
``decode``, ``token_to_id``, ``vocab_size``, pad/bos/eos, ``control_tokens`` and ``special_tokens_map``;
the rest is shared: the ids of named and R1 tokens, text spelled one token per character, sampler stops,
padded batches, model checks, and the chat methods (``chat.ChatTemplates``).

    ids = tok.encode("2+2 <answer>")            # list[int]; text from data stays text: "<answer>" is plain text
    batch, lens = tok.encode_batch(texts, max_len=64)   # right-padded np.int32 [B, T], [B]
    stop = tok.ids_array(["</answer>", tok.eos])  # jnp int32 ids for use inside jit
    tags = tok.tag_ids()                        # single-token R1 tags for in-jit parsing (ValueError if not)
    stop_tokens, stop_seqs = tok.stops(["</answer>"])   # eos + the strings, as the sampler takes them
    ids = tok.spell("7*2=14")                   # one token per character (char_ids), for jitted readers
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxrl_reason.models.tokenizer.chat import ChatTemplates

DEFAULT_SPECIAL = ("<pad>", "<bos>", "<eos>", "<think>", "</think>", "<answer>", "</answer>")
R1_TAGS = DEFAULT_SPECIAL[3:7]  # <think> </think> <answer> </answer>


class TagIds(NamedTuple):
    """Ids of the four R1 tags when each is one token (in-jit response parsing, `tasks.verify`)."""

    think: int
    think_end: int
    answer: int
    answer_end: int


class Tokenizer(ChatTemplates):
    """Shared behaviour; subclasses give `encode`, `decode`, `vocab_size`, `token_to_id`, pad/bos/eos,
    `control_tokens` and `special_tokens_map` (the named tokens a chat template sees)."""

    pad: str
    bos: str
    eos: str

    vocab_size: int
    add_bos_token: bool = False
    chat_template: str | dict[str, str] | None = None
    special_tokens_map: dict[str, str]

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        """Ids of `text`; special-token strings are plain text unless `allow_special`."""
        raise NotImplementedError

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        raise NotImplementedError

    def token_to_id(self, token: str) -> int:
        raise NotImplementedError

    @property
    def control_tokens(self) -> tuple[str, ...]:
        """Token strings that must never come from data (encoded as text inside chat messages)."""
        raise NotImplementedError

    # ---- ids ----

    @property
    def pad_id(self) -> int:
        return self.token_to_id(self.pad)

    @property
    def bos_id(self) -> int:
        return self.token_to_id(self.bos)

    @property
    def eos_id(self) -> int:
        return self.token_to_id(self.eos)

    def ids_array(self, tokens: Sequence[str]) -> jnp.ndarray:
        """Special-token strings -> int32 id array (stop tokens, reward markers inside jit)."""
        return jnp.asarray([self.token_to_id(t) for t in tokens], jnp.int32)

    def single_token_id(self, text: str) -> int | None:
        """The id of ``text`` when it is one token of this vocabulary (special or not), else None."""
        try:
            return self.token_to_id(text)
        except KeyError:
            ids = self.encode(text)
            return ids[0] if len(ids) == 1 else None

    def tag_ids(self) -> TagIds:
        """The R1 tags' ids; ValueError when one is not a single token (parse decoded text instead)."""
        ids = [self.single_token_id(t) for t in R1_TAGS]
        missing = [t for t, i in zip(R1_TAGS, ids) if i is None]
        if missing:
            raise ValueError(f"{type(self).__name__}: the R1 tags {missing} are not single tokens; token-level "
                             "parsing needs them (use the text rewards of jaxrl_reason.rewards instead)")
        return TagIds(*ids)

    # ---- text spelled one token per character ----

    def char_ids(self) -> np.ndarray:
        """Text spelled one token per character: ``[128]`` int32 (read-only), entry ``b`` the id of ``chr(b)``
        when ``encode(chr(b))`` is one id that decodes back to ``chr(b)``, else -1 (an unknown token, a
        character of several tokens). Computed once per tokenizer. With our character-level tokenizers the
        entries are their own ids; with a byte-level BPE (Qwen2/3, Llama 3, DeepSeek-V3) text spelled through
        it (``spell``) is a valid id sequence, though not the canonical (merged) tokenization -- what jitted
        code that reads or writes one token per character needs."""
        return self._char_ids

    @functools.cached_property
    def _char_ids(self) -> np.ndarray:
        table = np.full(128, -1, np.int32)
        for b in range(128):
            ids = self.encode(chr(b))
            if len(ids) == 1 and self.decode(ids) == chr(b):
                table[b] = ids[0]
        table.setflags(write=False)  # cached: shared by every caller
        return table

    @functools.cached_property
    def _char_list(self) -> list[int]:
        return self._char_ids.tolist()

    def spell(self, text: str, strict: bool = True) -> list[int]:
        """``text`` one token per character (``char_ids``). A character that is not a single token decoding
        back to itself (every non-ASCII character): ValueError naming this tokenizer and the first such
        character, or with ``strict=False`` its ``encode`` (``spelled.SpelledTokenizer``)."""
        table, ids = self._char_list, []
        for ch in text:
            i = table[ord(ch)] if ord(ch) < 128 else -1
            if i >= 0:
                ids.append(i)
            elif not strict:
                ids.extend(self.encode(ch))
            else:
                raise ValueError(f"{type(self).__name__} (vocab_size {self.vocab_size}) does not encode {ch!r} as a "
                                 f"single token that decodes back to it (encode gives {self.encode(ch)})")
        return ids

    # ---- batches, stops, models ----

    def stops(self, texts: Sequence[str] = ()) -> tuple[jnp.ndarray, jnp.ndarray | None]:
        """Sampler stops for eos and ``texts``: (stop_tokens int32 [S], stop_sequences int32 [Q, L] or None).

        A text that is one token becomes a stop token; a longer one a stop sequence of its plain-text ids
        (`models.lm.sampler.stop_sequence_array`; matched on ids, so a different tokenization of the
        same text does not stop)."""
        from jaxrl_reason.models.lm.sampler import stop_sequence_array

        single = [self.single_token_id(t) for t in texts]
        tokens = [self.eos_id] + [i for i in single if i is not None]
        multi = [t for t, i in zip(texts, single) if i is None]
        seqs = stop_sequence_array(multi, encode=self.encode) if multi else None
        return jnp.asarray(sorted(set(tokens)), jnp.int32), seqs

    def pad_batch(self, seqs: Sequence[Sequence[int]], length: int) -> tuple[np.ndarray, np.ndarray]:
        """Id lists right-padded with pad to ``length`` -> (ids [B, length] int32, lengths [B] int32); too long
        raises."""
        arr = np.full((len(seqs), length), self.pad_id, np.int32)
        lens = np.zeros(len(seqs), np.int32)
        for i, s in enumerate(seqs):
            if len(s) > length:
                raise ValueError(f"sequence of {len(s)} tokens does not fit the padded length {length}: "
                                 f"{self.decode(s)!r}")
            arr[i, : len(s)] = s
            lens[i] = len(s)
        return arr, lens

    def check_model(self, model_cfg, seq_len: int, owner: str) -> None:
        """ValueError unless a model (``LMConfig``) holds ``seq_len`` tokens of this vocabulary."""
        if seq_len > model_cfg.max_seq_len:
            raise ValueError(f"{owner}: a sequence needs {seq_len} tokens > the model's window "
                             f"max_seq_len={model_cfg.max_seq_len}")
        if model_cfg.vocab_size < self.vocab_size:
            raise ValueError(f"{owner}: model vocab_size {model_cfg.vocab_size} < the tokenizer's {self.vocab_size}")

    def encode_batch(self, texts: Sequence[str], max_len: int, add_bos: bool | None = None,
                     allow_special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Right-padded ids [B, max_len] int32 and lengths [B]; `add_bos=None` follows `add_bos_token`."""
        add_bos = self.add_bos_token if add_bos is None else add_bos
        return self.pad_batch([([self.bos_id] if add_bos else []) + self.encode(t, allow_special) for t in texts],
                              max_len)

    def decode_batch(self, ids: np.ndarray, lengths: np.ndarray | None = None, skip_special: bool = True) -> list[str]:
        ids = np.asarray(ids)
        lengths = np.full(len(ids), ids.shape[1]) if lengths is None else np.asarray(lengths)
        return [self.decode(row[:n].tolist(), skip_special) for row, n in zip(ids, lengths)]

    def decode_completions(self, tokens: np.ndarray, lengths: np.ndarray) -> list[str]:
        """Sampled responses [B, N] (lengths [B], stop token included) -> text with control tokens kept
        (``<answer>``, ``<|im_end|>``: what reward functions parse), except a final eos."""
        out = []
        for row, n in zip(np.asarray(tokens), np.asarray(lengths)):
            ids = row[:n].tolist()
            out.append(self.decode(ids[:-1] if ids and ids[-1] == self.eos_id else ids))
        return out
