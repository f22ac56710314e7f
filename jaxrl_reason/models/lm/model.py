"""Decoder-only transformer (flax NNX) with layers stacked on a leading axis and run by `lax.scan`.

    model = Transformer(cfg, rngs=nnx.Rngs(0))
    logits, cache, aux = model(tokens)                     # tokens [B, T] -> logits [B, T, V] f32
    h, cache, aux = model.hidden(tokens, positions, cache)  # pre-norm hidden [B, T, D]
    logits = model.logits(h)                                # final norm + (tied) head

`aux`: {"load": [L, E] expert load per MoE layer, "balance_loss": []} for MoE models, else {}.
With ``cfg.moe_first_dense = k`` the first k layers are dense and stacked apart (``dense_blocks``,
scanned first); ``blocks`` then holds the L - k MoE layers (and "load" is [L - k, E]).
Compile time does not grow with depth (one scanned block; `scan_layers=False` unrolls the scan,
which can be faster for small models on CPU); `cfg.remat` checkpoints each block.
The cache (see `init_cache`) is a `KVCache`: per-layer buffers stacked on the same leading axis (or,
``stacked=False``, a tuple of per-layer dicts), the token position held in each slot, and the next
free slot. ``hidden`` writes its T tokens at slots
``cache.end .. cache.end+T-1`` and records ``positions`` there (pass position -1 for padding tokens
that later queries must not see).

Decode loops: slicing stacked weights and cache inside a `while_loop` copies them at every step on XLA CPU.
`layer_states()` unstacks the weights once (outside the loop) and ``hidden(..., layers=...)`` runs the layers as a
Python loop over them, with a per-layer (``stacked=False``) cache whose buffers are updated in place; the sampler
does this on CPU and whenever ``cfg.scan_layers`` is False (`sampler.decodes_unstacked`).
"""

from __future__ import annotations

import dataclasses

import flax
import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_reason.models.lm.attention import LayerCache, init_layer_cache, make_attention
from jaxrl_reason.models.lm.config import LMConfig
from jaxrl_reason.models.lm.layers import Linear, RMSNorm, SwiGLU
from jaxrl_reason.models.lm.moe import MoE


@flax.struct.dataclass
class KVCache:
    """buffers: {name: [n_layers, B, ...]} (layout in `attention`), or a tuple of n_layers
    {name: [B, ...]} (``init_cache(..., stacked=False)``, for ``hidden(..., layers=...)``); pos: [B, S] int32 token position of
    each slot (-1 = empty); end: int32 scalar, the next slot to write (the same for every sequence)."""

    buffers: dict | tuple
    pos: jax.Array
    end: jax.Array


class Block(nnx.Module):
    """Pre-norm block: h + attn(norm(h)); h + mlp(norm(h)). Names match HF Llama/Qwen2."""

    def __init__(self, cfg: LMConfig, *, rngs: nnx.Rngs, moe: bool | None = None):
        moe = cfg.is_moe if moe is None else moe  # False: a dense layer of a MoE model (moe_first_dense)
        self.input_norm = RMSNorm(cfg.d_model, cfg)
        self.attn = make_attention(cfg, rngs)
        self.post_attn_norm = RMSNorm(cfg.d_model, cfg)
        self.mlp = MoE(cfg, rngs=rngs) if moe else SwiGLU(cfg.d_model, cfg.d_ff, cfg, rngs=rngs)
        self.is_moe = moe

    def __call__(self, h, positions, cache=None):
        a, cache = self.attn(self.input_norm(h), positions, cache)
        h = h + a
        if self.is_moe:
            m, aux = self.mlp(self.post_attn_norm(h))
        else:
            m, aux = self.mlp(self.post_attn_norm(h)), {}
        return h + m, cache, aux


class MTP(nnx.Module):
    """DeepSeek-V3 multi-token-prediction depth module (shares embedding and head with the model).

    h [B, T, D], next_emb = emb(tok_{t+1}) [B, T, D] -> h' [B, T, D], which predicts token t+2.
    ``cfg.mtp_layout``:
      "native": h' = Block(W [norm_h(h); norm_e(next_emb)]), h before the model's final norm;
        logits = the model's final norm + head.
      "deepseek" (HF DeepSeek-V3 layer N = num_hidden_layers, as vLLM's DeepSeekMTP runs it):
        h' = Block(W [norm_e(next_emb); norm_h(h)]) (enorm, hnorm, eh_proj), h after the final norm;
        logits = head(out_norm(h')) (shared_head.norm, then the model's head).
    """

    def __init__(self, cfg: LMConfig, *, rngs: nnx.Rngs):
        self.norm_h = RMSNorm(cfg.d_model, cfg)
        self.norm_e = RMSNorm(cfg.d_model, cfg)
        self.proj = Linear(2 * cfg.d_model, cfg.d_model, cfg, rngs=rngs)
        self.block = Block(cfg, rngs=rngs)
        self.out_norm = RMSNorm(cfg.d_model, cfg) if cfg.mtp_layout == "deepseek" else None

    def __call__(self, h, next_emb, positions):
        parts = [self.norm_h(h), self.norm_e(next_emb)]
        x = self.proj(jnp.concatenate(parts if self.out_norm is None else parts[::-1], axis=-1))
        out, _, aux = self.block(x, positions)
        return out, aux


class Transformer(nnx.Module):
    def __init__(self, cfg: LMConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        init = jax.nn.initializers.normal(cfg.init_std)
        self.embed = nnx.Param(init(rngs.params(), (cfg.vocab_size, cfg.d_model), cfg.jparam_dtype))

        def stack(n: int, moe: bool):
            @nnx.split_rngs(splits=n)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def make_blocks(r):
                return Block(cfg, rngs=r, moe=moe)

            return make_blocks(rngs)

        k = cfg.moe_first_dense
        self.dense_blocks = stack(k, False) if k else None  # layers 0..k-1 of a MoE model with dense first layers
        self.blocks = stack(cfg.n_layers - k, cfg.is_moe)
        self.final_norm = RMSNorm(cfg.d_model, cfg)
        self.lm_head = None if cfg.tie_embeddings else Linear(cfg.d_model, cfg.vocab_size, cfg, rngs=rngs)
        self.mtp = MTP(cfg, rngs=rngs) if cfg.mtp_depth else None

    def embed_tokens(self, tokens: jax.Array) -> jax.Array:
        return jnp.take(self.embed[...], tokens, axis=0).astype(self.cfg.jdtype)

    def _stacks(self) -> list[tuple[nnx.Module, int]]:
        """(stacked blocks, number of layers) in layer order: the dense first layers (if any), then the rest."""
        k = self.cfg.moe_first_dense
        return ([(self.dense_blocks, k)] if k else []) + [(self.blocks, self.cfg.n_layers - k)]

    def layer_states(self) -> list:
        """The stacked blocks' state as ``n_layers`` per-layer states (each array sliced once)."""
        out = []
        for blocks, n in self._stacks():
            state = nnx.state(blocks)
            out += [jax.tree.map(lambda x, i=i: x[i], state) for i in range(n)]
        return out

    def hidden(self, tokens, positions=None, cache: KVCache | None = None, layers: list | None = None):
        """tokens [B, T] int32, positions [B, T] (default 0..T-1), cache or None -> (h [B,T,D], cache, aux).

        ``layers``: `layer_states()` to run the blocks as a Python loop over per-layer weights
        instead of a scan over the stacked ones; the cache must then be per-layer (``stacked=False``).
        """
        b, t = tokens.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        h = self.embed_tokens(tokens)
        stacks = [(nnx.split(blocks), n) for blocks, n in self._stacks()]
        if cache is not None:
            if isinstance(cache.buffers, tuple) != (layers is not None):
                raise ValueError("a per-layer cache (stacked=False) goes with layers=..., a stacked one without")
            slot_pos = jax.lax.dynamic_update_slice_in_dim(cache.pos, positions.astype(jnp.int32), cache.end, axis=1)

        def make_body(gdef):
            def body(h, xs):
                layer_state, layer_bufs = xs
                layer_cache = None if cache is None else LayerCache(layer_bufs, cache.end, slot_pos)
                h, layer_bufs, aux = nnx.merge(gdef, layer_state)(h, positions, layer_cache)
                return h, (layer_bufs, aux)

            return jax.checkpoint(body, prevent_cse=False) if self.cfg.remat else body

        bodies = [(make_body(gdef), n) for (gdef, _), n in stacks]
        if layers is None:
            bufs, start = [], 0
            for ((_, bstate), n), (body, _) in zip(stacks, bodies):
                sub = None if cache is None else cache.buffers
                if cache is not None and len(stacks) > 1:  # this stack's layers of the stacked cache
                    sub = {name: b[start:start + n] for name, b in sub.items()}
                h, (sub, aux) = jax.lax.scan(body, h, (bstate, sub), unroll=not self.cfg.scan_layers)
                bufs.append(sub)
                start += n
            # aux: that of the last stack (the MoE layers; dense layers report none)
            bufs = bufs[0] if len(bufs) == 1 else jax.tree.map(lambda *b: jnp.concatenate(b), *bufs)
        else:
            outs, k = [], self.cfg.moe_first_dense
            for i, layer_state in enumerate(layers):
                body = bodies[0][0] if i < k else bodies[-1][0]
                h, out = body(h, (layer_state, None if cache is None else cache.buffers[i]))
                outs.append(out)
            bufs = tuple(o[0] for o in outs)
            aux = jax.tree.map(lambda *a: jnp.stack(a), *[o[1] for o in outs[k:]])
        if cache is not None:
            cache = KVCache(buffers=bufs, pos=slot_pos, end=cache.end + t)
        if aux:
            aux = {"load": aux["load"], "balance_loss": jnp.sum(aux["balance_loss"])}
        return h, cache, aux

    def logits(self, h: jax.Array) -> jax.Array:
        """h [..., D] (pre final norm) -> float32 logits [..., V]."""
        return self._head(self.final_norm(h))

    def _head(self, x: jax.Array) -> jax.Array:
        """normed x [..., D] -> float32 logits [..., V] ((tied) head only)."""
        if self.lm_head is None:
            return jnp.dot(x, self.embed[...].astype(x.dtype).T, preferred_element_type=jnp.float32)
        return self.lm_head(x).astype(jnp.float32)

    def mtp_hidden(self, h, tokens, positions=None):
        """MTP depth-1 hidden for predicting tokens[t+2] from h[t] and tokens[t+1]: [B, T-1, D]."""
        b, t = tokens.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t - 1, dtype=jnp.int32), (b, t - 1))
        if self.mtp.out_norm is not None:  # deepseek layout: the MTP reads the final-normed hidden
            h = self.final_norm(h)
        return self.mtp(h[:, :-1], self.embed_tokens(tokens[:, 1:]), positions)

    def mtp_logits(self, hm: jax.Array) -> jax.Array:
        """MTP hidden [..., D] (`mtp_hidden`) -> float32 logits [..., V] for token t+2."""
        return self.logits(hm) if self.mtp.out_norm is None else self._head(self.mtp.out_norm(hm))

    def __call__(self, tokens, positions=None, cache=None, layers=None):
        h, cache, aux = self.hidden(tokens, positions, cache, layers)
        return self.logits(h), cache, aux


def init_cache(cfg: LMConfig, batch: int, length: int, dtype=None, stacked: bool = True) -> KVCache:
    """Empty KV cache of `length` slots, all empty: every buffer gets a leading [n_layers] axis, or
    (``stacked=False``) one dict of buffers per layer."""
    layer = init_layer_cache(cfg, batch, length, dtype)
    if stacked:
        buffers = {k: jnp.broadcast_to(v, (cfg.n_layers,) + v.shape) for k, v in layer.items()}
    else:
        buffers = tuple(dict(layer) for _ in range(cfg.n_layers))
    return KVCache(buffers=buffers, pos=jnp.full((batch, length), -1, jnp.int32), end=jnp.int32(0))


def cache_bytes_per_token(cache: KVCache) -> float:
    """Bytes of K/V (or latent) cache per token slot, all layers, from the actual buffers:
    nbytes / (B * S). The [B, S] int32 slot-position index (4 bytes per slot) is not counted."""
    b, s = cache.pos.shape
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache.buffers)) / (b * s)


def param_count(model: nnx.Module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def grow_vocab(model: Transformer, vocab_size: int) -> Transformer:
    """``model`` with ``vocab_size`` rows of embedding (and of an untied head): the new rows at the mean of the
    old ones (a new token starts as an average one)."""
    n = model.cfg.vocab_size
    if vocab_size <= n:
        return model
    cfg = dataclasses.replace(model.cfg, vocab_size=vocab_size)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    old = nnx.state(model)

    def grow(new, have):  # the embedding [V, d] and the head's kernel [d, V] grow along their vocabulary axis
        axis = [a for a, (x, y) in enumerate(zip(new.shape, have.shape)) if x != y]
        if not axis:
            return have
        mean = jnp.mean(have, axis=axis[0], keepdims=True)
        return jnp.concatenate([have, jnp.repeat(mean, vocab_size - n, axis=axis[0])], axis=axis[0])

    return nnx.merge(graphdef, jax.tree.map(grow, state, old))
