"""Verifiers on generated token ids, in jit: answer parsing, exact match, and a task's own check through a host
callback. They are not reward functions: the GRPO trainer and every evaluation take reward functions on decoded text
(``jaxrl_reason.rewards``; the synthetic tasks' ones are in ``tasks.rewards``). Use these where scoring must run
inside a jitted search (``search.lm_mcts``, ``search.best_of_n``) or on the sampler's token ids directly.

    tags = tokenizer.tag_ids()                         # the R1 tags' single-token ids (models.tokenizer)
    parsed = parse_response(tokens, lengths, tags)     # tokens [B, N] int32, lengths [B]
    ok = exact_match(tokens, parsed, answers, answer_lens)
    scores = score(tasks, batch, tokens, lengths, tokenizer)   # dict of [B] bool arrays (host entry point)
    verify = answer_verifier(task, tokenizer)          # in-jit: verify(tokens, lengths, prompts, prompt_lens,
                                                       #   answers, answer_lens) -> [B] bool

A response is well formatted iff it is exactly ``<think>..</think><answer>..</answer>`` (the tags are
single tokens of the tokenizer, e.g. ``CharTokenizer``; the sampler stops at ``</answer>``). Tokenizers
whose tags are several tokens are scored on decoded text by ``jaxrl_reason.rewards`` instead. Malformed outputs (no
answer tags, garbage, truncated at the length limit) never raise: they are not correct and not formatted.
"""

from __future__ import annotations

import functools
from typing import Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.models.tokenizer import TagIds, Tokenizer
from jaxrl_reason.tasks.base import Problem


@flax.struct.dataclass
class Parsed:
    has_answer: jax.Array  # [B] bool: an <answer> tag closed by </answer>
    start: jax.Array  # [B] int32: index of the first answer token
    length: jax.Array  # [B] int32: answer span length
    formatted: jax.Array  # [B] bool: the whole response is <think>..</think><answer>..</answer>


def _first(mask):
    """mask [B, N] -> (index of first True [B], any [B])."""
    return jnp.argmax(mask, axis=-1).astype(jnp.int32), jnp.any(mask, axis=-1)


@functools.partial(jax.jit, static_argnames="tags")
def parse_response(tokens: jax.Array, lengths: jax.Array, tags: TagIds) -> Parsed:
    b, n = tokens.shape
    pos = jnp.arange(n)[None]
    valid = pos < lengths[:, None]
    is_tok = lambda t: (tokens == t) & valid
    a, has_a = _first(is_tok(tags.answer))
    e, has_e = _first(is_tok(tags.answer_end) & (pos > a[:, None]))
    te, _ = _first(is_tok(tags.think_end))
    count = lambda t: jnp.sum(is_tok(t), axis=-1)
    has_answer = has_a & has_e
    formatted = (
        has_answer & (tokens[:, 0] == tags.think) & (lengths > 0)
        & (count(tags.think) == 1) & (count(tags.think_end) == 1)
        & (count(tags.answer) == 1) & (count(tags.answer_end) == 1)
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


def answer_strings(tokens, parsed: Parsed, tokenizer: Tokenizer) -> list[str | None]:
    """Host-side: decoded answer span per row (None when there is none)."""
    tokens, start, length, has = (np.asarray(x) for x in (tokens, parsed.start, parsed.length, parsed.has_answer))
    return [tokenizer.decode(tokens[i, start[i] : start[i] + length[i]]) if has[i] else None
            for i in range(len(tokens))]


def score(tasks: Sequence, batch, tokens, lengths, tokenizer: Tokenizer) -> dict[str, np.ndarray]:
    """Correctness, wrong-label match, format and parse flags, each [B] bool (host entry point).

    Exact-match tasks are scored in jnp on token ids; rows of tasks with ``exact_match = False``
    (e.g. countdown) are verified on the host with ``task.check``.
    """
    tokens, lengths = jnp.asarray(tokens), jnp.asarray(lengths)
    parsed = parse_response(tokens, lengths, tokenizer.tag_ids())
    correct = np.asarray(exact_match(tokens, parsed, jnp.asarray(batch.answers), jnp.asarray(batch.answer_lens)))
    wrong = np.asarray(exact_match(tokens, parsed, jnp.asarray(batch.wrong), jnp.asarray(batch.wrong_lens)))
    task_id = np.asarray(batch.task_id)
    host_tasks = [i for i, t in enumerate(tasks) if not t.exact_match]
    if host_tasks and np.isin(task_id, host_tasks).any():
        answers = answer_strings(tokens, parsed, tokenizer)
        correct, wrong = correct.copy(), wrong.copy()
        for i in np.flatnonzero(np.isin(task_id, host_tasks)):
            ans, prob = answers[i], batch.problems[i]
            correct[i] = ans is not None and bool(tasks[task_id[i]].check(ans, prob))
            wrong[i] = ans is not None and ans == prob.wrong
    return {"correct": correct, "wrong_match": wrong, "formatted": np.asarray(parsed.formatted),
            "has_answer": np.asarray(parsed.has_answer)}


def verify_exact(tokens, lengths, prompts, prompt_lens, answers, answer_lens, *, tags: TagIds) -> jax.Array:
    """In-jit verifier of exact-match tasks: responses tokens [B, N] (from ``<think>``), lengths [B] -> [B] bool."""
    del prompts, prompt_lens
    return exact_match(tokens, parse_response(tokens, lengths, tags), answers, answer_lens)


@functools.cache
def answer_verifier(task, tokenizer: Tokenizer):
    """-> a jittable ``verify(tokens, lengths, prompts, prompt_lens, answers, answer_lens) -> [B] bool`` for ``task``.

    Exact-match tasks: ``verify_exact`` with ``tokenizer``'s tags. Others (countdown: many valid answers): the answer span is parsed
    in jit, then ``task.check`` runs on the host through ``jax.pure_callback`` (the prompt text is decoded from
    ``prompts`` [B, P], ``<bos>`` first), so a jitted search can call the task's own verifier. Cached: one
    function object per (task, tokenizer) (a static argument of ``search.lm_mcts.sample_and_verify``).
    """
    tags = tokenizer.tag_ids()
    if task.exact_match:
        return functools.partial(verify_exact, tags=tags)

    def host(tokens, prompts, prompt_lens, parsed):
        out = np.zeros(len(tokens), bool)
        for i, ans in enumerate(answer_strings(tokens, parsed, tokenizer)):
            if ans is not None:
                prompt = tokenizer.decode(np.asarray(prompts[i])[1: int(prompt_lens[i])])
                out[i] = bool(task.check(ans, Problem(prompt=prompt, answer="", wrong="", trace="", difficulty=0,
                                                      task=task.name)))
        return out

    def verify(tokens, lengths, prompts, prompt_lens, answers, answer_lens):
        del answers, answer_lens
        parsed = parse_response(tokens, lengths, tags)
        shape = jax.ShapeDtypeStruct(tokens.shape[:1], jnp.bool_)
        return jax.pure_callback(host, shape, tokens, prompts, prompt_lens, parsed, vmap_method="sequential")

    return verify
