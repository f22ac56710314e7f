"""Token-sequence helpers of the LM trainers: prompt + response in one sequence, response masks, the
cut at the first eos, and the log-probs of a response under a model. All jittable, no loops over tokens.

    seqs = join(prompts, prompt_lens, response, pad_id)                  # [B, P+N]
    mask = response_mask(lengths, n, active)                             # [B, N] float32
    logp, ent = response_logprobs(model, seqs, prompt_lens, n, temperature)
    content, lens, ended = cut_at_eos(tokens, lengths, limit, eos_id, pad_id)

``RowBatch`` is the base of the agents' per-example batches (``flax.struct`` dataclasses of ``[B, ...]``
arrays, e.g. MemAgent's ``DocBatch``, JoyAgents' ``Requests``): ``len`` and ``repeat`` for GRPO groups.

Conventions: prompts are right-padded ``[B, P]`` with lengths ``prompt_lens [B]``; a response is
``[B, N]`` with lengths ``[B]`` (the sampler's ``SampleOutput``: eos included, pad after).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_reason.models.lm.model import KVCache, init_cache
from jaxrl_reason.models.lm.train import chunked_logprobs_entropy


class RowBatch:
    """Mixin for a ``flax.struct.dataclass`` whose fields are all ``[B, ...]`` arrays (one row per example)."""

    def __len__(self) -> int:
        return jax.tree.leaves(self)[0].shape[0]

    def repeat(self, g: int):
        """Each row ``g`` times in a row ([B] -> [B*g], group-major: GRPO's groups)."""
        return jax.tree.map(lambda x: jnp.repeat(x, g, axis=0), self)


def join(prompts: jax.Array, prompt_lens: jax.Array, response: jax.Array, pad_id: int = 0) -> jax.Array:
    """prompts [B, P] (right-padded), prompt_lens [B], response [B, N] -> [B, P+N]: each prompt, the response
    right after it (all N slots, as given), pad_id elsewhere."""
    b, p = prompts.shape
    base = jnp.where(jnp.arange(p)[None] < prompt_lens[:, None], prompts, pad_id)
    base = jnp.pad(base, ((0, 0), (0, response.shape[1])), constant_values=pad_id)
    return jax.vmap(lambda x, r, s: jax.lax.dynamic_update_slice(x, r, (s,)))(base, response, prompt_lens)


def span_mask(starts: jax.Array, lengths: jax.Array, width: int) -> jax.Array:
    """starts, lengths [B] -> bool [B, width]: True at positions starts[b] <= t < starts[b] + lengths[b]."""
    rel = jnp.arange(width, dtype=jnp.int32)[None] - jnp.asarray(starts, jnp.int32)[:, None]
    return (rel >= 0) & (rel < lengths[:, None])


def response_mask(lengths: jax.Array, width: int, active: jax.Array | None = None) -> jax.Array:
    """lengths [B] (tokens of each response), optional active [B] bool -> float32 [B, width] loss mask: 1 on the
    first lengths[b] response tokens of the active rows."""
    mask = jnp.arange(width)[None] < lengths[:, None]
    if active is not None:
        mask = mask & active[:, None]
    return mask.astype(jnp.float32)


def response_positions(prompt_lens: jax.Array, n: int) -> jax.Array:
    """prompt_lens [B] -> [B, n]: the index of response token i in the model's [B, T-1] next-token outputs."""
    return prompt_lens[:, None] - 1 + jnp.arange(n)[None]


def response_logprobs(model, tokens: jax.Array, prompt_lens: jax.Array, n: int, temperature: float, chunk: int = 64,
                      group: int = 1):
    """log pi(response token) and entropy of pi at each response position, pi = softmax(logits / temperature).

    tokens [B, P+N] (``join``), prompt_lens [B] -> (logp [B, n], entropy [B, n]) float32. The head runs on
    ``chunk`` positions at a time under remat (``train.chunked_logprobs_entropy``), so [B, n, V] logits are
    never all held at once; only the response positions go through the head.

    ``group`` > 1: the rows are B / group groups of ``group`` consecutive rows with the same prompt (GRPO's
    samples of one prompt). The prompt then runs once per group into a KV cache that the group's responses
    attend to (as the sampler does), so a forward/backward pass costs B/group x P + B x n token positions
    instead of B x (P + n); the gradient through the shared cache sums over the group (exact, up to float
    summation order).
    """
    if group <= 1:
        h, _, _ = model.hidden(tokens[:, :-1])
        idx = response_positions(prompt_lens, n)
        h = jnp.take_along_axis(h, idx[..., None], axis=1)  # [B, n, D]
        targets = jnp.take_along_axis(tokens, idx + 1, axis=1)
        return chunked_logprobs_entropy(model, h, targets, chunk, temperature)
    b, width = tokens.shape
    if b % group:
        raise ValueError(f"response_logprobs: {b} rows do not split into groups of {group}")
    p = width - n
    prompts, lens = tokens[::group, :p], prompt_lens[::group]  # [U, P], [U]
    ar = jnp.arange(p, dtype=jnp.int32)[None]
    cache = init_cache(model.cfg, b // group, width - 1)
    h_prompt, cache, _ = model.hidden(prompts, jnp.where(ar < lens[:, None], ar, -1), cache)  # pads invisible
    h_last = jnp.take_along_axis(h_prompt, (lens - 1)[:, None, None], axis=1)  # [U, 1, D]: predicts token 0
    targets = jnp.take_along_axis(tokens, prompt_lens[:, None] + jnp.arange(n)[None], axis=1)  # [B, n]
    h = jnp.repeat(h_last, group, axis=0)
    if n > 1:  # the responses' own positions, each row attending to its group's prompt in the shared cache
        rep = lambda x: jnp.repeat(x, group, axis=1)  # stacked buffers: [layers, B, ...]
        cache = KVCache(jax.tree.map(rep, cache.buffers), jnp.repeat(cache.pos, group, axis=0), cache.end)
        h_resp, _, _ = model.hidden(targets[:, :-1], prompt_lens[:, None] + jnp.arange(n - 1)[None], cache)
        h = jnp.concatenate([h, h_resp], axis=1)  # [B, n, D]
    return chunked_logprobs_entropy(model, h, targets, chunk, temperature)


def cut_at_eos(tokens: jax.Array, lengths: jax.Array, limit, eos_id: int, pad_id: int
               ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Sampled responses tokens [B, T], lengths [B] -> the content before the first eos, at most ``limit``
    tokens (may be traced): (content [B, T-1] pad after, content lengths [B] int32, ended [B] bool: an eos
    came within limit + 1 tokens; False marks an overlong or unterminated response)."""
    w = tokens.shape[1] - 1
    pos = jnp.arange(tokens.shape[1])[None]
    is_eos = (tokens == eos_id) & (pos < lengths[:, None])
    has = jnp.any(is_eos, axis=1)
    n = jnp.where(has, jnp.argmax(is_eos, axis=1), lengths)
    ended = has & (n <= limit)
    n = jnp.minimum(n, limit)
    content = jnp.where(pos[:, :w] < n[:, None], tokens[:, :w], pad_id)
    return content, n.astype(jnp.int32), ended


__all__ = ["cut_at_eos", "join", "response_logprobs", "response_mask", "response_positions", "span_mask"]
