"""Prompt sources for GRPO: a finite dataset of rows (`PromptDataset`) and the synthetic tasks as an
infinite one (`TaskDataset`), with one interface (`PromptSource`):

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
from jaxrl_reason.tasks.base import Problem, prompt_ids, sample_problems

log = logging.getLogger(__name__)

#: the seed stream of `task_rows`: 3-element seeds never collide with the trainer's [seed, step]
#: (nor with rl.grpo.recipes' SFT (2**31 - 1, 11) and held-out (2**31 - 1, 13) streams)
TASK_ROWS_STREAM = (2**31 - 1, 17)


class PromptSource(Protocol):
    """What the GRPO trainer draws prompts from."""

    prompt_len: int  # static width of the prompt ids
    finite: bool  # True: has __len__ (epochs); False: fresh problems every step
    dropped: int  # rows dropped for being longer than prompt_len

    def sample(self, step: int, n: int) -> tuple[list[dict], np.ndarray, np.ndarray]: ...

    def prompt_strings(self, rows: Sequence[Mapping]) -> list[str]: ...


def _check_draw(step: int, n: int) -> None:
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
        _check_draw(step, n)
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


def _problem_row(p: Problem, with_trace: bool = True) -> dict:
    row = {"prompt": p.prompt, "answer": p.answer, "trace": p.trace, "task": p.task, "difficulty": int(p.difficulty)}
    if not with_trace:
        del row["trace"]
    return row


def _task_list(tasks) -> list:
    return [tasks] if not isinstance(tasks, (list, tuple)) else list(tasks)


def _task_weights(tasks: list, weights) -> np.ndarray:
    weights = np.ones(len(tasks)) if weights is None else np.asarray(weights, np.float64)
    if weights.shape != (len(tasks),) or (weights < 0).any() or weights.sum() <= 0:
        raise DataError(f"weights {weights.tolist()} must be {len(tasks)} non-negative numbers, not all zero")
    return weights


class TaskDataset:
    """The synthetic tasks as an infinite prompt source: ``sample(step, n)`` draws exactly the problems of
    ``tasks.base.make_batch(tasks, default_rng([seed, step]), n, ...)`` and encodes ``<bos> + prompt`` with
    ``tokenizer`` (or, with ``fmt``, the prompt rendered by ``render_prompt``, e.g. through a checkpoint's
    chat template), right-padded to ``prompt_len`` (a longer prompt raises). Rows: prompt, answer, wrong,
    trace, task, task_id, difficulty, the `Problem` itself under "problem" and, with ``fmt``, "rendered_prompt"."""

    finite = False
    dropped = 0

    def __init__(self, tasks, tokenizer: Tokenizer, prompt_len: int, weights=None, seed: int = 0,
                 difficulty: int | None = None, fmt: PromptFormat | None = None):
        self.tasks = _task_list(tasks)
        self.weights = _task_weights(self.tasks, weights)
        self.tokenizer, self.prompt_len, self.seed, self.difficulty = tokenizer, prompt_len, seed, difficulty
        self.fmt = fmt

    def sample(self, step: int, n: int) -> tuple[list[dict], np.ndarray, np.ndarray]:
        """Batch ``step``: (rows [n], ids np.int32 [n, prompt_len], lens np.int32 [n])."""
        _check_draw(step, n)
        rng = np.random.default_rng([self.seed, step])
        problems, task_ids = sample_problems(self.tasks, self.weights, rng, n, self.difficulty)
        rows = [{**_problem_row(p), "wrong": p.wrong, "task_id": int(t), "problem": p}
                for p, t in zip(problems, task_ids.tolist())]
        if self.fmt is None:
            seqs = [prompt_ids(self.tokenizer, p) for p in problems]
        else:  # rendered once: the ids for the sampler, the text (row "rendered_prompt") for reward functions
            rendered = [render_prompt(self.tokenizer, r, "prompt", self.fmt) for r in rows]
            seqs = [ids for _, ids in rendered]
            for r, (text, _) in zip(rows, rendered):
                r["rendered_prompt"] = text
        ids, lens = self.tokenizer.pad_batch(seqs, self.prompt_len)
        return rows, ids, lens

    def prompt_strings(self, rows: Sequence[Mapping]) -> list[str]:
        """The prompt text of each sampled row: the problem text (without <bos>), or rendered with ``fmt``."""
        return [r["rendered_prompt"] if self.fmt is not None else r["prompt"] for r in rows]


def task_rows(tasks, n: int, seed: int, weights=None, with_trace: bool = True) -> list[dict]:
    """``n`` JSON-serialisable rows {prompt, answer, trace (with_trace), task, difficulty} of synthetic
    problems (to export a task as a dataset file), drawn from the `TASK_ROWS_STREAM` of ``seed``."""
    tasks = _task_list(tasks)
    rng = np.random.default_rng([seed, *TASK_ROWS_STREAM])
    problems, _ = sample_problems(tasks, _task_weights(tasks, weights), rng, n)
    return [_problem_row(p, with_trace) for p in problems]
