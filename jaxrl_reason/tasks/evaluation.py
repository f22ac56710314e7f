"""Evaluation of a policy LM on held-out problems: greedy accuracy (overall, per task, per
difficulty), unbiased pass@k (k = 1..64) and the partial-prompt contamination probe.

    greedy_eval(model, tasks, batch, max_new_tokens, tok)          -> {"accuracy", "format_rate", "by_difficulty", ...}
    pass_at_k_eval(model, tasks, batch, tok, n=64, ks=(1, 8, 64))  -> {"pass@1": .., "pass@8": .., per task}
    contamination_probe(model, problems, tok, fraction=0.6)        -> {"completion_exact", "answer_accuracy"}
    reward_eval(model, tok, prompt_dataset, reward_fn_or_suite, max_new_tokens, n_samples=8)
        -> {"accuracy", "se", "n", "reward/<name>", "strict_accuracy", "pass@k", "mean@n", ...}

``tok``: the tokenizer the batch was made with (``models.tokenizer``; R1 tags as single tokens).

pass@k uses the unbiased estimator of Chen et al. (2021): with n samples of which c are correct,
pass@k = 1 - C(n-c, k) / C(n, k), computed as a stable product.
The contamination probe ("Reasoning or Memorization?", arXiv 2507.10532) gives the model the first
``fraction`` of a problem's text and greedy-decodes: a model that saw the test problems verbatim
completes the rest exactly (and then answers correctly); a clean model cannot, since the rest is
random digits and operators.
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.models.lm.sampler import SamplerConfig, sample
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.rewards.builtin import extract_answer
from jaxrl_reason.tasks.base import Problem, ProblemBatch

log = logging.getLogger(__name__)


def pass_at_k(n: int, c, k: int):
    """Unbiased pass@k for n samples with c correct (c scalar or array)."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    c = np.asarray(c)
    i = np.arange(1, n + 1)  # 1 - prod_{i=n-c+1}^{n} (1 - k/i)
    terms = np.where(i[None, :] > (n - c.reshape(-1))[:, None], 1.0 - k / i[None, :], 1.0)
    out = 1.0 - np.prod(terms, axis=1)
    return out.reshape(c.shape)


def answer_stops(tokenizer: Tokenizer) -> jax.Array:
    """The stop tokens of an R1 response: ``</answer>`` and eos, int32 [2]."""
    return jnp.array([tokenizer.tag_ids().answer_end, tokenizer.eos_id], jnp.int32)


def _generate(model, prompts, prompt_lens, tokenizer: Tokenizer, key, temperature: float, max_new_tokens: int,
              stop_strings: Sequence[str] = ("</answer>",), **filters) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Sample -> (tokens [B, N], lengths [B], completion texts [B]); stops at eos and ``stop_strings``;
    ``filters``: the sampler's top_k / top_p / min_p."""
    stop_tokens, stop_seqs = tokenizer.stops(stop_strings)
    cfg = SamplerConfig(max_new_tokens=max_new_tokens, temperature=temperature, pad_id=tokenizer.pad_id, **filters)
    out = sample(model, prompts, prompt_lens, key, cfg, stop_tokens=stop_tokens, stop_sequences=stop_seqs)
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    return tokens, lengths, tokenizer.decode_completions(tokens, lengths)


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
    _, lengths, completions = _generate(model, batch.prompts, batch.prompt_lens, tokenizer, jax.random.key(0), 0.0,
                                        max_new_tokens)
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
        *_, completions = _generate(model, rep_batch.prompts, rep_batch.prompt_lens, tokenizer, sub, temperature,
                                    max_new_tokens)
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
    toks, _, completions = _generate(model, prompts, plens, tokenizer, jax.random.key(0), 0.0, rlen + answer_budget)
    completed = np.array([toks[i, : len(r)].tolist() == r for i, r in enumerate(rests)])
    correct = np.array([extract_answer(c) == p.answer for c, p in zip(completions, problems)])
    return {"completion_exact": float(completed.mean()), "answer_accuracy": float(correct.mean()), "fraction": fraction}


def reward_eval(model, tokenizer: Tokenizer, dataset, reward_fn, max_new_tokens: int,
                stop_strings: Sequence[str] = ("</answer>",), batch_size: int = 256,
                answer_field: str | None = "answer", samples: int = 4,
                on_samples: Callable[[list[dict]], None] | None = None, *, accuracy: str | None = None,
                threshold: float = 1.0, n_samples: int = 0, sampler: SamplerConfig | None = None,
                seed: int = 0) -> dict:
    """Greedy decode of every kept row of ``dataset`` (``data.PromptDataset``), scored two ways: by the rewards
    (``reward_fn``: one reward function, or a ``rewards.RewardSuite`` of several) and, where the rows have
    ``answer_field``, by strict correctness independent of the rewards (normalised exact match of the completion's
    extracted final answer, ``rewards.final_answer`` / ``answers_match``, against the field).

    A row is correct when the reward named ``accuracy`` (default: the first) is ``>= threshold``, or, with
    ``accuracy="strict"``, when it is strictly correct. -> {"accuracy", "se" (sqrt(p(1-p)/n)), "n", "mean_reward"
    (the weighted total), "reward/<name>" (each function's mean; a suite only), "response_length",
    "strict_accuracy", "strict_se"} (the strict keys only with ``answer_field`` in every row). With
    ``n_samples`` = n > 0, also n completions per row drawn with ``sampler`` (its temperature and filters; seeded
    by ``seed``): "pass@k" for k = 1, 2, 4, ..., n (the unbiased estimator) and "mean@n" (the mean accuracy of
    the n samples), each with "_se" over rows. When the reward's and the strict accuracy differ by more than
    ``DIVERGENCE_SE`` standard errors of their paired difference, a warning names both and shows ``samples``
    completions on which they disagree. ``on_samples``: called with the first ``samples`` rows as dicts {prompt,
    completion, answer, extracted, reward, strict, <each reward>} (e.g. to write them to the run directory).
    """
    suite = reward_fn if hasattr(reward_fn, "names") and hasattr(reward_fn, "weights") else None
    names = suite.names if suite is not None else ()
    if accuracy not in (None, "strict", *names):
        raise ValueError(f"reward_eval: accuracy must be None (the first reward), 'strict' or one of the rewards "
                         f"{names}, got {accuracy!r}")
    totals, per_fns, correct, lengths, strict, shown = [], [], [], [], [], []
    starts = range(0, len(dataset), batch_size)
    for start in starts:
        idx = np.arange(start, min(start + batch_size, len(dataset)))
        ids, lens = dataset.ids(idx)
        tokens, out_lens, completions = _generate(model, ids, lens, tokenizer, jax.random.key(0), 0.0, max_new_tokens,
                                                  stop_strings)
        rows = [dataset.rows[i] for i in idx.tolist()]
        scored = _score(reward_fn, suite, dataset.prompt_strings(rows), completions, rows, tokens, out_lens,
                        answer_field, accuracy, threshold)
        totals.append(scored["total"])
        per_fns.append(scored["per_fn"])
        correct.append(scored["correct"])
        lengths.append(out_lens)
        if scored["strict"] is not None:
            strict.append(scored["strict"])
        shown += scored["shown"]
    r, c = np.concatenate(totals), np.concatenate(correct)
    acc = float(c.mean())
    out = {"accuracy": acc, "se": _se(acc, len(r)), "n": int(len(r)), "mean_reward": float(r.mean()),
           "response_length": float(np.concatenate(lengths).mean())}
    out |= {f"reward/{k}": float(np.mean(np.concatenate([p[k] for p in per_fns]))) for k in names}
    if strict and len(strict) == len(starts):  # every row has the answer field
        st = np.concatenate(strict)
        out |= {"strict_accuracy": float(st.mean()), "strict_se": _se(float(st.mean()), len(st))}
        if accuracy != "strict":
            _warn_if_divergent(c, st, shown, samples)
    if n_samples:
        out |= _sampled(model, tokenizer, dataset, reward_fn, suite, max_new_tokens, stop_strings, batch_size,
                        answer_field, accuracy, threshold, n_samples, sampler or SamplerConfig(), seed)
    if on_samples is not None:
        on_samples(shown[:samples])
    return out


def _score(reward_fn, suite, prompts, completions, rows, tokens, lengths, answer_field, accuracy, threshold) -> dict:
    """One batch's rewards -> {"total" [B], "per_fn" {name: [B]}, "correct" [B] float, "strict" [B] float | None,
    "shown" (rows as dicts)}."""
    from jaxrl_reason.rewards.answers import answers_match, final_answer

    fields = {k: [r[k] for r in rows] for k in rows[0] if all(k in r for r in rows)}
    if tokens is not None:
        fields["completion_ids"] = [np.asarray(t)[:n].tolist() for t, n in zip(tokens, lengths)]
    if suite is not None:
        total, per_fn = suite(prompts, completions, fields)
        total = np.asarray(total, np.float64)
    else:
        fields.pop("completion_ids", None)
        total, per_fn = np.asarray(reward_fn(prompts, completions, **fields), np.float64), {}
    gold = fields.get(answer_field) if answer_field else None
    extracted = [final_answer(c, p) for p, c in zip(prompts, completions)]
    strict = None if gold is None else np.asarray([answers_match(e, g) for e, g in zip(extracted, gold)], np.float64)
    if accuracy == "strict":
        if strict is None:
            raise ValueError(f"reward_eval: accuracy 'strict' needs the answer field {answer_field!r} in every row")
        correct = strict
    else:
        by = total if suite is None else np.asarray(per_fn[accuracy or suite.names[0]], np.float64)
        correct = (by >= threshold).astype(np.float64)
    shown = [{"prompt": p, "completion": c, "answer": None if gold is None else gold[i], "extracted": e,
              "reward": float(total[i]), "strict": None if strict is None else bool(strict[i]),
              **{k: float(v[i]) for k, v in per_fn.items()}}
             for i, (p, c, e) in enumerate(zip(prompts, completions, extracted))]
    return {"total": total, "per_fn": per_fn, "correct": correct, "strict": strict, "shown": shown}


def _sampled(model, tokenizer, dataset, reward_fn, suite, max_new_tokens, stop_strings, batch_size, answer_field,
             accuracy, threshold, n: int, sampler: SamplerConfig, seed: int) -> dict:
    """n sampled completions per row -> {"pass@k", "pass@k_se" (k = 1, 2, 4, ..., n), "mean@n", "mean@n_se"}."""
    per_call = max(1, batch_size // n)  # rows per sampler call: per_call * n completions
    key, counts = jax.random.key(seed), []
    for start in range(0, len(dataset), per_call):
        idx = np.arange(start, min(start + per_call, len(dataset)))
        ids, lens = dataset.ids(idx)
        key, sub = jax.random.split(key)
        tokens, out_lens, completions = _generate(
            model, np.repeat(ids, n, axis=0), np.repeat(lens, n, axis=0), tokenizer, sub, sampler.temperature,
            max_new_tokens, stop_strings, top_k=sampler.top_k, top_p=sampler.top_p, min_p=sampler.min_p)
        rows = [dataset.rows[i] for i in idx.tolist() for _ in range(n)]
        scored = _score(reward_fn, suite, dataset.prompt_strings(rows), completions, rows, tokens, out_lens,
                        answer_field, accuracy, threshold)
        counts.append(scored["correct"].reshape(len(idx), n).sum(1))
    c = np.concatenate(counts)
    ks = sorted({*(2 ** i for i in range(n.bit_length()) if 2 ** i <= n), n})
    out = {}
    for k in ks:
        per_row = pass_at_k(n, c, k)
        out[f"pass@{k}"], out[f"pass@{k}_se"] = float(per_row.mean()), _row_se(per_row)
    out[f"mean@{n}"], out[f"mean@{n}_se"] = float((c / n).mean()), _row_se(c / n)
    return out


def _row_se(values: np.ndarray) -> float:
    """The standard error of a mean over rows (0 for one row)."""
    return float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else 0.0


def _se(p: float, n: int) -> float:
    return float(np.sqrt(p * (1 - p) / n))


DIVERGENCE_SE = 3.0  # reward-based vs strict accuracy: a gap of more standard errors than this is reported


def _warn_if_divergent(by_reward: np.ndarray, by_strict: np.ndarray, rows: list[dict], samples: int) -> None:
    """Log a warning when the reward-based and strict accuracies (paired [n] 0/1 arrays) diverge."""
    d = by_reward - by_strict
    gap, se = float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0
    if gap == 0.0 or abs(gap) <= DIVERGENCE_SE * se:
        return
    shown = "\n".join(f"  reward {row['reward']:g}, strict {int(row['strict'])}, answer {row['answer']!r}, extracted "
                      f"{row['extracted']!r}: {row['completion'][:200]!r}"
                      for row, diff in zip(rows, d) if diff != 0)
    shown = "\n".join(shown.splitlines()[:samples])
    log.warning("held-out accuracy by the reward (%.3f) and strict accuracy (exact match of the extracted final "
                "answer, %.3f) differ by %.3f (%.1f SE, n = %d): the reward may be credited for something other "
                "than the answer. Completions where they disagree:\n%s", float(by_reward.mean()),
                float(by_strict.mean()), gap, abs(gap) / se if se else float("inf"), len(d), shown)
