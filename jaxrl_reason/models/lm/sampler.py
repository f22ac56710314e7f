"""Jitted batched sampler: one prefill, then a `lax.while_loop` of single-token decode steps on a
preallocated KV cache (compressed latent cache for MLA).

    out = sample(model, prompts, prompt_lens, key, SamplerConfig(max_new_tokens=64, temperature=0.7))
    out.tokens [B, N] int32 (pad_id after a sequence stops), out.logprobs [B, N] float32,
    out.lengths [B] (generated tokens, stop token included)

Prompts are right-padded [B, P] with their true lengths; sequence b writes its generated tokens at
positions prompt_lens[b], prompt_lens[b]+1, ... (cache slots P, P+1, ...; see `attention`). Each sequence stops at any of its own stop tokens
(`stop_tokens` [B, S] or [S], -1 = unused) or after its own `max_new_tokens[b]`; the loop exits when
all have stopped. `logprobs` are under the sampling distribution (temperature, top-k, top-p applied);
for greedy decoding (temperature 0) they are the model's own log-probabilities of the argmax.
`generate` is the pure function (graphdef static) for use inside larger jitted programs.

Data parallel (``sample(..., mesh=mesh)`` or `generate_data_parallel`): the batch is split over one
mesh axis and every device runs its own decode loop on its rows with replicated weights (shard_map),
so nothing crosses devices inside the loop and a shard exits as soon as its own rows have stopped.
On a CPU, a mesh of one host device per core (``jax.config.update("jax_num_cpu_devices", n)``
right after ``import jax``) decodes a small model faster than one device using the cores inside each
op (``experiments/bench_lm.py``).

For RL, ``out.join(prompts, prompt_lens)`` (or `sample_joined`) gives a `JoinedSample`: the
[B, P+N] sequences (each completion right after its own prompt) with prompt / completion masks and
the sampling log-probs at their positions, ready for `train.token_logprobs_entropy`.
"""

from __future__ import annotations

import dataclasses
import functools

import flax
import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, PartitionSpec as P

from jaxrl_reason.models.lm.model import init_cache
from jaxrl_reason.parallel.mesh import check_batch_divides
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    max_new_tokens: int = 32
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
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
    b, p = prompts.shape
    n = out.tokens.shape[1]
    idx = jnp.arange(p + n, dtype=jnp.int32)[None]
    plens = jnp.asarray(prompt_lens, jnp.int32)[:, None]
    prompt_mask = idx < plens
    rel = idx - plens  # index into the completion
    completion_mask = (rel >= 0) & (rel < out.lengths[:, None])
    gather = jnp.clip(rel, 0, n - 1)
    comp = jnp.take_along_axis(out.tokens, gather, axis=1)
    padded = jnp.pad(jnp.asarray(prompts, jnp.int32), ((0, 0), (0, n)))
    tokens = jnp.where(prompt_mask, padded, jnp.where(completion_mask, comp, pad_id))
    logprobs = jnp.where(completion_mask, jnp.take_along_axis(out.logprobs, gather, axis=1), 0.0)
    return JoinedSample(tokens=tokens, prompt_mask=prompt_mask, completion_mask=completion_mask, logprobs=logprobs,
                        prompt_lens=plens[:, 0], lengths=out.lengths)


def sampling_logprobs(logits: jax.Array, temperature: float, top_k: int = 0, top_p: float = 1.0) -> jax.Array:
    """logits [..., V] -> log-probs [..., V] of the tempered, top-k and top-p truncated distribution."""
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
    return jax.nn.log_softmax(x, axis=-1)


def _choose(key, logits, cfg: SamplerConfig):
    """logits [B, V] -> (token [B] int32, its log-prob [B])."""
    if cfg.temperature == 0.0:
        tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    else:
        lp = sampling_logprobs(logits, cfg.temperature, cfg.top_k, cfg.top_p)
        tok = jax.random.categorical(key, lp, axis=-1).astype(jnp.int32)
    return tok, jnp.take_along_axis(lp, tok[:, None], axis=-1)[:, 0]


@functools.partial(jax.jit, static_argnames=("graphdef", "config"))
def generate(graphdef, state, prompts, prompt_lens, key, stop_tokens, max_new_tokens, *, config: SamplerConfig):
    """Pure sampler. prompts [B, P] int32, prompt_lens [B], stop_tokens [B, S] (-1 unused),
    max_new_tokens [B] (<= config.max_new_tokens) -> SampleOutput."""
    model = nnx.merge(graphdef, state)
    b, p = prompts.shape
    n = config.max_new_tokens
    # unrolled layers: weights unstacked once and a per-layer cache, so the decode loop copies neither
    layers = None if model.cfg.scan_layers else model.layer_states()
    cache = init_cache(model.cfg, b, config.cache_len or p + n, stacked=layers is None)
    ar = jnp.arange(p, dtype=jnp.int32)[None]
    pos = jnp.where(ar < prompt_lens[:, None], ar, -1)  # padding after each prompt stays invisible
    h, cache, _ = model.hidden(prompts, pos, cache, layers)
    h_last = jnp.take_along_axis(h, (prompt_lens - 1)[:, None, None], axis=1)[:, 0]
    logits = model.logits(h_last)  # [B, V]

    def cond(c):
        i, *_, done = c
        return (i < n) & ~jnp.all(done)

    def body(c):
        i, key, cache, logits, toks, lps, lengths, done = c
        key, sub = jax.random.split(key)
        tok, lp = _choose(sub, logits, config)
        tok = jnp.where(done, config.pad_id, tok)
        toks = toks.at[:, i].set(tok)
        lps = lps.at[:, i].set(jnp.where(done, 0.0, lp))
        lengths = lengths + (~done).astype(jnp.int32)
        hit = jnp.any(tok[:, None] == stop_tokens, axis=-1)
        done = done | hit | (lengths >= max_new_tokens)
        step_logits, cache, _ = model(tok[:, None], (prompt_lens + i)[:, None], cache, layers)
        return i + 1, key, cache, step_logits[:, 0], toks, lps, lengths, done

    init = (
        jnp.int32(0),
        key,
        cache,
        logits,
        jnp.full((b, n), config.pad_id, jnp.int32),
        jnp.zeros((b, n), jnp.float32),
        jnp.zeros((b,), jnp.int32),
        max_new_tokens <= 0,
    )
    _, _, _, _, toks, lps, lengths, _ = jax.lax.while_loop(cond, body, init)
    return SampleOutput(tokens=toks, logprobs=lps, lengths=lengths)


@functools.partial(jax.jit, static_argnames=("graphdef", "config", "mesh", "axis"))
def generate_data_parallel(graphdef, state, prompts, prompt_lens, key, stop_tokens, max_new_tokens, *,
                           config: SamplerConfig, mesh: Mesh, axis: str = "data"):
    """`generate` with the batch (B divisible by ``mesh.shape[axis]``) split over mesh axis ``axis``;
    weights replicated; each device loops on its own rows (other mesh axes repeat the work). Shard
    ``s`` samples with ``fold_in(key, s)``, so sampled tokens differ from `generate`'s; greedy
    output is the same."""
    if axis not in mesh.shape:
        raise ValueError(f"mesh has no axis {axis!r} (axes: {tuple(mesh.shape)})")
    check_batch_divides(prompts.shape[0], mesh, (axis,))

    def local(state, prompts, prompt_lens, key, stop_tokens, max_new_tokens):
        key = jax.random.fold_in(key, jax.lax.axis_index(axis))
        return generate(graphdef, state, prompts, prompt_lens, key, stop_tokens, max_new_tokens, config=config)

    rows = P(axis)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), rows, rows, P(), rows, rows), out_specs=rows,
                         check_vma=False)(state, prompts, prompt_lens, key, stop_tokens, max_new_tokens)


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


def sample(model, prompts, prompt_lens, key, config: SamplerConfig, stop_tokens=None, max_new_tokens=None,
           mesh: Mesh | None = None, axis: str = "data") -> SampleOutput:
    """Convenience wrapper: validate, split the NNX model, run the jitted `generate` (with ``mesh``:
    `generate_data_parallel` over mesh axis ``axis``)."""
    args = prepare(model.cfg, prompts, prompt_lens, config, stop_tokens, max_new_tokens)
    graphdef, state = nnx.split(model)
    run = generate if mesh is None else functools.partial(generate_data_parallel, mesh=mesh, axis=axis)
    return run(graphdef, state, *args[:2], key, *args[2:], config=config)


def sample_joined(model, prompts, prompt_lens, key, config: SamplerConfig, stop_tokens=None, max_new_tokens=None,
                  mesh: Mesh | None = None, axis: str = "data") -> JoinedSample:
    """`sample` (data-parallel with ``mesh``), then `join_sample` (pad_id = config.pad_id)."""
    args = prepare(model.cfg, prompts, prompt_lens, config, stop_tokens, max_new_tokens)
    out = sample(model, *args[:2], key, config, *args[2:], mesh=mesh, axis=axis)
    return join_sample(args[0], args[1], out, config.pad_id)
