"""Evaluation of a policy LM, one module for your data and the synthetic tasks: greedy accuracy, pass@k and mean@n
of sampled completions, each reward's mean, response length, all with SE and n; a plot of them over a run; the
partial-prompt contamination probe.

Your data (rows of a ``data.PromptDataset`` or an eval file) with your reward functions (the reward protocol of
``jaxrl_reason.rewards``):

    res = reward_eval(model, tok, prompt_dataset, suite, max_new_tokens, n_samples=8)
        -> {"accuracy", "se", "n", "excluded", "reward/<name>" (+ "_se", "_n"), "response_length" (+ "_se"),
            "strict_accuracy", "strict_se", "pass@k" (+ "_se", "_n"), "mean@8" (+ "_se"), ...}
    res = reward_eval_file(model, tok, "heldout.jsonl", [fn, (fn2, 0.1)], prompt_field="question")  # one call
    ev = FileEval(tok, "heldout.jsonl", [fn], max_new_tokens); ev(model)   # the file prepared once, then each eval
    rule, words = accuracy_rule(rows, suite.names)   # what counts correct: "strict" where rows have answers
    plot_eval(run_dir.read_metrics(), run_dir.path / "eval.png")   # the "eval/" metrics over the run's steps
    pass_at_k(n, c, k)   # the unbiased estimator (both halves use it)

The synthetic tasks' held-out problems (a ``tasks.ProblemBatch`` made with ``tok``, whose R1 tags are single
tokens; correct by the task's own check, ``rewards.TaskCorrect``, the GRPO presets' reward):

    greedy_eval(model, tasks, batch, max_new_tokens, tok)          -> {"accuracy", "format_rate", "by_difficulty", ...}
    pass_at_k_eval(model, tasks, batch, tok, n=64, ks=(1, 8, 64))  -> {"pass@1": .., "pass@8": .., per task}
    contamination_probe(model, problems, tok, fraction=0.6)        -> {"completion_exact", "answer_accuracy"}

A row (and each sampled completion) of your data is correct by the strict answer match (``rewards.answers``: the
extracted final answer against the row's answer field) whenever every row has that field, whatever the rewards are (a
shaped reward such as 0.5 x correct + 0.5 x short is reported as a reward: its mean with SE); without answers, when
the reward named ``accuracy`` (default: the first) is ``>= threshold``. ``accuracy_rule`` says which, in words, for a
run to log once (metrics hold scalars only).

pass@k is the unbiased estimator of Chen et al. (2021): with n samples of which c are correct,
pass@k = 1 - C(n-c, k) / C(n, k), computed as a stable product; ``reward_eval`` reports it for k = 1, 2, 4, ..., n.
mean@n is the mean correctness of the n samples (c / n): it is also the unbiased estimate of the expected
accuracy of k samples for every k <= n, so one number stands for all of them. A sample a reward excludes (None)
counts in neither: accuracy and its SE are over the rows the accuracy reward scored (``n``; ``excluded`` the
rest), pass@k over each row's scored samples (rows with fewer than k of them left out: ``pass@k_n`` rows).

The contamination probe ("Reasoning or Memorization?", arXiv 2507.10532) gives the model the first ``fraction`` of
a problem's text and greedy-decodes: a model that saw the test problems verbatim completes the rest exactly (and then
answers correctly); a clean model cannot, since the rest is random digits and operators.
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.data import PromptDataset, load_rows
from jaxrl_reason.models.lm.sampler import SamplerConfig, sample
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.rewards.builtin import R1Format, TaskCorrect, extract_answer
from jaxrl_reason.rewards.suite import RewardSuite

log = logging.getLogger(__name__)


def pass_at_k(n, c, k: int):
    """Unbiased pass@k for n samples with c correct (n, c scalars or arrays of one shape; every n >= k >= 1)."""
    n, c = np.broadcast_arrays(np.asarray(n), np.asarray(c))
    if k < 1 or (n.size and n.min() < k):
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n.min() if n.size else n}")
    if n.size and (c.min() < 0 or (c > n).any()):
        raise ValueError("pass@k needs 0 <= c <= n")
    flat_n, flat_c = n.reshape(-1), c.reshape(-1)
    i = np.arange(1, int(flat_n.max(initial=1)) + 1)[None, :]  # 1 - prod_{i=n-c+1}^{n} (1 - k/i)
    use = (i > (flat_n - flat_c)[:, None]) & (i <= flat_n[:, None])
    out = 1.0 - np.prod(np.where(use, 1.0 - k / i, 1.0), axis=1)
    return out.reshape(n.shape)


def mean_se(values) -> tuple[float, float, int]:
    """(mean, standard error of the mean (ddof 1; 0 for one value), n) over the finite entries of ``values``."""
    v = np.asarray(values, np.float64).reshape(-1)
    v = v[np.isfinite(v)]
    if not v.size:
        return 0.0, 0.0, 0
    return float(v.mean()), float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else 0.0, int(v.size)


def binomial_se(p: float, n: int) -> float:
    """sqrt(p (1 - p) / n): the SE of an accuracy p over n rows (0 for none)."""
    return float(np.sqrt(p * (1 - p) / n)) if n else 0.0


def generate_completions(model, prompts, prompt_lens, tokenizer: Tokenizer, key, temperature: float,
                         max_new_tokens: int, stop_strings: Sequence[str] = ("</answer>",), **filters
                         ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Sample (``temperature`` 0: greedy) -> (tokens [B, N], lengths [B], completion texts [B]); stops at eos and
    ``stop_strings``; ``filters``: the sampler's top_k / top_p / min_p."""
    stop_tokens, stop_seqs = tokenizer.stops(stop_strings)
    cfg = SamplerConfig(max_new_tokens=max_new_tokens, temperature=temperature, pad_id=tokenizer.pad_id, **filters)
    out = sample(model, prompts, prompt_lens, key, cfg, stop_tokens=stop_tokens, stop_sequences=stop_seqs)
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    return tokens, lengths, tokenizer.decode_completions(tokens, lengths)


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

    A row is correct by ``accuracy_rule``: strictly correct when every row has ``answer_field`` (``accuracy`` None)
    or ``accuracy="strict"``, else when the reward named ``accuracy`` (None: the first) is ``>= threshold``.
    -> {"accuracy", "se" (sqrt(p(1-p)/n)), "n" (rows scored), "excluded" (rows the accuracy reward returned None
    for), "mean_reward" (the weighted total) and "mean_reward_se", "reward/<name>" with "reward/<name>_se" and
    "reward/<name>_n" (each function's mean over the rows it scored; a suite only), "response_length" and
    "response_length_se" (tokens), "strict_accuracy", "strict_se"} (the strict keys only with ``answer_field`` in
    every row). With ``n_samples`` = n > 0, also n completions per row drawn with ``sampler`` (its temperature and
    filters; seeded by ``seed``): "pass@k" for k = 1, 2, 4, ..., n (the unbiased estimator) and "mean@n" (the mean
    accuracy of the n samples), each with "_se" over rows, and "pass@k_n" (rows), correct by the same rule. When a
    reward named by ``accuracy`` and the strict accuracy differ by more than ``DIVERGENCE_SE`` standard errors of
    their paired difference, a warning names both and shows ``samples`` completions on which they disagree.
    ``on_samples``: called with the first ``samples`` rows as dicts {prompt, completion, answer, extracted, reward,
    strict, <each reward>} (e.g. to write them to the run directory).
    """
    suite = reward_fn if hasattr(reward_fn, "names") and hasattr(reward_fn, "weights") else None
    names = suite.names if suite is not None else ()
    accuracy = accuracy_rule(dataset.rows, names, accuracy, threshold, answer_field)[0]
    totals, per_fns, correct, lengths, strict, shown = [], [], [], [], [], []
    starts = range(0, len(dataset), batch_size)
    for start in starts:
        idx = np.arange(start, min(start + batch_size, len(dataset)))
        ids, lens = dataset.ids(idx)
        tokens, out_lens, completions = generate_completions(model, ids, lens, tokenizer, jax.random.key(0), 0.0,
                                                             max_new_tokens, stop_strings)
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
    c = np.concatenate(correct)
    scored_rows = np.isfinite(c)
    acc, _, n = mean_se(c)
    out = {"accuracy": acc, "se": binomial_se(acc, n), "n": n, "excluded": int(len(c) - n)}
    out["mean_reward"], out["mean_reward_se"], _ = mean_se(np.concatenate(totals))
    out["response_length"], out["response_length_se"], _ = mean_se(np.concatenate(lengths))
    for k in names:
        out[f"reward/{k}"], out[f"reward/{k}_se"], out[f"reward/{k}_n"] = mean_se(
            np.concatenate([p[k] for p in per_fns]))
    if strict and len(strict) == len(starts):  # every row has the answer field
        st = np.concatenate(strict)
        out |= {"strict_accuracy": float(st.mean()), "strict_se": binomial_se(float(st.mean()), len(st))}
        if accuracy != "strict":  # a reward chosen over the answers
            _warn_if_divergent(c[scored_rows], st[scored_rows], [r for r, k in zip(shown, scored_rows) if k],
                               samples)
    if n_samples:
        out |= _sampled(model, tokenizer, dataset, reward_fn, suite, max_new_tokens, stop_strings, batch_size,
                        answer_field, accuracy, threshold, n_samples, sampler or SamplerConfig(), seed)
    if on_samples is not None:
        on_samples(shown[:samples])
    return out


def accuracy_rule(rows: Sequence[Mapping], names: Sequence[str] = (), accuracy: str | None = None,
                  threshold: float = 1.0, answer_field: str | None = "answer") -> tuple[str | None, str]:
    """What counts a row (and a sampled completion) of ``rows`` correct -> (rule, the rule in words): ``"strict"``
    (the strict answer match) when ``accuracy`` is "strict", or None and every row has ``answer_field``; else the
    reward named ``accuracy`` (None: the first of ``names``, the rewards as logged) >= ``threshold``. ValueError for
    an unknown name or "strict" without answers."""
    if accuracy not in (None, "strict", *names):
        raise ValueError(f"accuracy must be None (the strict answer match, else the first reward), 'strict' or one "
                         f"of the rewards {tuple(names)}, got {accuracy!r}")
    answers = answer_field is not None and all(answer_field in r for r in rows)
    if accuracy == "strict" and not answers:
        raise ValueError(f"accuracy 'strict' needs the answer field {answer_field!r} in every row")
    if accuracy == "strict" or (accuracy is None and answers):
        return "strict", f"the strict answer match (the extracted final answer against {answer_field!r})"
    name = accuracy or (names[0] if names else None)
    why = "" if accuracy else f" (not every row has {answer_field!r})" if answer_field else " (no answer field)"
    return accuracy, f"{f'reward/{name}' if name else 'the reward'} >= {threshold:g}{why}"


def _score(reward_fn, suite, prompts, completions, rows, tokens, lengths, answer_field, accuracy, threshold) -> dict:
    """One batch's rewards -> {"total" [B], "per_fn" {name: [B]}, "correct" [B] float (NaN: excluded), "strict" [B]
    float | None, "shown" (rows as dicts)}."""
    from jaxrl_reason.rewards.answers import answers_match, final_answer

    fields = {k: [r[k] for r in rows] for k in rows[0] if all(k in r for r in rows)}
    if tokens is not None:
        fields["completion_ids"] = [np.asarray(t)[:n].tolist() for t, n in zip(tokens, lengths)]
    if suite is not None:
        total, per_fn = suite(prompts, completions, fields)
        total = np.asarray(total, np.float64)
    else:
        with RewardSuite([reward_fn], max_workers=1) as one:  # the suite's calling convention and checks
            total, _ = one(prompts, completions, fields)
        total, per_fn = np.asarray(total, np.float64), {}
    gold = fields.get(answer_field) if answer_field else None
    extracted = [final_answer(c, p) for p, c in zip(prompts, completions)]
    strict = None if gold is None else np.asarray([answers_match(e, g) for e, g in zip(extracted, gold)], np.float64)
    if accuracy == "strict":  # accuracy_rule: every row has the answer field
        correct = strict
    else:
        by = total if suite is None else np.asarray(per_fn[accuracy or suite.names[0]], np.float64)
        correct = np.where(np.isfinite(by), (by >= threshold).astype(np.float64), np.nan)
    value = lambda x: float(x) if np.isfinite(x) else None  # None: excluded
    shown = [{"prompt": p, "completion": c, "answer": None if gold is None else gold[i], "extracted": e,
              "reward": value(total[i]), "strict": None if strict is None else bool(strict[i]),
              **{k: value(v[i]) for k, v in per_fn.items()}}
             for i, (p, c, e) in enumerate(zip(prompts, completions, extracted))]
    return {"total": total, "per_fn": per_fn, "correct": correct, "strict": strict, "shown": shown}


def _sampled(model, tokenizer, dataset, reward_fn, suite, max_new_tokens, stop_strings, batch_size, answer_field,
             accuracy, threshold, n: int, sampler: SamplerConfig, seed: int) -> dict:
    """n sampled completions per row -> {"pass@k", "pass@k_se", "pass@k_n" (k = 1, 2, 4, ..., n), "mean@n",
    "mean@n_se"}."""
    per_call = max(1, batch_size // n)  # rows per sampler call: per_call * n completions
    key, counts, scored = jax.random.key(seed), [], []
    for start in range(0, len(dataset), per_call):
        idx = np.arange(start, min(start + per_call, len(dataset)))
        ids, lens = dataset.ids(idx)
        key, sub = jax.random.split(key)
        tokens, out_lens, completions = generate_completions(
            model, np.repeat(ids, n, axis=0), np.repeat(lens, n, axis=0), tokenizer, sub, sampler.temperature,
            max_new_tokens, stop_strings, top_k=sampler.top_k, top_p=sampler.top_p, min_p=sampler.min_p)
        rows = [dataset.rows[i] for i in idx.tolist() for _ in range(n)]
        ok = _score(reward_fn, suite, dataset.prompt_strings(rows), completions, rows, tokens, out_lens,
                    answer_field, accuracy, threshold)["correct"].reshape(len(idx), n)
        counts.append(np.nansum(ok, axis=1))
        scored.append(np.isfinite(ok).sum(axis=1))
    c, m = np.concatenate(counts), np.concatenate(scored)
    ks = sorted({*(2 ** i for i in range(n.bit_length()) if 2 ** i <= n), n})
    out = {}
    for k in ks:
        rows = m >= k
        per_row = pass_at_k(m[rows], c[rows], k)
        out[f"pass@{k}"], out[f"pass@{k}_se"], out[f"pass@{k}_n"] = mean_se(per_row)
    out[f"mean@{n}"], out[f"mean@{n}_se"], _ = mean_se(np.where(m > 0, c / np.maximum(m, 1), np.nan))
    return out


DIVERGENCE_SE = 3.0  # reward-based vs strict accuracy: a gap of more standard errors than this is reported


def _warn_if_divergent(by_reward: np.ndarray, by_strict: np.ndarray, rows: list[dict], samples: int) -> None:
    """Log a warning when the reward-based and strict accuracies (paired [n] 0/1 arrays) diverge."""
    d = by_reward - by_strict
    if not len(d):
        return
    gap, se = float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0
    if gap == 0.0 or abs(gap) <= DIVERGENCE_SE * se:
        return
    shown = "\n".join(f"  reward {row['reward']:g}, strict {int(row['strict'])}, answer {row['answer']!r}, extracted "
                      f"{row['extracted']!r}: {row['completion'][:200]!r}"
                      for row, diff in zip(rows, d) if diff != 0)
    shown = "\n".join(shown.splitlines()[:samples])
    log.warning("held-out accuracy by the reward (%.3f) and strict accuracy (exact match of the extracted final "
                "answer, %.3f) differ by %.3f (%.1f SE, n = %d): the reward may be credited for something other "
                "than the answer (leave accuracy unset, or 'strict', to count the answer). Completions where they "
                "disagree:\n%s", float(by_reward.mean()),
                float(by_strict.mean()), gap, abs(gap) / se if se else float("inf"), len(d), shown)


def reward_eval_file(model, tokenizer: Tokenizer, path, reward_fns: Sequence, max_new_tokens: int, *,
                     prompt_field: str = "prompt", fmt=None, max_prompt_len: int = 256, **kw) -> dict:
    """``reward_eval`` of the rows of an eval file (``data.load_rows``: JSONL / JSON / Parquet / ``datasets``
    directory) with reward functions ``[fn | (fn, weight)]``: the prompts rendered with ``fmt``
    (``data.PromptFormat``; over-long ones dropped and counted as "dropped"), the fields the functions name checked
    first (a ``DataError`` naming the row). ``kw``: ``reward_eval``'s options. The one call for any experiment's
    ``--eval-data`` (``FileEval``: the same prepared once, for evaluations at intervals)."""
    return FileEval(tokenizer, path, reward_fns, max_new_tokens, prompt_field=prompt_field, fmt=fmt,
                    max_prompt_len=max_prompt_len, **kw)(model)


class FileEval:
    """``reward_eval_file`` with the file read, checked and rendered once (at construction), for a run that
    evaluates at intervals:

        ev = FileEval(tok, "heldout.jsonl", [fn, (fn2, 0.1)], 32, fmt=fmt, max_prompt_len=200, n_samples=8)
        ev(model) -> reward_eval's dict + "dropped"; ev(model, on_samples=log) overrides ``kw`` for one call

    ``dataset``: the kept rows (``data.PromptDataset``; ``prompt_len`` the longest kept prompt, at most
    ``max_prompt_len``); ``required_fields``: row fields to check besides those the functions name (e.g. the
    answer field of ``exact_match``); ``rule`` and ``correct_by``: ``accuracy_rule`` on the kept rows. Each call
    scores with its own ``RewardSuite`` (nothing to close)."""

    def __init__(self, tokenizer: Tokenizer, path, reward_fns: Sequence, max_new_tokens: int, *,
                 prompt_field: str = "prompt", fmt=None, max_prompt_len: int = 256,
                 required_fields: Sequence[str] = (), **kw):
        with RewardSuite(reward_fns) as suite:  # the functions' signatures checked here, once
            named = {f for call in suite.calls for f in call.required} - {"step", "completion_ids"}
            names = suite.names
        self.tokenizer, self.reward_fns, self.max_new_tokens, self.kw = tokenizer, list(reward_fns), max_new_tokens, kw
        self.dataset = PromptDataset(load_rows(path), tokenizer, prompt_field, max_prompt_len, fmt,
                                     required_fields=sorted(named | set(required_fields)), source=str(path), fit=True)
        self.rule, self.correct_by = accuracy_rule(self.dataset.rows, names, kw.get("accuracy"),
                                                   kw.get("threshold", 1.0), kw.get("answer_field", "answer"))

    def __call__(self, model, **kw) -> dict:
        with RewardSuite(self.reward_fns) as suite:
            return reward_eval(model, self.tokenizer, self.dataset, suite, self.max_new_tokens,
                               **{**self.kw, **kw}) | {"dropped": self.dataset.dropped}


def plot_eval(rows: Sequence[Mapping], path, prefix: str = "eval/", title: str = ""):
    """The evaluations among metrics rows (those with ``<prefix>accuracy``) over their steps -> one PNG at ``path``
    (None when there are none): greedy and strict accuracy, pass@k and mean@n, each reward's mean and the response
    length, each with a ±1 SE band. In a multi-process run only process 0 draws."""
    from jaxrl_reason.parallel import distributed

    evals = [r for r in rows if f"{prefix}accuracy" in r]
    if not evals or not distributed.is_primary():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({k.removeprefix(prefix) for r in evals for k in r if k.startswith(prefix)})
    sampled = sorted((k for k in keys if (k.startswith("pass@") or k.startswith("mean@")) and k[5:].isdigit()),
                     key=lambda k: (k[0] == "m", int(k[5:])))
    rewards = [k for k in keys if k.startswith("reward/") and not k.endswith(("_se", "_n"))]
    panels = {"greedy accuracy": [("accuracy", "se"), ("strict_accuracy", "strict_se")],
              "sampled": [(k, f"{k}_se") for k in sampled],
              "each reward (greedy)": [(k, f"{k}_se") for k in rewards],
              "response length (tokens, greedy)": [("response_length", "response_length_se")]}
    panels = {name: curves for name, curves in panels.items() if any(k in keys for k, _ in curves)}
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.4), squeeze=False)
    for ax, (name, curves) in zip(axes[0], panels.items()):
        for key, se in curves:
            pts = [(r["step"], r[prefix + key], r.get(prefix + se, 0.0)) for r in evals if prefix + key in r]
            if not pts:
                continue
            x, y, e = (np.asarray(v, np.float64) for v in zip(*pts))
            ax.plot(x, y, marker="o" if len(x) < 40 else None, label=key.removeprefix("reward/"))
            ax.fill_between(x, y - e, y + e, alpha=0.2)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("RL step")
        ax.legend(fontsize=7)
    n = evals[-1].get(f"{prefix}n")
    fig.suptitle(f"{title} (n = {n} rows; bands: ±1 SE)" if title else f"held-out evaluation (n = {n} rows; "
                 "bands: ±1 SE)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------ the synthetic tasks
def answer_stops(tokenizer: Tokenizer) -> jax.Array:
    """The stop tokens of an R1 response: ``</answer>`` and eos, int32 [2]."""
    return jnp.array([tokenizer.tag_ids().answer_end, tokenizer.eos_id], jnp.int32)


def task_scores(tasks: Sequence, batch, completions: Sequence[str], tokenizer: Tokenizer) -> dict:
    """Text-level scores of completions of ``batch``'s problems (a ``tasks.ProblemBatch``), the GRPO trainer's
    rewards: {"correct", "formatted"} [B] bool (``rewards.TaskCorrect``, ``rewards.R1Format``)."""
    prompts = tokenizer.decode_batch(np.asarray(batch.prompts), np.asarray(batch.prompt_lens), skip_special=False)
    fields = {"task": [p.task for p in batch.problems], "problem": list(batch.problems)}
    return {"correct": np.asarray(TaskCorrect(tuple(tasks))(prompts, completions, **fields)) == 1.0,
            "formatted": np.asarray(R1Format()(prompts, completions)) == 1.0}


def _breakdown(values: np.ndarray, labels: np.ndarray) -> dict:
    return {int(l): float(values[labels == l].mean()) for l in np.unique(labels)}


def greedy_eval(model, tasks: Sequence, batch, max_new_tokens: int, tokenizer: Tokenizer) -> dict:
    """Greedy decode of ``batch`` (a ``tasks.ProblemBatch`` of ``tasks``' problems) -> {"accuracy", "format_rate",
    "response_length", "by_difficulty" {difficulty: accuracy}, "by_task" {name: accuracy}}."""
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


def pass_at_k_eval(model, tasks: Sequence, batch, tokenizer: Tokenizer, n: int = 64,
                   ks: Sequence[int] = (1, 2, 4, 8, 16, 32, 64), temperature: float = 1.0, max_new_tokens: int = 32,
                   key=None, rows_per_call: int = 2048) -> dict:
    """n samples per problem of ``batch`` (a ``tasks.ProblemBatch``); returns mean pass@k overall and per task
    ("pass@k", "by_task")."""
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


def contamination_probe(model, problems: Sequence, tokenizer: Tokenizer, fraction: float = 0.6,
                        answer_budget: int = 32, prompt_len: int | None = None) -> dict:
    """Give the first ``fraction`` of each problem's text (``problems``: ``tasks.Problem`` objects); greedy-complete
    it.

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
