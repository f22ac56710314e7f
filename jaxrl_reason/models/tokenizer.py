"""Tokenizers with one interface: a byte-level tokenizer with reserved special tokens (synthetic
tasks) and `tokenizer.json` files loaded through the `tokenizers` library (real checkpoints).

    tok = ByteTokenizer()                       # or HFTokenizer.from_file("tokenizer.json")
    ids = tok.encode("<think>2+2</think>")      # list[int]; special-token strings map to one id
    batch, lens = tok.encode_batch(texts, max_len=64)   # right-padded np.int32 [B, T], [B]
    prompt = tok.chat_prompt("What is 2+2?")    # R1-style template, ends with "<think>"
    stop = tok.ids_array(["</answer>", tok.eos])  # jnp int32 ids for use inside jit

ByteTokenizer ids: 0..n_special-1 are the special tokens (pad=0, bos, eos, <think>, </think>,
<answer>, </answer>, then `extra_special`), followed by the 256 byte values.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

R1_SYSTEM = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process in the mind and then provides the User with "
    "the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
    "</answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>."
)
DEFAULT_SPECIAL = ("<pad>", "<bos>", "<eos>", "<think>", "</think>", "<answer>", "</answer>")


class Tokenizer:
    """Shared behaviour; subclasses give `encode`, `decode`, `vocab_size`, `token_to_id`, pad/bos/eos."""

    pad: str
    bos: str
    eos: str

    vocab_size: int

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        raise NotImplementedError

    def token_to_id(self, token: str) -> int:
        raise NotImplementedError

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

    def encode_batch(self, texts: Sequence[str], max_len: int, add_bos: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Right-padded ids [B, max_len] int32 and lengths [B]; raises if a text is too long."""
        out = np.full((len(texts), max_len), self.pad_id, np.int32)
        lens = np.zeros(len(texts), np.int32)
        for i, t in enumerate(texts):
            ids = ([self.bos_id] if add_bos else []) + self.encode(t)
            if len(ids) > max_len:
                raise ValueError(f"text {i} has {len(ids)} tokens > max_len {max_len}")
            out[i, : len(ids)], lens[i] = ids, len(ids)
        return out, lens

    def decode_batch(self, ids: np.ndarray, lengths: np.ndarray | None = None, skip_special: bool = True) -> list[str]:
        ids = np.asarray(ids)
        lengths = np.full(len(ids), ids.shape[1]) if lengths is None else np.asarray(lengths)
        return [self.decode(row[:n].tolist(), skip_special) for row, n in zip(ids, lengths)]

    def chat_prompt(self, question: str, system: str = R1_SYSTEM) -> str:
        """DeepSeek-R1-Zero template; generation continues after the opening <think>."""
        return f"{system} User: {question} Assistant: <think>"


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes + reserved special tokens; vocab_size = n_special + 256."""

    def __init__(self, extra_special: Sequence[str] = ()):
        self.special = tuple(DEFAULT_SPECIAL) + tuple(extra_special)
        if len(set(self.special)) != len(self.special):
            raise ValueError(f"duplicate special tokens in {self.special}")
        self._sid = {s: i for i, s in enumerate(self.special)}
        self._split = re.compile("(" + "|".join(re.escape(s) for s in sorted(self.special, key=len, reverse=True)) + ")")
        self.pad, self.bos, self.eos = "<pad>", "<bos>", "<eos>"
        self.n_special = len(self.special)
        self.vocab_size = self.n_special + 256

    def token_to_id(self, token: str) -> int:
        if token not in self._sid:
            raise KeyError(f"{token!r} is not a special token of this ByteTokenizer")
        return self._sid[token]

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part in self._split.split(text):
            if part in self._sid:
                ids.append(self._sid[part])
            elif part:
                ids.extend(b + self.n_special for b in part.encode("utf-8"))
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        out, buf = [], bytearray()
        for i in ids:
            if i >= self.n_special:
                buf.append(i - self.n_special)
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf = bytearray()
            if not skip_special:
                out.append(self.special[i])
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)


class HFTokenizer(Tokenizer):
    """A `tokenizer.json` through the `tokenizers` library; pad/bos/eos names given or guessed."""

    def __init__(self, tk, pad: str | None = None, bos: str | None = None, eos: str | None = None):
        self.tk = tk
        vocab = tk.get_vocab(with_added_tokens=True)

        def pick(given, *cands):
            for c in ((given,) if given else cands):
                if c in vocab:
                    return c
            raise ValueError(f"none of {(given,) if given else cands} is in the tokenizer vocabulary")

        self.eos = pick(eos, "<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
        self.bos = pick(bos, "<|im_start|>", "<s>", "<|begin_of_text|>", "<bos>", self.eos)
        self.pad = pick(pad, "<|endoftext|>", "<pad>", "<unk>", self.eos)
        self.vocab_size = tk.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_file(cls, path, **kw) -> "HFTokenizer":
        from tokenizers import Tokenizer as _Tk

        return cls(_Tk.from_file(str(path)), **kw)

    def token_to_id(self, token: str) -> int:
        i = self.tk.token_to_id(token)
        if i is None:
            raise KeyError(f"{token!r} is not in the tokenizer vocabulary")
        return i

    def encode(self, text: str) -> list[int]:
        return self.tk.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=skip_special)
