"""Rewards on generated token ids: answer parsing, exact match and format checks in jnp (jit-able),
host-side verification for tasks without a unique answer, and the reward variants of the
spurious-rewards study.

    parsed = parse_response(tokens, lengths)           # tokens [B, N] int32, lengths [B]
    ok = exact_match(tokens, parsed, answers, answer_lens)
    scores = score(tasks, batch, tokens, lengths)      # dict of [B] arrays (host entry point)
    verify = answer_verifier(task)                     # in-jit: verify(tokens, lengths, prompts, prompt_lens,
                                                       #   answers, answer_lens) -> [B] bool
    r = combine_rewards(RewardConfig("random"), key, scores)

A response is well formatted iff it is exactly ``<think>..</think><answer>..</answer>`` (the tags are
single tokens; the sampler stops at ``</answer>``). Malformed outputs (no answer tags, garbage,
truncated at the length limit) never raise: they are not correct and get ``malformed_penalty``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.tasks.base import Problem
from jaxrl_reason.tasks.vocab import VOCAB
from jaxrl_reason.utils.validation import check_hyperparameters

VARIANTS = ("correct", "random", "inverted", "wrong_label", "format_only")


@flax.struct.dataclass
class Parsed:
    has_answer: jax.Array  # [B] bool: an <answer> tag closed by </answer>
    start: jax.Array  # [B] int32: index of the first answer token
    length: jax.Array  # [B] int32: answer span length
    formatted: jax.Array  # [B] bool: the whole response is <think>..</think><answer>..</answer>


def _first(mask):
    """mask [B, N] -> (index of first True [B], any [B])."""
    return jnp.argmax(mask, axis=-1).astype(jnp.int32), jnp.any(mask, axis=-1)


@jax.jit
def parse_response(tokens: jax.Array, lengths: jax.Array) -> Parsed:
    b, n = tokens.shape
    pos = jnp.arange(n)[None]
    valid = pos < lengths[:, None]
    is_tok = lambda t: (tokens == t) & valid
    a, has_a = _first(is_tok(VOCAB.answer))
    e, has_e = _first(is_tok(VOCAB.answer_end) & (pos > a[:, None]))
    te, _ = _first(is_tok(VOCAB.think_end))
    count = lambda t: jnp.sum(is_tok(t), axis=-1)
    has_answer = has_a & has_e
    formatted = (
        has_answer & (tokens[:, 0] == VOCAB.think) & (lengths > 0)
        & (count(VOCAB.think) == 1) & (count(VOCAB.think_end) == 1)
        & (count(VOCAB.answer) == 1) & (count(VOCAB.answer_end) == 1)
        & (te + 1 == a) & (e == lengths - 1)
    )
    return Parsed(has_answer=has_answer, start=a + 1, length=jnp.where(has_answer, e - a - 1, 0), formatted=formatted)


@jax.jit
def exact_match(tokens: jax.Array, parsed: Parsed, target: jax.Array, target_len: jax.Array) -> jax.Array:
    """tokens [B, N], target [B, A] (padded), target_len [B] -> [B] bool: answer span == target."""
    n, a = tokens.shape[1], target.shape[1]
    idx = jnp.clip(parsed.start[:, None] + jnp.arange(a)[None], 0, n - 1)
    span = jnp.take_along_axis(tokens, idx, axis=1)
    same = (span == target) | (jnp.arange(a)[None] >= target_len[:, None])
    return parsed.has_answer & (parsed.length == target_len) & jnp.all(same, axis=-1)


def answer_strings(tokens, parsed: Parsed) -> list[str | None]:
    """Host-side: decoded answer span per row (None when there is none)."""
    tokens, start, length, has = (np.asarray(x) for x in (tokens, parsed.start, parsed.length, parsed.has_answer))
    return [VOCAB.decode(tokens[i, start[i] : start[i] + length[i]], stop_at_pad=False) if has[i] else None
            for i in range(len(tokens))]


def score(tasks: Sequence, batch, tokens, lengths) -> dict[str, np.ndarray]:
    """Correctness, wrong-label match, format and parse flags, each [B] bool (host entry point).

    Exact-match tasks are scored in jnp on token ids; rows of tasks with ``exact_match = False``
    (e.g. countdown) are verified on the host with ``task.check``.
    """
    tokens, lengths = jnp.asarray(tokens), jnp.asarray(lengths)
    parsed = parse_response(tokens, lengths)
    correct = np.asarray(exact_match(tokens, parsed, jnp.asarray(batch.answers), jnp.asarray(batch.answer_lens)))
    wrong = np.asarray(exact_match(tokens, parsed, jnp.asarray(batch.wrong), jnp.asarray(batch.wrong_lens)))
    task_id = np.asarray(batch.task_id)
    host_tasks = [i for i, t in enumerate(tasks) if not t.exact_match]
    if host_tasks and np.isin(task_id, host_tasks).any():
        answers = answer_strings(tokens, parsed)
        correct, wrong = correct.copy(), wrong.copy()
        for i in np.flatnonzero(np.isin(task_id, host_tasks)):
            ans, prob = answers[i], batch.problems[i]
            correct[i] = ans is not None and bool(tasks[task_id[i]].check(ans, prob))
            wrong[i] = ans is not None and ans == prob.wrong
    return {"correct": correct, "wrong_match": wrong, "formatted": np.asarray(parsed.formatted),
            "has_answer": np.asarray(parsed.has_answer)}


def verify_exact(tokens, lengths, prompts, prompt_lens, answers, answer_lens) -> jax.Array:
    """In-jit verifier of exact-match tasks: responses tokens [B, N] (from ``<think>``), lengths [B] -> [B] bool."""
    del prompts, prompt_lens
    return exact_match(tokens, parse_response(tokens, lengths), answers, answer_lens)


@functools.cache
def answer_verifier(task):
    """-> a jittable ``verify(tokens, lengths, prompts, prompt_lens, answers, answer_lens) -> [B] bool`` for ``task``.

    Exact-match tasks: ``verify_exact``. Others (countdown: many valid answers): the answer span is parsed
    in jit, then ``task.check`` runs on the host through ``jax.pure_callback`` (the prompt text is decoded from
    ``prompts`` [B, P], ``<bos>`` first), so a jitted search can call the task's own verifier. Cached: one
    function object per task (a static argument of ``search.lm_mcts.sample_and_verify``).
    """
    if task.exact_match:
        return verify_exact

    def host(tokens, prompts, prompt_lens, parsed):
        out = np.zeros(len(tokens), bool)
        for i, ans in enumerate(answer_strings(tokens, parsed)):
            if ans is not None:
                prompt = VOCAB.decode(np.asarray(prompts[i])[1: int(prompt_lens[i])], stop_at_pad=False)
                out[i] = bool(task.check(ans, Problem(prompt=prompt, answer="", wrong="", trace="", difficulty=0,
                                                      task=task.name)))
        return out

    def verify(tokens, lengths, prompts, prompt_lens, answers, answer_lens):
        del answers, answer_lens
        parsed = parse_response(tokens, lengths)
        shape = jax.ShapeDtypeStruct(tokens.shape[:1], jnp.bool_)
        return jax.pure_callback(host, shape, tokens, prompts, prompt_lens, parsed, vmap_method="sequential")

    return verify


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """variant: correct | random (Bernoulli(random_p), output-independent) | inverted (a parsable,
    incorrect answer scores 1) | wrong_label (1 iff the answer equals the problem's fixed wrong
    label) | format_only (1 iff well formatted). ``format_weight`` adds w * formatted (R1's format
    reward; not added to format_only). Responses without a parsable answer get ``malformed_penalty`` instead of the variant's
    reward for correct / inverted / wrong_label."""

    variant: str = "correct"
    format_weight: float = 0.0
    random_p: float = 0.5
    malformed_penalty: float = 0.0

    def __post_init__(self):
        check_hyperparameters(self)
        if self.variant not in VARIANTS:
            raise ValueError(f"RewardConfig: variant must be one of {VARIANTS}, got {self.variant!r}")


def combine_rewards(cfg: RewardConfig, key: jax.Array, scores: dict) -> jax.Array:
    """scores (from ``score``) -> rewards [B] float32 (pure; jit-able with cfg static)."""
    correct = jnp.asarray(scores["correct"])
    has = jnp.asarray(scores["has_answer"])
    fmt = jnp.asarray(scores["formatted"]).astype(jnp.float32)
    if cfg.variant == "correct":
        base = correct.astype(jnp.float32)
    elif cfg.variant == "random":
        base = jax.random.bernoulli(key, cfg.random_p, correct.shape).astype(jnp.float32)
    elif cfg.variant == "inverted":
        base = (has & ~correct).astype(jnp.float32)
    elif cfg.variant == "wrong_label":
        base = jnp.asarray(scores["wrong_match"]).astype(jnp.float32)
    else:  # format_only
        base = fmt
    if cfg.variant in ("correct", "inverted", "wrong_label"):
        base = jnp.where(has, base, cfg.malformed_penalty)
    return base if cfg.variant == "format_only" else base + cfg.format_weight * fmt
