"""Prompt sources for GRPO: one interface (`PromptSource`), and a finite dataset of rows on it (`PromptDataset`; the
synthetic tasks as an infinite one are ``tasks.TaskDataset``):

    rows, ids, lens = source.sample(step, n)   # list[dict] [n]; np.int32 [n, prompt_len] right-padded; [n]
    texts = source.prompt_strings(rows)        # the prompt text of each sampled row (reward functions)
    source.prompt_len, source.finite, source.dropped

Batches depend only on (seed, step): a resumed run draws the same prompts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from jaxrl_reason.data.loading import DataError, require_fields
from jaxrl_reason.data.prompts import PromptFormat, render_prompt
from jaxrl_reason.models.tokenizer import Tokenizer

log = logging.getLogger(__name__)

class PromptSource(Protocol):
    """What the GRPO trainer draws prompts from."""

    prompt_len: int  # static width of the prompt ids
    finite: bool  # True: has __len__ (epochs); False: fresh problems every step
    dropped: int  # rows dropped for being longer than prompt_len

    def sample(self, step: int, n: int) -> tuple[list[dict], np.ndarray, np.ndarray]: ...

    def prompt_strings(self, rows: Sequence[Mapping]) -> list[str]: ...


def check_draw(step: int, n: int) -> None:
    """A `PromptSource.sample` call's arguments: raise ``DataError`` unless step >= 0 and n >= 1."""
    if step < 0 or n < 1:
        raise DataError(f"sample(step={step}, n={n}): need step >= 0 and n >= 1")


class PromptDataset:
    """Rows of a dataset rendered once into prompt ids; prompts longer than ``max_prompt_len`` are dropped
    (counted in ``dropped`` and logged), never cut. ``sample(step, n)`` takes positions
    [step*n, (step+1)*n) of the stream of epoch permutations ``default_rng([seed, epoch]).permutation(len)``,
    so every row appears once per epoch and any step can be recomputed alone. ``fit=True``: ``prompt_len`` is the
    longest kept prompt (``max_prompt_len`` is then the cap), else ``max_prompt_len``."""

    finite = True

    def __init__(self, rows: Sequence[Mapping], tokenizer: Tokenizer, prompt_field: str = "prompt",
                 max_prompt_len: int = 256, fmt: PromptFormat | None = None, seed: int = 0,
                 required_fields: Sequence[str] = (), source: str = "dataset", fit: bool = False):
        fmt = PromptFormat() if fmt is None else fmt
        if max_prompt_len < 1:
            raise DataError(f"max_prompt_len must be >= 1, got {max_prompt_len}")
        if not rows:
            raise DataError(f"{source} has no rows")
        require_fields(rows, (prompt_field, *required_fields), source)
        texts, ids = [], []
        for i, row in enumerate(rows):
            try:
                text, row_ids = render_prompt(tokenizer, row, prompt_field, fmt)
            except ValueError as e:
                raise DataError(f"{source}: row {i} (0-based): {e}") from e
            if not row_ids:
                raise DataError(f"{source}: row {i} (0-based) renders to an empty prompt")
            texts.append(text)
            ids.append(row_ids)
        lengths = np.asarray([len(x) for x in ids])
        keep = np.flatnonzero(lengths <= max_prompt_len)
        self.dropped = len(rows) - len(keep)
        if not len(keep):
            raise DataError(f"{source}: all {len(rows)} prompts were longer than max_prompt_len={max_prompt_len} "
                             f"tokens (the shortest has {lengths.min()})")
        if self.dropped:
            log.warning("%s: dropped %d of %d prompts longer than max_prompt_len=%d tokens (the longest has %d)",
                        source, self.dropped, len(rows), max_prompt_len, lengths.max())
        width = int(lengths[keep].max()) if fit else max_prompt_len
        self.tokenizer, self.seed, self.prompt_len, self.source = tokenizer, seed, width, source
        self.rows = [rows[i] for i in keep]
        self._texts = [texts[i] for i in keep]
        self._text_of = {id(r): t for r, t in zip(self.rows, self._texts)}
        self._lens = lengths[keep].astype(np.int32)
        self._starts = np.concatenate([[0], np.cumsum(self._lens)[:-1]]).astype(np.int64)
        self._tokens = np.fromiter((t for i in keep for t in ids[i]), np.int32, int(self._lens.sum()))
        self._perms: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) >= 2:  # a batch spans at most two epochs unless n > len
                self._perms.pop(next(iter(self._perms)))
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(len(self))
        return self._perms[epoch]

    def indices(self, step: int, n: int) -> np.ndarray:
        """Kept-row indices [n] of batch ``step`` (int64)."""
        check_draw(step, n)
        epoch, offset = np.divmod(step * n + np.arange(n, dtype=np.int64), len(self))
        out = np.empty(n, np.int64)
        for e in np.unique(epoch):
            sel = epoch == e
            out[sel] = self._permutation(int(e))[offset[sel]]
        return out

    def ids(self, idx) -> tuple[np.ndarray, np.ndarray]:
        """Prompt ids of kept rows ``idx`` [n]: (np.int32 [n, prompt_len] right-padded with pad_id, lens [n])."""
        idx = np.asarray(idx, np.int64)
        lens = self._lens[idx]
        col = np.arange(self.prompt_len)
        inside = col[None] < lens[:, None]
        pos = np.minimum(self._starts[idx][:, None] + col[None], len(self._tokens) - 1)
        return np.where(inside, self._tokens[pos], np.int32(self.tokenizer.pad_id)).astype(np.int32), lens

    def sample(self, step: int, n: int) -> tuple[list[dict], np.ndarray, np.ndarray]:
        """Batch ``step``: (the row dicts [n], ids np.int32 [n, prompt_len], lens np.int32 [n])."""
        idx = self.indices(step, n)
        return [self.rows[i] for i in idx.tolist()], *self.ids(idx)

    def prompt_text(self, i: int) -> str:
        """The rendered prompt of kept row ``i``."""
        return self._texts[i]

    def prompt_strings(self, rows: Sequence[Mapping]) -> list[str]:
        """The rendered prompt of each row returned by `sample` (the same dict objects)."""
        try:
            return [self._text_of[id(r)] for r in rows]
        except KeyError:
            raise DataError("prompt_strings takes the row dicts returned by sample (not copies)") from None
