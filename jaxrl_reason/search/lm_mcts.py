"""Step-level MCTS over a language model's reasoning, on mctx (the ASTRO search).

A node is the problem plus the reasoning steps written so far (the response tokens after the
prompt, starting with ``<think>``). A *step* is a run of tokens that ends at a step delimiter
(``,`` or ``</think>``: ``step_ids(tokenizer)``, ids of the tokenizer the prompts were made with, e.g.
``models.tokenizer.CharTokenizer`` for the tasks of ``jaxrl_reason.tasks``, or a checkpoint's byte-level
BPE whose text is spelled one token per character, ``models.tokenizer.SpelledTokenizer``; the
four R1 tags and ``,`` must be single tokens). Steps are cut on token ids: a generated token that merges
``,`` with other characters (a BPE merge such as ``7,``) is not a step end. mctx holds the
state: the tree's embedding of a node is its token arrays, and an action is the index of one of
the ``branching`` candidate next steps that were sampled when the node was expanded:

- expansion (``recurrent_fn``): append candidate ``action`` to the parent's response, then, in ONE
  batched sampler call, draw ``branching`` rollouts to an answer (stop at ``</answer>``); their
  first steps (cut at the first delimiter) are the new node's candidate next steps, so no token is
  spent on partial samples that are not also complete answer attempts;
- prior: the candidate steps' log-probabilities under the sampling policy (PUCT prior); a candidate
  equal to an earlier one of the same node gets zero prior (``dedupe_candidates``), and so does one
  that an optional local step check rejects (``step_is_wrong``, a process verifier);
- value: the fraction of the rollouts whose answer passes the verifier (``verify``: exact match by
  default, or ``tasks.verify.answer_verifier(task, tokenizer)`` for a task with many valid answers); optionally
  (``value_check``) graded by a process check: unverified rollouts count ``process_weight`` x the
  fraction of their steps before the first false one (``steps_before_first_wrong``);
- a step that closes ``</think>`` makes a terminal node: its edge reward is ``2 * value - 1``, so a
  wrong closed answer is a dead end (-1) that ranks below any open prefix, and its discount is 0, so
  nothing below it counts (expansions below a terminal node are no-ops and are not counted in
  ``tokens``: a sequential search would skip them, the batched one computes and discards them).

``mctx.muzero_policy`` runs the simulations (PUCT selection, backup) under jit, batched over
problems. The result keeps the whole tree for procedure cloning (``search.procedure_cloning``).

    search = make_step_search(graphdef, StepSearchConfig(num_simulations=16, branching=4), tokenizer=tok)
    result = search(model_state, key, prompts, prompt_lens, answers, answer_lens)
    result.solved [B] (a verified-correct answer was found), result.tokens [B] (tokens generated)
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import mctx
from flax import struct

from jaxrl_reason.models.lm.sampler import SamplerConfig, generate
from jaxrl_reason.models.tokenizer import R1_TAGS, Tokenizer
from jaxrl_reason.models.lm.sequences import join
from jaxrl_reason.tasks.verify import verify_exact
from jaxrl_reason.utils.validation import check_hyperparameters


class StepIds(NamedTuple):
    """The static ids the search reads and writes (``step_ids``)."""

    pad: int
    think: int
    think_end: int
    answer_end: int
    delimiters: tuple[int, int]  # step delimiters: ``,`` between steps, ``</think>`` after the last


@functools.lru_cache(maxsize=16)
def step_ids(tokenizer: Tokenizer) -> StepIds:
    """``tokenizer``'s ids for the search; one ValueError naming every one of the R1 tags and ``,`` that is
    not a single token (the search writes and parses them inside jit)."""
    missing = [t for t in (*R1_TAGS, ",") if tokenizer.single_token_id(t) is None]
    if missing:
        raise ValueError(f"the step search needs {missing} as single tokens of {type(tokenizer).__name__} (vocab "
                         f"{tokenizer.vocab_size}): it writes and parses the R1 tags and the step delimiter ',' "
                         "inside jit; use a tokenizer that has them (CharTokenizer, ByteTokenizer, or a checkpoint "
                         "tokenizer with the four tags as added tokens)")
    tags = tokenizer.tag_ids()
    comma = tokenizer.single_token_id(",")
    return StepIds(pad=tokenizer.pad_id, think=tags.think, think_end=tags.think_end, answer_end=tags.answer_end,
                   delimiters=(comma, tags.think_end))


@functools.lru_cache(maxsize=16)
def exact_verifier(tokenizer: Tokenizer):
    """The default ``verify``: exact match of the answer span (``tasks.verify.verify_exact``) with
    ``tokenizer``'s tags; one function object per tokenizer."""
    return functools.partial(verify_exact, tags=tokenizer.tag_ids())


@dataclasses.dataclass(frozen=True)
class StepSearchConfig:
    num_simulations: int = 16
    branching: int = 4  # candidate next steps sampled per expanded node
    max_depth: int = 6  # reasoning steps below the root
    step_tokens: int = 12  # longest step kept as a candidate (longer first steps are cut)
    rollout_tokens: int = 40  # longest rollout from a node to ``</answer>``
    temperature: float = 1.0  # sampling temperature of candidates and rollouts
    pb_c_init: float = 1.25  # PUCT exploration constant
    dirichlet_fraction: float = 0.0  # root noise (0: search is a deterministic function of the key)
    dedupe_candidates: bool = True  # a repeated candidate step gets zero prior (never a second child)
    # weight of the graded process value (``make_step_search(value_check=...)``): an open node's value is the
    # fraction of verified rollouts plus this times the mean fraction of the others' steps that come before
    # their first step the check rejects
    process_weight: float = 0.5

    def __post_init__(self):
        check_hyperparameters(self)
        for f in ("num_simulations", "branching", "max_depth", "step_tokens", "rollout_tokens"):
            if getattr(self, f) < 1:
                raise ValueError(f"StepSearchConfig.{f} must be >= 1, got {getattr(self, f)}")
        if self.temperature <= 0:
            raise ValueError(f"StepSearchConfig.temperature must be > 0 (candidates are sampled), got {self.temperature}")
        if not 0.0 <= self.process_weight < 1.0:
            raise ValueError(f"StepSearchConfig.process_weight must be in [0, 1) (below a verified answer's 1), "
                             f"got {self.process_weight}")
        if not 0.0 <= self.dirichlet_fraction <= 1.0:
            raise ValueError(f"StepSearchConfig.dirichlet_fraction must be in [0, 1], got {self.dirichlet_fraction}")

    @property
    def response_len(self) -> int:
        """Capacity of a node's response: ``<think>`` + one step per level (root and max_depth more)."""
        return 1 + (self.max_depth + 1) * self.step_tokens

    def context_len(self, prompt_len: int) -> int:
        """Model sequence length a search needs for prompts of ``prompt_len`` tokens."""
        return prompt_len + self.response_len + max(self.step_tokens, self.rollout_tokens)


@struct.dataclass
class Node:
    """Embedding of one node (leading batch dimension [B] inside the search)."""

    response: jax.Array  # [L] int32: <think> + steps so far (pad after response_len)
    response_len: jax.Array  # int32
    candidates: jax.Array  # [K, S] int32: next steps (first steps of the K rollouts)
    candidate_lens: jax.Array  # [K] int32
    candidate_logp: jax.Array  # [K] float32: step log-prob under the sampling policy
    rollout: jax.Array  # [R] int32: a continuation to an answer (a verified one if any)
    rollout_len: jax.Array  # int32
    correct: jax.Array  # bool: some rollout's answer passes the verifier
    value: jax.Array  # float32: fraction of the K rollouts that pass the verifier
    guide: jax.Array  # float32: the search's value of an open node (``value``, plus the graded process value)
    terminal: jax.Array  # bool: the response closed </think>
    tokens: jax.Array  # int32: tokens generated to expand this node (candidates + rollout)


@struct.dataclass
class SearchResult:
    tree: mctx.Tree  # embeddings are ``Node``s [B, num_simulations + 1, ...]
    solved: jax.Array  # [B] bool: some expanded node's answer was verified correct
    tokens: jax.Array  # [B] int32: tokens generated by the whole search
    action_weights: jax.Array  # [B, K] visit distribution at the root


def _write(base: jax.Array, seq: jax.Array, start: jax.Array) -> jax.Array:
    """Write ``seq`` [N] into ``base`` [L] at ``start``, keeping the capacity L (``join`` widens instead)."""
    return jax.lax.dynamic_update_slice(jnp.pad(base, (0, seq.shape[0])), seq, (start,))[: base.shape[0]]


def _first_steps(toks: jax.Array, lens: jax.Array, s: int, ids: StepIds):
    """Rollouts [..., R] -> their first steps [..., S] (up to and including the first delimiter) and lengths."""
    r = toks.shape[-1]
    pos = jnp.arange(r)
    delim = jnp.isin(toks, jnp.array([*ids.delimiters, ids.answer_end], jnp.int32)) & (pos < lens[..., None])
    first = jnp.where(jnp.any(delim, -1), jnp.argmax(delim, -1) + 1, lens)
    step_len = jnp.minimum(first, s)
    step = jnp.where(pos[:s] < step_len[..., None], toks[..., :s], ids.pad)
    return step, step_len


def _blocked(cfg: StepSearchConfig, node: Node, step_is_wrong) -> jax.Array:
    """[B, K] candidates that get no child: repeats of an earlier candidate (``dedupe_candidates``) and
    steps the optional local check ``step_is_wrong(steps [B, K, S], lens [B, K]) -> [B, K]`` rejects."""
    c, n = node.candidates, node.candidate_lens
    blocked = jnp.zeros(n.shape, bool)
    if cfg.dedupe_candidates:
        same = jnp.all(c[:, :, None] == c[:, None], axis=-1) & (n[:, :, None] == n[:, None])  # [B, K, K]
        k = c.shape[1]
        blocked |= jnp.any(same & jnp.tril(jnp.ones((k, k), bool), -1), axis=-1)  # an earlier one is equal
    if step_is_wrong is not None:
        blocked |= step_is_wrong(c, n)
    return blocked & ~jnp.all(blocked, axis=-1, keepdims=True)  # all blocked: fall back to the plain prior


def steps_before_first_wrong(response: jax.Array, length: jax.Array, step_is_wrong, step_tokens: int, *,
                             tokenizer: Tokenizer) -> jax.Array:
    """response [..., N] (from ``<think>``, ids of ``tokenizer``), length [...] -> float32 [...]: the fraction
    of its complete steps that come before the first step ``step_is_wrong`` rejects (1: none rejected; 0: no step)."""
    ids = step_ids(tokenizer)

    def one(seq, n):
        pos = jnp.arange(seq.shape[0])
        delim = jnp.isin(seq, jnp.asarray(ids.delimiters, jnp.int32)) & (pos < n)
        last = jax.lax.cummax(jnp.where(delim, pos, 0))  # last delimiter at or before p (0: <think>)
        prev = jnp.concatenate([jnp.zeros((1,), last.dtype), last[:-1]])  # ... strictly before p
        span = jnp.minimum(pos - prev, step_tokens)  # a longer step is cut, has no delimiter: not judged
        idx = jnp.minimum(prev[:, None] + 1 + jnp.arange(step_tokens)[None], seq.shape[0] - 1)
        windows = jnp.where(jnp.arange(step_tokens)[None] < span[:, None], seq[idx], ids.pad)
        wrong = delim & step_is_wrong(windows, span)
        first = jnp.where(jnp.any(wrong), jnp.argmax(wrong), seq.shape[0])
        return jnp.sum(delim & (pos < first)) / jnp.maximum(jnp.sum(delim), 1)

    length = jnp.asarray(length)
    out = jax.vmap(one)(response.reshape(-1, response.shape[-1]), length.reshape(-1))
    return out.reshape(length.shape).astype(jnp.float32)


def _prior_logits(node: Node, blocked: jax.Array) -> jax.Array:
    """PUCT prior logits [B, K]: the step log-probs, -1e9 (zero prior) for ``blocked`` candidates."""
    return jnp.where(blocked, -1e9, node.candidate_logp)


def _expand(model_state, graphdef, cfg: StepSearchConfig, tokenizer: Tokenizer, key, problem, response, response_len,
            value_check, verify):
    """Sample K rollouts to an answer after ``response``; their first steps are the K candidate steps.

    problem: (prompts [B, P], prompt_lens [B], answers [B, A], answer_lens [B]);
    response [B, L], response_len [B] -> the expansion fields of ``Node`` (each [B, ...]). The value is
    the fraction of verified rollouts; the stored rollout is a verified one when there is one. With
    ``value_check`` (a ``step_is_wrong``), ``guide`` adds ``process_weight`` x the mean over the
    unverified rollouts of ``steps_before_first_wrong`` of the whole response (prefix + rollout).
    """
    prompts, prompt_lens, answers, answer_lens = problem
    b, k, s, r = prompts.shape[0], cfg.branching, cfg.step_tokens, cfg.rollout_tokens
    ids = step_ids(tokenizer)
    ctx = join(prompts, prompt_lens, response, pad_id=ids.pad)  # [B, P+L]
    rows = lambda x: jnp.repeat(x, k, axis=0)  # row b*K+j: rollout j of problem b
    out = generate(graphdef, model_state, rows(ctx), rows(prompt_lens + response_len), key,
                   jnp.full((b * k, 1), ids.answer_end, jnp.int32), jnp.full((b * k,), r, jnp.int32),
                   config=SamplerConfig(max_new_tokens=r, temperature=cfg.temperature, pad_id=ids.pad))
    full = join(rows(response), rows(response_len), out.tokens, pad_id=ids.pad)  # [B*K, L+R]
    correct = verify(full, rows(response_len) + out.lengths, rows(prompts), rows(prompt_lens), rows(answers),
                     rows(answer_lens)).reshape(b, k)
    toks, lens = out.tokens.reshape(b, k, r), out.lengths.reshape(b, k)
    step, step_len = _first_steps(toks, lens, s, ids)
    pos = jnp.arange(r)
    step_logp = jnp.sum(jnp.where(pos < step_len[..., None], out.logprobs.reshape(b, k, r), 0.0), -1)
    keep = jnp.argmax(correct, axis=-1)  # a verified rollout if any, else the first
    take = lambda x: jnp.take_along_axis(x, keep.reshape((b,) + (1,) * (x.ndim - 1)), axis=1)[:, 0]
    value = jnp.mean(correct, -1)
    guide = value
    if value_check is not None:
        graded = steps_before_first_wrong(full, rows(response_len) + out.lengths, value_check, s,
                                          tokenizer=tokenizer).reshape(b, k)
        guide = value + cfg.process_weight * jnp.mean(jnp.where(correct, 0.0, graded), -1)
    return dict(candidates=step, candidate_lens=step_len, candidate_logp=step_logp,
                rollout=take(toks), rollout_len=take(lens), correct=jnp.any(correct, -1),
                value=value, guide=guide, tokens=lens.sum(-1).astype(jnp.int32))


def make_step_search(graphdef, cfg: StepSearchConfig, step_is_wrong=None, value_check=None, verify=None, *,
                     tokenizer: Tokenizer):
    """-> jitted ``search(model_state, key, prompts, prompt_lens, answers, answer_lens) -> SearchResult``.

    prompts [B, P] right-padded (``<bos>`` + problem), answers [B, A] padded exact answers, both ids of
    ``tokenizer`` (``step_ids``: its pad, R1 tags and step delimiters are what the search writes and reads).
    ``step_is_wrong`` (optional, jittable, e.g. ``tasks.calc_steps.step_checker(tokenizer)``): a local process
    check of candidate steps [..., S] with lengths [...] -> bool [...]. A rejected step gets zero prior,
    and if it is still chosen (every candidate rejected) its node is a dead end (reward -1) that is
    neither expanded nor counted: a process verifier next to the outcome verifier.
    ``value_check`` (optional, same signature): the process check grades open nodes instead of pruning:
    a node whose rollouts go further before their first rejected step is worth more
    (``StepSearchConfig.process_weight``; a verified rollout still counts 1).
    ``verify``: the answer verifier of the task (``tasks.verify.answer_verifier(task, tokenizer)``; default
    ``None``: exact match, ``exact_verifier(tokenizer)``).
    """
    ids = step_ids(tokenizer)
    verify = exact_verifier(tokenizer) if verify is None else verify

    def recurrent_fn(params, key, action, node: Node):
        model_state, problem = params
        step = jnp.take_along_axis(node.candidates, action[:, None, None], axis=1)[:, 0]  # [B, S]
        step_len = jnp.take_along_axis(node.candidate_lens, action[:, None], axis=1)[:, 0]
        response = jax.vmap(_write)(node.response, step, node.response_len)
        response_len = jnp.minimum(node.response_len + step_len, cfg.response_len)
        closes = jnp.any((step == ids.think_end) & (jnp.arange(cfg.step_tokens) < step_len[:, None]), axis=-1)
        rejected = (jnp.zeros_like(closes) if step_is_wrong is None else step_is_wrong(step, step_len)) & ~node.terminal
        fields = _expand(model_state, graphdef, cfg, tokenizer, key, problem, response, response_len, value_check, verify)
        child = Node(response=response, response_len=response_len, terminal=closes | rejected | node.terminal, **fields)
        # below a terminal node nothing changes and nothing counts
        child = jax.tree.map(lambda old, new: jnp.where(
            node.terminal.reshape((-1,) + (1,) * (new.ndim - 1)), old, new), node, child)
        # copied (below a terminal node) or skipped (a rejected step): not generated, not verified
        child = child.replace(tokens=jnp.where(node.terminal | rejected, 0, child.tokens),
                              correct=child.correct & ~rejected, value=jnp.where(rejected, 0.0, child.value),
                              guide=jnp.where(rejected, 0.0, child.guide))
        # a closed wrong answer or a rejected step is a dead end (-1), below an open prefix's rollout value
        # (0 or 1), so PUCT does not spend simulations re-selecting it
        reward = jnp.where(rejected, -1.0, jnp.where(closes & ~node.terminal, 2.0 * child.value - 1.0, 0.0))
        reward = reward.astype(jnp.float32)
        discount = jnp.where(child.terminal, 0.0, 1.0).astype(jnp.float32)
        value = jnp.where(child.terminal, 0.0, child.guide).astype(jnp.float32)
        out = mctx.RecurrentFnOutput(reward=reward, discount=discount, prior_logits=_prior_logits(child, _blocked(cfg, child, step_is_wrong)),
                                     value=value)
        return out, child

    @jax.jit
    def search(model_state, key, prompts, prompt_lens, answers, answer_lens) -> SearchResult:
        b = prompts.shape[0]
        problem = (prompts, prompt_lens, answers, answer_lens)
        root_key, search_key = jax.random.split(key)
        response = jnp.full((b, cfg.response_len), ids.pad, jnp.int32).at[:, 0].set(ids.think)
        response_len = jnp.ones((b,), jnp.int32)
        fields = _expand(model_state, graphdef, cfg, tokenizer, root_key, problem, response, response_len, value_check,
                         verify)
        root_node = Node(response=response, response_len=response_len, terminal=jnp.zeros((b,), bool), **fields)
        blocked = _blocked(cfg, root_node, step_is_wrong)
        root = mctx.RootFnOutput(prior_logits=_prior_logits(root_node, blocked), value=root_node.guide,
                                 embedding=root_node)
        out = mctx.muzero_policy(
            (model_state, problem), search_key, root, recurrent_fn, cfg.num_simulations,
            invalid_actions=blocked,  # blocked root candidates get no Dirichlet noise either
            max_depth=cfg.max_depth, pb_c_init=cfg.pb_c_init, dirichlet_fraction=cfg.dirichlet_fraction,
        )
        tree = out.search_tree
        visited = tree.node_visits > 0
        emb: Node = tree.embeddings
        return SearchResult(
            tree=tree,
            solved=jnp.any(visited & emb.correct, axis=-1),
            tokens=jnp.sum(jnp.where(visited, emb.tokens, 0), axis=-1),
            action_weights=out.action_weights,
        )

    return search


@functools.partial(jax.jit, static_argnames=("graphdef", "num_samples", "max_new_tokens", "temperature", "verify",
                                             "tokenizer"))
def sample_and_verify(graphdef, model_state, key, prompts, prompt_lens, answers, answer_lens, *, num_samples: int,
                      max_new_tokens: int, temperature: float, tokenizer: Tokenizer, verify=None):
    """``num_samples`` whole responses per problem, each checked by ``verify`` (as in the search; default
    ``None``: exact match), stopping at ``</answer>``. ``tokenizer`` (static): the prompts' tokenizer.

    -> (verified [B, num_samples] bool, tokens [B, num_samples] int32 generated per response).
    """
    ids = step_ids(tokenizer)
    verify = exact_verifier(tokenizer) if verify is None else verify
    b = prompts.shape[0]
    rows = lambda x: jnp.repeat(x, num_samples, axis=0)
    stops = jnp.array([ids.answer_end], jnp.int32)
    out = generate(graphdef, model_state, rows(prompts), rows(prompt_lens), key,
                   jnp.broadcast_to(stops, (b * num_samples, 1)), jnp.full((b * num_samples,), max_new_tokens, jnp.int32),
                   config=SamplerConfig(max_new_tokens=max_new_tokens, temperature=temperature, pad_id=ids.pad))
    ok = verify(out.tokens, out.lengths, rows(prompts), rows(prompt_lens), rows(answers), rows(answer_lens))
    return ok.reshape(b, num_samples), out.lengths.reshape(b, num_samples)


def best_of_n(graphdef, model_state, key, prompts, prompt_lens, answers, answer_lens, **kw):
    """Baseline: ``sample_and_verify`` (same keywords, ``tokenizer`` included), solved if any response passes.

    -> (solved [B] bool, tokens [B] int32 generated in total).
    """
    ok, tokens = sample_and_verify(graphdef, model_state, key, prompts, prompt_lens, answers, answer_lens, **kw)
    return ok.any(-1), tokens.sum(-1)
