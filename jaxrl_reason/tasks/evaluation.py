"""Evaluation of a policy LM on held-out problems: greedy accuracy (overall, per task, per
difficulty), unbiased pass@k (k = 1..64) and the partial-prompt contamination probe.

    greedy_eval(model, tasks, batch, max_new_tokens)                -> {"accuracy", "format_rate", "by_difficulty", ...}
    pass_at_k_eval(model, tasks, batch, n=64, ks=(1, 8, 64), ...)  -> {"pass@1": .., "pass@8": .., per task}
    contamination_probe(model, problems, fraction=0.6)            -> {"completion_exact", "answer_accuracy"}

pass@k uses the unbiased estimator of Chen et al. (2021): with n samples of which c are correct,
pass@k = 1 - C(n-c, k) / C(n, k), computed as a stable product.
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

from jaxrl_reason.models.lm.sampler import SamplerConfig, sample
from jaxrl_reason.tasks.base import Problem, ProblemBatch
from jaxrl_reason.tasks.rewards import exact_match, parse_response, score
from jaxrl_reason.tasks.vocab import VOCAB

STOPS = jnp.array([VOCAB.answer_end, VOCAB.eos], jnp.int32)


def pass_at_k(n: int, c, k: int):
    """Unbiased pass@k for n samples with c correct (c scalar or array)."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    c = np.asarray(c)
    i = np.arange(1, n + 1)  # 1 - prod_{i=n-c+1}^{n} (1 - k/i)
    terms = np.where(i[None, :] > (n - c.reshape(-1))[:, None], 1.0 - k / i[None, :], 1.0)
    out = 1.0 - np.prod(terms, axis=1)
    return out.reshape(c.shape)


def _generate(model, batch: ProblemBatch, key, temperature: float, max_new_tokens: int):
    cfg = SamplerConfig(max_new_tokens=max_new_tokens, temperature=temperature, pad_id=VOCAB.pad)
    return sample(model, batch.prompts, batch.prompt_lens, key, cfg, stop_tokens=STOPS)


def _breakdown(values: np.ndarray, labels: np.ndarray) -> dict:
    return {int(l): float(values[labels == l].mean()) for l in np.unique(labels)}


def greedy_eval(model, tasks: Sequence, batch: ProblemBatch, max_new_tokens: int) -> dict:
    out = _generate(model, batch, jax.random.key(0), 0.0, max_new_tokens)
    s = score(tasks, batch, out.tokens, out.lengths)
    c = s["correct"].astype(np.float64)
    return {
        "accuracy": float(c.mean()),
        "format_rate": float(s["formatted"].mean()),
        "response_length": float(np.asarray(out.lengths).mean()),
        "by_difficulty": _breakdown(c, np.asarray(batch.difficulty)),
        "by_task": {tasks[t].name: v for t, v in _breakdown(c, np.asarray(batch.task_id)).items()},
    }


def pass_at_k_eval(model, tasks: Sequence, batch: ProblemBatch, n: int = 64, ks: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
                   temperature: float = 1.0, max_new_tokens: int = 32, key=None, rows_per_call: int = 2048) -> dict:
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
        out = _generate(model, rep_batch, sub, temperature, max_new_tokens)
        ok = score(tasks, rep_batch, out.tokens, out.lengths)["correct"].reshape(len(batch), reps)
        take = min(reps, n - done)
        counts += ok[:, :take].sum(1)
        done += take
    res = {f"pass@{k}": float(pass_at_k(n, counts, k).mean()) for k in ks}
    tid = np.asarray(batch.task_id)
    res["by_task"] = {tasks[t].name: {f"pass@{k}": float(pass_at_k(n, counts[tid == t], k).mean()) for k in ks}
                      for t in np.unique(tid)}
    return res


def contamination_probe(model, problems: Sequence[Problem], fraction: float = 0.6, answer_budget: int = 32,
                        prompt_len: int | None = None) -> dict:
    """Give the first ``fraction`` of each problem's text; greedy-complete it.

    Returns completion_exact (fraction whose remaining text is reproduced exactly) and
    answer_accuracy (the exact answer appears in the <answer> span of the continuation).
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"contamination_probe: fraction must be in (0, 1), got {fraction}")
    heads, rests = [], []
    for p in problems:
        cut = max(1, int(round(fraction * len(p.prompt))))
        heads.append([VOCAB.bos] + VOCAB.encode(p.prompt[:cut]))
        rests.append(VOCAB.encode(p.prompt[cut:]))
    plen = prompt_len or max(map(len, heads))
    rlen = max(map(len, rests))
    prompts, plens = VOCAB.pad_batch(heads, plen)
    cfg = SamplerConfig(max_new_tokens=rlen + answer_budget, temperature=0.0, pad_id=VOCAB.pad)
    out = sample(model, prompts, plens, jax.random.key(0), cfg, stop_tokens=STOPS)
    toks = np.asarray(out.tokens)
    completed = np.array([toks[i, : len(r)].tolist() == r for i, r in enumerate(rests)])
    answers, alens = VOCAB.pad_batch([VOCAB.encode(p.answer) for p in problems], max(len(VOCAB.encode(p.answer)) for p in problems))
    parsed = parse_response(out.tokens, out.lengths)
    correct = np.asarray(exact_match(out.tokens, parsed, jnp.asarray(answers), jnp.asarray(alens)))
    return {"completion_exact": float(completed.mean()), "answer_accuracy": float(correct.mean()), "fraction": fraction}
