"""Jitted batched sampler: one prefill, then a `lax.while_loop` of single-token decode steps on a
preallocated KV cache (compressed latent cache for MLA).

    out = sample(model, prompts, prompt_lens, key, SamplerConfig(max_new_tokens=64, temperature=0.7))
    out.tokens [B, N] int32 (pad_id after a sequence stops), out.logprobs [B, N] float32,
    out.lengths [B] (generated tokens, stop token included)

Prompts are right-padded [B, P] with their true lengths; sequence b writes its generated tokens at
positions prompt_lens[b], prompt_lens[b]+1, ... (cache slots P, P+1, ...; see `attention`). Each sequence stops at any of its own stop tokens
(`stop_tokens` [B, S] or [S], -1 = unused), at the end of any of its stop sequences (`stop_sequences`
[B, Q, L] or [Q, L], token ids left-padded with -1, see `stop_sequence_array`; matched on generated
tokens only, inside the loop), or after its own `max_new_tokens[b]`; the loop exits when all have
stopped. Like a stop token, a stop sequence is part of the output: `lengths` counts its tokens.
Tokens are drawn from exp(`SamplerConfig.logprobs(logits)`): logits / temperature, then top-k, top-p
and min-p (each off by default, composable), and `logprobs` are of that same distribution; for greedy
decoding (temperature 0) they are the model's own log-probabilities of the argmax (filters unused).
The prompt's logits are computed at each row's last prompt position only ([B, V], never [B, P, V]).
`generate` is the pure function (graphdef static) for use inside larger jitted programs.

A cache kept between calls (multi-turn episodes, ``rl.lm.multiturn``): ``dec = start_decode(graphdef, state,
prompts, prompt_lens, cache_len)`` prefills the prompts into a cache sized for everything the rows will hold;
``out, dec = decode_turn(graphdef, state, dec, key, stop_tokens, max_new_tokens, config=cfg)`` is `generate`'s
decode loop from there (the same draws for the same key as `generate` on each row's whole context so far; a row's
steps after it stopped go to position -1, so the cache holds its tokens alone); ``dec = extend(graphdef, state,
dec, tokens, n)`` prefills more tokens (ragged per row, optionally in chunks) at each row's next positions;
``repeat_rows(dec, k)`` repeats each row k times (a prefix every row shares; a prompt a group shares).
``generate(..., group=g)`` (GRPO: B = prompts x g consecutive copies): each prompt is prefilled once and its cache
shared by its g rows, which then decode apart; the same draws as ``group=1``.

Data parallel (``sample(..., mesh=mesh)`` or `generate_data_parallel`): the batch is split over one
mesh axis and every device runs its own decode loop on its rows with replicated weights (shard_map),
so nothing crosses devices inside the loop and a shard exits as soon as its own rows have stopped.
On a CPU, a mesh of one host device per core (``jax.config.update("jax_num_cpu_devices", n)``
right after ``import jax``) decodes a small model faster than one device using the cores inside each
op (``experiments/bench_lm.py``).

For RL, ``out.join(prompts, prompt_lens)`` (or `sample_joined`) gives a `JoinedSample`: the
[B, P+N] sequences (each completion right after its own prompt) with prompt / completion masks and
the sampling log-probs at their positions, ready for `train.token_logprobs_entropy`. That
re-scoring applies the temperature only, so it agrees with the sampler when no filter is on; with
top-k / top-p / min-p, re-score the logits with the same `SamplerConfig.logprobs`.
"""

from __future__ import annotations

import dataclasses
import functools

import flax
import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, PartitionSpec as P

from jaxrl_reason.models.lm.model import KVCache, init_cache
from jaxrl_reason.models.lm.sequences import join, span_mask
from jaxrl_reason.parallel.mesh import check_batch_divides
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    max_new_tokens: int = 32
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off; keep tokens with prob >= min_p * (max prob)
    cache_len: int | None = None  # default: prompt length + max_new_tokens
    pad_id: int = 0

    def __post_init__(self):
        check_hyperparameters(self)
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplerConfig: max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"SamplerConfig: temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0 or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplerConfig: need top_k >= 0 and 0 < top_p <= 1, got {self.top_k}, {self.top_p}")

    def logprobs(self, logits: jax.Array) -> jax.Array:
        """logits [..., V] -> float32 log-probs [..., V] of the distribution tokens are drawn from
        (greedy: the model's own log-softmax). Use it to re-score samples under the same filters."""
        if self.temperature == 0.0:
            return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        return sampling_logprobs(logits, self.temperature, self.top_k, self.top_p, self.min_p)


@flax.struct.dataclass
class SampleOutput:
    tokens: jax.Array  # [B, N] int32
    logprobs: jax.Array  # [B, N] float32
    lengths: jax.Array  # [B] int32

    def join(self, prompts: jax.Array, prompt_lens: jax.Array, pad_id: int = 0) -> "JoinedSample":
        """See `join_sample`."""
        return join_sample(prompts, prompt_lens, self, pad_id)


@flax.struct.dataclass
class JoinedSample:
    """Prompt + completion in one right-padded [B, P+N] sequence (positions 0..P+N-1).

    tokens: prompt (first prompt_lens[b] slots), then the completion, then pad_id.
    prompt_mask / completion_mask: bool [B, P+N]; completion_mask covers the lengths[b] generated
      tokens (stop token included). For next-token terms [B, P+N-1] use completion_mask[:, 1:].
    logprobs: [B, P+N] sampling log-probs at completion positions, 0 elsewhere.
    """

    tokens: jax.Array
    prompt_mask: jax.Array
    completion_mask: jax.Array
    logprobs: jax.Array
    prompt_lens: jax.Array  # [B]
    lengths: jax.Array  # [B]


def join_sample(prompts: jax.Array, prompt_lens: jax.Array, out: SampleOutput, pad_id: int = 0) -> JoinedSample:
    """prompts [B, P] (right-padded), prompt_lens [B], out (tokens [B, N]) -> JoinedSample [B, P+N]. Jittable."""
    p, n = prompts.shape[1], out.tokens.shape[1]
    plens = jnp.asarray(prompt_lens, jnp.int32)
    generated = jnp.arange(n)[None] < out.lengths[:, None]
    tokens = join(jnp.asarray(prompts, jnp.int32), plens, jnp.where(generated, out.tokens, pad_id), pad_id)
    completion_mask = span_mask(plens, out.lengths, p + n)
    logprobs = join(jnp.zeros(prompts.shape, jnp.float32), plens, jnp.where(generated, out.logprobs, 0.0), 0.0)
    return JoinedSample(tokens=tokens, prompt_mask=span_mask(jnp.zeros_like(plens), plens, p + n),
                        completion_mask=completion_mask, logprobs=logprobs, prompt_lens=plens, lengths=out.lengths)


def sampling_logprobs(logits: jax.Array, temperature: float, top_k: int = 0, top_p: float = 1.0,
                      min_p: float = 0.0) -> jax.Array:
    """logits [..., V] -> log-probs [..., V] of the tempered distribution truncated in turn by top-k,
    top-p (smallest most-likely set with mass >= top_p) and min-p (prob >= min_p * max prob), the
    order transformers applies them in; removed tokens get -inf. Ties at a threshold are kept."""
    x = logits.astype(jnp.float32) / max(temperature, 1e-6)
    if top_k:
        kth = jax.lax.top_k(x, top_k)[0][..., -1:]
        x = jnp.where(x < kth, -jnp.inf, x)
    if top_p < 1.0:
        srt = jnp.sort(x, axis=-1)[..., ::-1]
        cum = jnp.cumsum(jax.nn.softmax(srt, axis=-1), axis=-1)
        # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
        n_keep = jnp.sum(cum - jax.nn.softmax(srt, axis=-1) < top_p, axis=-1, keepdims=True)
        thresh = jnp.take_along_axis(srt, n_keep - 1, axis=-1)
        x = jnp.where(x < thresh, -jnp.inf, x)
    if min_p > 0.0:  # p_i >= min_p * p_max  <=>  x_i >= max x + log(min_p) (renormalising keeps ratios)
        x = jnp.where(x < jnp.max(x, axis=-1, keepdims=True) + jnp.log(min_p), -jnp.inf, x)
    return jax.nn.log_softmax(x, axis=-1)


def _choose(key, logits, cfg: SamplerConfig):
    """logits [B, V] -> (token [B] int32, its log-prob [B])."""
    lp = cfg.logprobs(logits)
    if cfg.temperature == 0.0:
        tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    else:
        tok = jax.random.categorical(key, lp, axis=-1).astype(jnp.int32)
    return tok, jnp.take_along_axis(lp, tok[:, None], axis=-1)[:, 0]


def stop_sequence_array(seqs, batch: int | None = None, encode=None) -> jax.Array:
    """Stop sequences -> int32 [Q, L] (or [batch, Q, L]), each left-padded with -1 so its last token
    is at L-1. ``seqs``: token-id lists, or strings turned into ids on the host by ``encode`` (e.g. a
    tokenizer's ``encode`` without special tokens). Matching is on token ids: a string generated with
    a different tokenization does not match (add that tokenization as another sequence)."""
    if encode is None and any(isinstance(q, str) for q in seqs):
        raise ValueError("stop_sequence_array: strings need encode=")
    ids = [list(encode(q)) if isinstance(q, str) else [int(t) for t in q] for q in seqs]
    if not ids or any(len(q) == 0 or min(q) < 0 for q in ids):
        raise ValueError(f"stop sequences must be non-empty lists of token ids >= 0, got {ids}")
    width = max(map(len, ids))
    arr = jnp.asarray([[-1] * (width - len(q)) + q for q in ids], jnp.int32)
    return arr if batch is None else jnp.broadcast_to(arr, (batch,) + arr.shape)


def _ends_with(recent, stop_sequences):
    """recent [B, L] last generated tokens (-1 before the first), stop_sequences [B, Q, L] -> bool [B]."""
    used = stop_sequences >= 0
    match = jnp.all(~used | (stop_sequences == recent[:, None, :]), axis=-1) & jnp.any(used, axis=-1)
    return jnp.any(match, axis=-1)


@functools.partial(jax.jit, static_argnames=("graphdef", "config", "group"))
def generate(graphdef, state, prompts, prompt_lens, key, stop_tokens, max_new_tokens, stop_sequences=None, *,
             config: SamplerConfig, group: int = 1):
    """Pure sampler. prompts [B, P] int32, prompt_lens [B], stop_tokens [B, S] (-1 unused),
    max_new_tokens [B] (<= config.max_new_tokens), stop_sequences None or [B, Q, L] (see
    `stop_sequence_array`) -> SampleOutput.

    ``group`` > 1: the rows come in groups of ``group`` consecutive copies of one prompt (GRPO's B = prompts x
    group): each prompt is prefilled once and its cache shared by the group's rows, which then decode apart. The
    same draws as ``group=1`` for the same key (tested); rows of a group that differ would decode from the first
    row's prompt."""
    model, layers = _model_layers(graphdef, state)
    b, p = prompts.shape
    if b % group:
        raise ValueError(f"generate: {b} rows are not whole groups of {group}")
    n = config.max_new_tokens
    seqs = jnp.full((b, 0, 0), -1, jnp.int32) if stop_sequences is None else jnp.asarray(stop_sequences, jnp.int32)
    dec = _prefill(model, layers, prompts[::group], prompt_lens[::group], config.cache_len or p + n)
    if group > 1:
        dec = repeat_rows(dec, group)
    toks, lps, lengths, _, _ = _decode(model, layers, dec.cache, dec.logits, prompt_lens, key, stop_tokens,
                                       max_new_tokens, seqs, config)
    return SampleOutput(tokens=toks, logprobs=lps, lengths=lengths)


def _decode(model, layers, cache, logits, start, key, stop_tokens, max_new_tokens, seqs, config: SamplerConfig,
            carry: bool = False):
    """The decode loop from next-token ``logits`` [B, V]: token i of row b at position start[b] + i (cache slot
    cache.end + i) -> (tokens [B, N], log-probs, lengths, cache, logits). ``carry``: the cache and logits are read
    afterwards (`decode_turn`): a row's steps after it stopped are written at position -1 (invisible) and its
    logits stay those after its last token."""
    b, n, width = logits.shape[0], config.max_new_tokens, seqs.shape[-1]

    def cond(c):
        i, *_, done = c
        return (i < n) & ~jnp.all(done)

    def body(c):
        i, key, cache, logits, toks, lps, lengths, recent, done = c
        was_done = done
        key, sub = jax.random.split(key)
        tok, lp = _choose(sub, logits, config)
        tok = jnp.where(done, config.pad_id, tok)
        toks = toks.at[:, i].set(tok)
        lps = lps.at[:, i].set(jnp.where(done, 0.0, lp))
        lengths = lengths + (~done).astype(jnp.int32)
        hit = jnp.any(tok[:, None] == stop_tokens, axis=-1)
        if width:  # static: no stop sequences, nothing traced
            recent = jnp.concatenate([recent[:, 1:], tok[:, None]], axis=1)
            hit = hit | _ends_with(recent, seqs)
        done = done | hit | (lengths >= max_new_tokens)
        if not carry:  # (generate's program, op for op)
            step_logits, cache, _ = model(tok[:, None], (start + i)[:, None], cache, layers)
            return i + 1, key, cache, step_logits[:, 0], toks, lps, lengths, recent, done
        step_logits, cache, _ = model(tok[:, None], jnp.where(was_done, -1, start + i)[:, None], cache, layers)
        step_logits = jnp.where(was_done[:, None], logits, step_logits[:, 0])
        return i + 1, key, cache, step_logits, toks, lps, lengths, recent, done

    init = (
        jnp.int32(0),
        key,
        cache,
        logits,
        jnp.full((b, n), config.pad_id, jnp.int32),
        jnp.zeros((b, n), jnp.float32),
        jnp.zeros((b,), jnp.int32),
        jnp.full((b, width), -1, jnp.int32),  # the last `width` generated tokens
        max_new_tokens <= 0,
    )
    _, _, cache, logits, toks, lps, lengths, _, _ = jax.lax.while_loop(cond, body, init)
    return toks, lps, lengths, cache, logits


# ---------------------------------------------------------------------------------------- a carried cache
@flax.struct.dataclass
class DecodeState:
    """A batch's live KV cache between sampling calls (multi-turn episodes: `start_decode`, `decode_turn`,
    `extend`): the cache, each row's next-token logits [B, V] (after its last token) and its next position [B]
    (the tokens it holds). Every row's tokens sit at positions 0, 1, ...; slots a row does not use (prompt
    padding, steps after it stopped, observation padding) hold position -1, invisible to every query."""

    cache: KVCache
    logits: jax.Array
    pos: jax.Array


def decodes_unstacked(cfg) -> bool:
    """Whether the sampler runs the layers as a Python loop over weights unstacked once, outside the decode loop,
    with a per-layer cache: on XLA CPU, where a scanned layer's weights and cache are copied out of the stack at
    every decode step (a GRPO step on SmolLM2, 8 x 8 samples: ~16.9 -> ~15.4 s; compile time grows with depth), and
    whenever ``cfg.scan_layers`` is False. Elsewhere the layers stay scanned.

    (Tried: the stacked cache carried through the layer scan and written in place. It removes the cache's copy per
    decode step, but the learner's forward passes, which differentiate through a cache, then keep the whole stack
    per layer: that GRPO step took 18.4 s and twice the memory.)"""
    return not cfg.scan_layers or jax.default_backend() == "cpu"


def _model_layers(graphdef, state):
    """(model, its unstacked layers or None: `decodes_unstacked`)."""
    model = nnx.merge(graphdef, state)
    return model, (model.layer_states() if decodes_unstacked(model.cfg) else None)


def _prefill(model, layers, prompts, prompt_lens, cache_len: int) -> DecodeState:
    """Right-padded prompts [B, P] (lengths [B]) into a fresh cache of ``cache_len`` slots (slots 0..P-1; padding
    after each prompt invisible) -> DecodeState; the LM head runs on each row's last prompt position only."""
    b, p = prompts.shape
    cache = init_cache(model.cfg, b, cache_len, stacked=layers is None)
    prompt_lens = jnp.asarray(prompt_lens, jnp.int32)
    ar = jnp.arange(p, dtype=jnp.int32)[None]
    h, cache, _ = model.hidden(prompts, jnp.where(ar < prompt_lens[:, None], ar, -1), cache, layers)
    h_last = jnp.take_along_axis(h, (prompt_lens - 1)[:, None, None], axis=1)[:, 0]
    return DecodeState(cache=cache, logits=model.logits(h_last), pos=prompt_lens)


def start_decode(graphdef, state, prompts, prompt_lens, cache_len: int) -> DecodeState:
    """Prefill right-padded prompts [B, P] (lengths [B]) into a fresh cache of ``cache_len`` slots (slots 0..P-1,
    as `generate` does) -> DecodeState. ``cache_len`` is every token the rows will ever hold, padding included;
    a cache past the model's ``max_seq_len`` raises ValueError (at trace time, before anything runs). Jittable."""
    model, layers = _model_layers(graphdef, state)
    p = prompts.shape[1]
    if p > cache_len or cache_len > model.cfg.max_seq_len:
        raise ValueError(f"KV cache of {cache_len} slots: need prompt width {p} <= it <= the model's max_seq_len "
                         f"{model.cfg.max_seq_len}")
    return _prefill(model, layers, prompts, prompt_lens, cache_len)


def repeat_rows(dec: DecodeState, times: int) -> DecodeState:
    """Each row of a DecodeState ``times`` times, consecutively (row r -> rows r*times .. r*times + times - 1): a
    prefix every row shares (one row -> ``times`` rows), a prompt a group shares. Jittable."""
    rows = lambda x, axis: jnp.repeat(x, times, axis=axis)
    bufs = dec.cache.buffers
    bufs = (tuple({k: rows(v, 0) for k, v in layer.items()} for layer in bufs) if isinstance(bufs, tuple)
            else {k: rows(v, 1) for k, v in bufs.items()})  # stacked: [n_layers, B, ...]
    cache = KVCache(buffers=bufs, pos=rows(dec.cache.pos, 0), end=dec.cache.end)
    return DecodeState(cache=cache, logits=rows(dec.logits, 0), pos=rows(dec.pos, 0))


def extend(graphdef, state, dec: DecodeState, tokens, n, chunk: int | None = None) -> DecodeState:
    """Prefill each row's tokens[b, :n[b]] (tokens [B, W], ragged n [B]) into the live cache at its next
    positions, ``chunk`` tokens a call (default W at once): the cache's next W slots are used, a row's unused
    ones invisible; a row with n = 0 keeps its cache's contents and logits. Jittable."""
    model, layers = _model_layers(graphdef, state)
    tokens, n = jnp.asarray(tokens, jnp.int32), jnp.asarray(n, jnp.int32)
    w = tokens.shape[1]
    chunk = w if not chunk else min(chunk, w)
    cache, h_last = dec.cache, jnp.zeros((tokens.shape[0], model.cfg.d_model), model.cfg.jdtype)
    for c0 in range(0, w, chunk):
        ar = c0 + jnp.arange(min(chunk, w - c0), dtype=jnp.int32)[None]
        h, cache, _ = model.hidden(tokens[:, c0:c0 + ar.shape[1]], jnp.where(ar < n[:, None], dec.pos[:, None] + ar, -1),
                                   cache, layers)
        last = n - 1 - c0  # each row's last token, where it falls in this chunk
        here = (last >= 0) & (last < ar.shape[1])
        h_at = jnp.take_along_axis(h, jnp.clip(last, 0, ar.shape[1] - 1)[:, None, None], axis=1)[:, 0]
        h_last = jnp.where(here[:, None], h_at.astype(h_last.dtype), h_last)
    logits = jnp.where((n > 0)[:, None], model.logits(h_last), dec.logits)
    return DecodeState(cache=cache, logits=logits, pos=dec.pos + n)


def decode_turn(graphdef, state, dec: DecodeState, key, stop_tokens, max_new_tokens, stop_sequences=None, *,
                config: SamplerConfig) -> tuple[SampleOutput, DecodeState]:
    """`generate`'s decode loop from a live cache: the same draws for the same key as `generate` on each row's
    whole context so far (same tokens; log-probs within float tolerance) -> (SampleOutput, the cache with the
    new tokens). Uses at most ``config.max_new_tokens`` more slots (the loop's steps); a row with
    max_new_tokens[b] = 0 samples nothing and keeps its cache. Arguments as `generate`'s. Jittable."""
    model, layers = _model_layers(graphdef, state)
    b = dec.pos.shape[0]
    seqs = jnp.full((b, 0, 0), -1, jnp.int32) if stop_sequences is None else jnp.asarray(stop_sequences, jnp.int32)
    toks, lps, lengths, cache, logits = _decode(model, layers, dec.cache, dec.logits, dec.pos, key, stop_tokens,
                                                max_new_tokens, seqs, config, carry=True)
    return SampleOutput(tokens=toks, logprobs=lps, lengths=lengths), DecodeState(cache, logits, dec.pos + lengths)


@functools.partial(jax.jit, static_argnames=("graphdef", "config", "mesh", "axis"))
def generate_data_parallel(graphdef, state, prompts, prompt_lens, key, stop_tokens, max_new_tokens,
                           stop_sequences=None, *, config: SamplerConfig, mesh: Mesh, axis: str = "data"):
    """`generate` with the batch (B divisible by ``mesh.shape[axis]``) split over mesh axis ``axis``;
    weights replicated; each device loops on its own rows (other mesh axes repeat the work). Shard
    ``s`` samples with ``fold_in(key, s)``, so sampled tokens differ from `generate`'s; greedy
    output is the same."""
    if axis not in mesh.shape:
        raise ValueError(f"mesh has no axis {axis!r} (axes: {tuple(mesh.shape)})")
    check_batch_divides(prompts.shape[0], mesh, (axis,))

    if stop_sequences is None:
        stop_sequences = jnp.full((prompts.shape[0], 0, 0), -1, jnp.int32)

    def local(state, prompts, prompt_lens, key, stop_tokens, max_new_tokens, stop_sequences):
        key = jax.random.fold_in(key, jax.lax.axis_index(axis))
        return generate(graphdef, state, prompts, prompt_lens, key, stop_tokens, max_new_tokens, stop_sequences,
                        config=config)

    rows = P(axis)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), rows, rows, P(), rows, rows, rows), out_specs=rows,
                         check_vma=False)(state, prompts, prompt_lens, key, stop_tokens, max_new_tokens, stop_sequences)


def prepare(model_cfg, prompts, prompt_lens, config: SamplerConfig, stop_tokens=None, max_new_tokens=None):
    """Validate shapes/lengths on the host (before compilation); return normalised jnp arguments."""
    prompts = jnp.asarray(prompts, jnp.int32)
    if prompts.ndim != 2:
        raise ValueError(f"prompts must be [batch, prompt_len], got shape {prompts.shape}")
    b, p = prompts.shape
    prompt_lens = jnp.full((b,), p, jnp.int32) if prompt_lens is None else jnp.asarray(prompt_lens, jnp.int32)
    if prompt_lens.shape != (b,):
        raise ValueError(f"prompt_lens must have shape ({b},), got {prompt_lens.shape}")
    model_cfg.check_cache(p, config.max_new_tokens, config.cache_len or p + config.max_new_tokens)
    if stop_tokens is None:
        stop_tokens = jnp.full((b, 1), -1, jnp.int32)
    stop_tokens = jnp.asarray(stop_tokens, jnp.int32)
    stop_tokens = jnp.broadcast_to(stop_tokens, (b, stop_tokens.shape[-1])) if stop_tokens.ndim == 1 else stop_tokens
    if stop_tokens.shape[0] != b:
        raise ValueError(f"stop_tokens must be [S] or [{b}, S], got {stop_tokens.shape}")
    if max_new_tokens is None:
        max_new_tokens = config.max_new_tokens
    max_new_tokens = jnp.broadcast_to(jnp.asarray(max_new_tokens, jnp.int32), (b,))
    return prompts, prompt_lens, stop_tokens, max_new_tokens


def _stop_sequences(stop_sequences, b: int):
    """None, a list of token-id lists, or an array [Q, L] / [B, Q, L] -> None or int32 [B, Q, L]."""
    if stop_sequences is None:
        return None
    if isinstance(stop_sequences, (list, tuple)):  # token-id lists, the same for every row
        return stop_sequence_array(stop_sequences, b)
    arr = jnp.asarray(stop_sequences, jnp.int32)
    if arr.ndim == 2:
        arr = jnp.broadcast_to(arr, (b,) + arr.shape)
    if arr.ndim != 3 or arr.shape[0] != b:
        raise ValueError(f"stop_sequences must be [Q, L] or [{b}, Q, L], got {arr.shape}")
    return arr


def sample(model, prompts, prompt_lens, key, config: SamplerConfig, stop_tokens=None, max_new_tokens=None,
           mesh: Mesh | None = None, axis: str = "data", stop_sequences=None) -> SampleOutput:
    """Convenience wrapper: validate, split the NNX model, run the jitted `generate` (with ``mesh``:
    `generate_data_parallel` over mesh axis ``axis``). ``stop_sequences``: a list of token-id lists,
    or an array [Q, L] / [B, Q, L] from `stop_sequence_array`."""
    args = prepare(model.cfg, prompts, prompt_lens, config, stop_tokens, max_new_tokens)
    seqs = _stop_sequences(stop_sequences, args[0].shape[0])
    graphdef, state = nnx.split(model)
    run = generate if mesh is None else functools.partial(generate_data_parallel, mesh=mesh, axis=axis)
    return run(graphdef, state, *args[:2], key, *args[2:], seqs, config=config)


def sample_joined(model, prompts, prompt_lens, key, config: SamplerConfig, stop_tokens=None, max_new_tokens=None,
                  mesh: Mesh | None = None, axis: str = "data", stop_sequences=None) -> JoinedSample:
    """`sample` (data-parallel with ``mesh``), then `join_sample` (pad_id = config.pad_id)."""
    args = prepare(model.cfg, prompts, prompt_lens, config, stop_tokens, max_new_tokens)
    out = sample(model, *args[:2], key, config, *args[2:], mesh=mesh, axis=axis, stop_sequences=stop_sequences)
    return join_sample(args[0], args[1], out, config.pad_id)
