"""Character vocabulary shared by the verifiable tasks, with the R1 tags as single tokens.

Why our own: the tasks must encode prompts and decode answers on token ids inside jit, so they need
a fixed, tiny vocabulary whose ids are known statically. A character vocabulary keeps every task's
prompt, reasoning trace and answer spellable, and the four R1 tags are single special tokens so a
tiny model can produce the ``<think>..</think><answer>..</answer>`` format cheaply.

    V = VOCAB
    ids = V.encode("3+4=")            # list[int]
    V.decode(ids) == "3+4="
    V.size                           # 96 (fits LMConfig.vocab_size)
"""

from __future__ import annotations

import dataclasses

import numpy as np

SPECIALS = ("<pad>", "<bos>", "<eos>", "<think>", "</think>", "<answer>", "</answer>", "<unk>")
CHARS = "0123456789+-*/=()<>,.:;?! " + "abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclasses.dataclass(frozen=True)
class CharVocab:
    size: int = 96
    pad: int = 0
    bos: int = 1
    eos: int = 2
    think: int = 3
    think_end: int = 4
    answer: int = 5
    answer_end: int = 6
    unk: int = 7

    def tokens(self) -> tuple[str, ...]:
        return SPECIALS + tuple(CHARS)

    def encode(self, text: str) -> list[int]:
        """Characters -> ids; the tag strings '<think>' etc. become their single special ids."""
        table = {c: i + len(SPECIALS) for i, c in enumerate(CHARS)}
        out, i = [], 0
        while i < len(text):
            for j, tag in enumerate(SPECIALS[:7]):
                if tag != "<pad>" and text.startswith(tag, i):
                    out.append(j)
                    i += len(tag)
                    break
            else:
                out.append(table.get(text[i], self.unk))
                i += 1
        return out

    def decode(self, ids, stop_at_pad: bool = True) -> str:
        toks = self.tokens()
        out = []
        for t in np.asarray(ids).tolist():
            if t == self.pad and stop_at_pad:
                break
            out.append(toks[t] if 0 <= t < len(toks) else "<unk>")
        return "".join(out)

    def check_model(self, model_cfg, seq_len: int, owner: str) -> None:
        """ValueError unless a model (``LMConfig``) holds ``seq_len`` tokens of this vocabulary."""
        if seq_len > model_cfg.max_seq_len:
            raise ValueError(f"{owner}: a sequence needs {seq_len} tokens > the model's window "
                             f"max_seq_len={model_cfg.max_seq_len}")
        if model_cfg.vocab_size < self.size:
            raise ValueError(f"{owner}: model vocab_size {model_cfg.vocab_size} < character vocabulary size {self.size}")

    def pad_batch(self, seqs: list[list[int]], length: int) -> tuple[np.ndarray, np.ndarray]:
        """Right-pad to ``length`` -> (ids [B, length] int32, lengths [B] int32); too long raises."""
        arr = np.full((len(seqs), length), self.pad, np.int32)
        lens = np.zeros(len(seqs), np.int32)
        for i, s in enumerate(seqs):
            if len(s) > length:
                raise ValueError(f"sequence of {len(s)} tokens does not fit the padded length {length}: {self.decode(s)!r}")
            arr[i, : len(s)] = s
            lens[i] = len(s)
        return arr, lens


VOCAB = CharVocab()
assert len(VOCAB.tokens()) <= VOCAB.size
