"""Evaluation of a policy LM on the synthetic tasks' held-out problems: greedy accuracy (overall, per task, per
difficulty), unbiased pass@k (k = 1..64; the estimator ``rewards.evaluation.pass_at_k``) and the partial-prompt
contamination probe. Evaluation of your own data (an eval file, your reward functions) is
``rewards.evaluation.reward_eval``.

    greedy_eval(model, tasks, batch, max_new_tokens, tok)          -> {"accuracy", "format_rate", "by_difficulty", ...}
    pass_at_k_eval(model, tasks, batch, tok, n=64, ks=(1, 8, 64))  -> {"pass@1": .., "pass@8": .., per task}
    contamination_probe(model, problems, tok, fraction=0.6)        -> {"completion_exact", "answer_accuracy"}

``tok``: the tokenizer the batch was made with (``models.tokenizer``; R1 tags as single tokens).

pass@k uses the unbiased estimator of Chen et al. (2021): with n samples of which c are correct,
pass@k = 1 - C(n-c, k) / C(n, k).
The contamination probe ("Reasoning or Memorization?", arXiv 2507.10532) gives the model the first
``fraction`` of a problem's text and greedy-decodes: a model that saw the test problems verbatim
completes the rest exactly (and then answers correctly); a clean model cannot, since the rest is
random digits and operators.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.rewards.builtin import extract_answer
from jaxrl_reason.rewards.evaluation import generate_completions, pass_at_k
from jaxrl_reason.tasks.base import Problem, ProblemBatch

def answer_stops(tokenizer: Tokenizer) -> jax.Array:
    """The stop tokens of an R1 response: ``</answer>`` and eos, int32 [2]."""
    return jnp.array([tokenizer.tag_ids().answer_end, tokenizer.eos_id], jnp.int32)


def task_scores(tasks: Sequence, batch: ProblemBatch, completions: Sequence[str], tokenizer: Tokenizer) -> dict:
    """Text-level scores of completions of ``batch``'s problems, the GRPO trainer's rewards: {"correct",
    "formatted"} [B] bool (``rewards.TaskCorrect``, ``rewards.R1Format``)."""
    from jaxrl_reason.rewards import R1Format, TaskCorrect

    prompts = tokenizer.decode_batch(np.asarray(batch.prompts), np.asarray(batch.prompt_lens), skip_special=False)
    fields = {"task": [p.task for p in batch.problems], "problem": list(batch.problems)}
    return {"correct": np.asarray(TaskCorrect(tuple(tasks))(prompts, completions, **fields)) == 1.0,
            "formatted": np.asarray(R1Format()(prompts, completions)) == 1.0}


def _breakdown(values: np.ndarray, labels: np.ndarray) -> dict:
    return {int(l): float(values[labels == l].mean()) for l in np.unique(labels)}


def greedy_eval(model, tasks: Sequence, batch: ProblemBatch, max_new_tokens: int, tokenizer: Tokenizer) -> dict:
    _, lengths, completions = generate_completions(model, batch.prompts, batch.prompt_lens, tokenizer,
                                                   jax.random.key(0), 0.0, max_new_tokens)
    s = task_scores(tasks, batch, completions, tokenizer)
    c = s["correct"].astype(np.float64)
    return {
        "accuracy": float(c.mean()),
        "format_rate": float(s["formatted"].mean()),
        "response_length": float(lengths.mean()),
        "by_difficulty": _breakdown(c, np.asarray(batch.difficulty)),
        "by_task": {tasks[t].name: v for t, v in _breakdown(c, np.asarray(batch.task_id)).items()},
    }


def pass_at_k_eval(model, tasks: Sequence, batch: ProblemBatch, tokenizer: Tokenizer, n: int = 64,
                   ks: Sequence[int] = (1, 2, 4, 8, 16, 32, 64), temperature: float = 1.0, max_new_tokens: int = 32,
                   key=None, rows_per_call: int = 2048) -> dict:
    """n samples per problem; returns mean pass@k overall and per task ("pass@k", "by_task")."""
    if any(not 1 <= k <= n for k in ks):
        raise ValueError(f"every k must be in [1, n={n}], got {tuple(ks)}")
    key = jax.random.key(0) if key is None else key
    reps = max(1, min(n, rows_per_call // max(len(batch), 1)))
    rep_batch = batch.repeat(reps)  # [len*reps], problem-major
    counts = np.zeros(len(batch), np.int64)
    done = 0
    while done < n:
        key, sub = jax.random.split(key)
        *_, completions = generate_completions(model, rep_batch.prompts, rep_batch.prompt_lens, tokenizer, sub,
                                               temperature, max_new_tokens)
        ok = task_scores(tasks, rep_batch, completions, tokenizer)["correct"].reshape(len(batch), reps)
        take = min(reps, n - done)
        counts += ok[:, :take].sum(1)
        done += take
    res = {f"pass@{k}": float(pass_at_k(n, counts, k).mean()) for k in ks}
    tid = np.asarray(batch.task_id)
    res["by_task"] = {tasks[t].name: {f"pass@{k}": float(pass_at_k(n, counts[tid == t], k).mean()) for k in ks}
                      for t in np.unique(tid)}
    return res


def contamination_probe(model, problems: Sequence[Problem], tokenizer: Tokenizer, fraction: float = 0.6,
                        answer_budget: int = 32, prompt_len: int | None = None) -> dict:
    """Give the first ``fraction`` of each problem's text; greedy-complete it.

    Returns completion_exact (fraction whose remaining text is reproduced exactly) and
    answer_accuracy (the exact answer appears in the <answer> span of the continuation).
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"contamination_probe: fraction must be in (0, 1), got {fraction}")
    heads, rests = [], []
    for p in problems:
        cut = max(1, int(round(fraction * len(p.prompt))))
        heads.append([tokenizer.bos_id] + tokenizer.encode(p.prompt[:cut]))
        rests.append(tokenizer.encode(p.prompt[cut:]))
    plen = prompt_len or max(map(len, heads))
    rlen = max(map(len, rests))
    prompts, plens = tokenizer.pad_batch(heads, plen)
    toks, _, completions = generate_completions(model, prompts, plens, tokenizer, jax.random.key(0), 0.0,
                                                rlen + answer_budget)
    completed = np.array([toks[i, : len(r)].tolist() == r for i, r in enumerate(rests)])
    correct = np.array([extract_answer(c) == p.answer for c, p in zip(completions, problems)])
    return {"completion_exact": float(completed.mean()), "answer_accuracy": float(correct.mean()), "fraction": fraction}
