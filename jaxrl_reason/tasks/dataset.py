"""The synthetic tasks as prompt data (``data.PromptSource``): an infinite source of fresh problems for the GRPO
trainer (`TaskDataset`), and rows to write as a dataset file (`task_rows`).

    tds = TaskDataset(tasks, tokenizer, prompt_len=24, seed=0)   # sample(step, n) as data.PromptDataset's
    write_jsonl(task_rows(tasks, 1000, seed=0), "demo.jsonl")   # a synthetic task as a dataset file

Batches depend only on (seed, step): a resumed run draws the same prompts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from jaxrl_reason.data.datasets import check_draw
from jaxrl_reason.data.loading import DataError
from jaxrl_reason.data.prompts import PromptFormat, render_prompt
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.tasks.base import Problem, prompt_ids, sample_problems

#: the seed stream of `task_rows`: 3-element seeds never collide with the trainer's [seed, step]
#: (nor with rl.grpo.recipes' SFT (2**31 - 1, 11) and held-out (2**31 - 1, 13) streams)
TASK_ROWS_STREAM = (2**31 - 1, 17)


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
        check_draw(step, n)
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
