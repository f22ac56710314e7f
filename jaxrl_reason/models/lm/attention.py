"""Causal self-attention: grouped-query attention and DeepSeek multi-head latent attention (MLA).

KV cache of one layer is a dict of preallocated buffers with a slot axis S:
  GQA: {"k": [B, n_kv_heads, head_dim, S], "v": [B, n_kv_heads, S, head_dim]}
  MLA: {"c": [B, S, kv_lora_rank], "kr": [B, S, qk_rope_dim]}   (compressed latent + shared RoPE key)
GQA keys are stored transposed so that both attention products read the cache in the layout the
matmul wants (no per-step transpose of the whole cache during decoding).
A layer receives a `LayerCache`: its buffers, the first slot this call writes (`slot`, one scalar for
the whole batch, so the write is a single in-place `dynamic_update_slice`) and the token position held
in every slot (`pos` [B, S], -1 = empty or padding). Slot index and token position are decoupled:
right-padded prompts of different lengths are written at slots 0..P-1 with their padding marked -1,
and every sequence's decode step i goes to slot P+i at its own position prompt_len+i.
A query at position p attends to the slots whose position is in [0, p].
Without a cache the layer attends over its own T tokens.

MLA absorbed mode folds W_uk into the query and applies W_uv after attention: attention becomes
multi-query attention over the latent (key = [c; k_rope], value = c), identical in exact arithmetic.
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_reason.models.lm.config import LMConfig
from jaxrl_reason.models.lm.layers import Linear, RMSNorm, rope

_NEG = -1e30


def attend(q, k, v, q_pos, k_pos, scale: float) -> jax.Array:
    """Masked softmax attention with KV-head groups.

    q [B, T, H, Dq], k [B, Hk, Dq, S], v [B, Hk, S, Dv], q_pos [B, T], k_pos [B, S] -> [B, T, H, Dv].
    Key j is visible to query i iff 0 <= k_pos[j] <= q_pos[i].
    """
    b, t, h, dq = q.shape
    hk = k.shape[1]
    qg = q.reshape(b, t, hk, h // hk, dq)
    decode = t == 1 and jax.default_backend() == "cpu"
    if decode:  # XLA CPU runs tiny batched dots slowly; broadcast-multiply + reduce is ~3x faster here
        prod = qg[:, 0, :, :, :, None].astype(jnp.float32) * k[:, :, None].astype(jnp.float32)  # [B, Hk, G, Dq, S]
        s = jnp.sum(prod, axis=3)[:, :, :, None] * scale  # [B, Hk, G, 1, S]
    else:
        s = jnp.einsum("btkgd,bkds->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
    mask = (k_pos[:, None, :] <= q_pos[:, :, None]) & (k_pos[:, None, :] >= 0)  # [B, T, S]
    s = jnp.where(mask[:, None, None], s, _NEG)
    p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    if decode:
        o = jnp.sum(p[:, :, :, 0, :, None].astype(jnp.float32) * v[:, :, None].astype(jnp.float32), axis=3)
        o = o[:, None]  # [B, 1, Hk, G, Dv]
    else:
        o = jnp.einsum("bkgts,bksd->btkgd", p, v, preferred_element_type=jnp.float32)
    return o.reshape(b, t, h, v.shape[-1]).astype(v.dtype)


@flax.struct.dataclass
class LayerCache:
    """One layer's view of the KV cache (see module docstring).

    buffers: dict of [B, ..., S, ...] arrays; slot: int32 scalar, first slot written by this call;
    pos: [B, S] int32 token position per slot after this call's write (-1 = empty).
    """

    buffers: dict
    slot: jax.Array
    pos: jax.Array


#: slot axis of each buffer of one layer's cache ([B, ...] arrays, see module docstring)
SLOT_AXIS = {"k": 3, "v": 2, "c": 1, "kr": 1}


def _keys(cache: LayerCache | None, new: dict, positions):
    """Write `new` (buffer layout, T slots) at `cache.slot`; return (all keys dict, key positions [B, S],
    updated buffers or None)."""
    if cache is None:
        return new, positions, None
    bufs = {name: jax.lax.dynamic_update_slice_in_dim(buf, new[name].astype(buf.dtype), cache.slot, SLOT_AXIS[name])
            for name, buf in cache.buffers.items()}
    return bufs, cache.pos, bufs


class GQAttention(nnx.Module):
    """Grouped-query attention (Llama/Qwen2 layout, names match HF)."""

    def __init__(self, cfg: LMConfig, *, rngs: nnx.Rngs):
        d, h, hk, hd = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.hd
        self.q_proj = Linear(d, h * hd, cfg, rngs=rngs, bias=cfg.qkv_bias)
        self.k_proj = Linear(d, hk * hd, cfg, rngs=rngs, bias=cfg.qkv_bias)
        self.v_proj = Linear(d, hk * hd, cfg, rngs=rngs, bias=cfg.qkv_bias)
        self.o_proj = Linear(h * hd, d, cfg, rngs=rngs)
        self.h, self.hk, self.hd, self.theta = h, hk, hd, cfg.rope_theta

    def __call__(self, x, positions, cache=None):
        """x [B, T, D], positions [B, T], cache: LayerCache or None -> (y [B, T, D], updated buffers or None)."""
        b, t, _ = x.shape
        q = rope(self.q_proj(x).reshape(b, t, self.h, self.hd), positions, self.theta)
        k = rope(self.k_proj(x).reshape(b, t, self.hk, self.hd), positions, self.theta)
        v = self.v_proj(x).reshape(b, t, self.hk, self.hd)
        new = {"k": k.transpose(0, 2, 3, 1), "v": v.transpose(0, 2, 1, 3)}  # [B, Hk, D, T], [B, Hk, T, D]
        kv, k_pos, cache = _keys(cache, new, positions)
        o = attend(q, kv["k"], kv["v"].astype(q.dtype), positions, k_pos, self.hd**-0.5)
        return self.o_proj(o.reshape(b, t, self.h * self.hd)), cache


class MLAttention(nnx.Module):
    """DeepSeek multi-head latent attention with decoupled RoPE key; naive or absorbed compute."""

    def __init__(self, cfg: LMConfig, *, rngs: nnx.Rngs):
        d, h = cfg.d_model, cfg.n_heads
        self.h, self.dn, self.dr, self.dv, self.dc = h, cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim, cfg.kv_lora_rank
        dq = self.dn + self.dr
        if cfg.q_lora_rank:
            self.q_a = Linear(d, cfg.q_lora_rank, cfg, rngs=rngs)
            self.q_norm = RMSNorm(cfg.q_lora_rank, cfg)
            self.q_b = Linear(cfg.q_lora_rank, h * dq, cfg, rngs=rngs)
        else:
            self.q_proj = Linear(d, h * dq, cfg, rngs=rngs)
        self.kv_a = Linear(d, self.dc + self.dr, cfg, rngs=rngs)  # -> [c_kv ; k_rope]
        self.kv_norm = RMSNorm(self.dc, cfg)
        self.k_up = Linear(self.dc, h * self.dn, cfg, rngs=rngs)  # W_uk
        self.v_up = Linear(self.dc, h * self.dv, cfg, rngs=rngs)  # W_uv
        self.o_proj = Linear(h * self.dv, d, cfg, rngs=rngs)
        self.q_lora, self.absorbed, self.theta, self.dtype = cfg.q_lora_rank, cfg.mla_absorbed, cfg.rope_theta, cfg.jdtype

    def __call__(self, x, positions, cache=None):
        """x [B, T, D], positions [B, T], cache: LayerCache or None -> (y [B, T, D], updated buffers or None)."""
        b, t, _ = x.shape
        h, dn, dr, dc = self.h, self.dn, self.dr, self.dc
        q = self.q_b(self.q_norm(self.q_a(x))) if self.q_lora else self.q_proj(x)
        q = q.reshape(b, t, h, dn + dr)
        q_nope, q_rope = q[..., :dn], rope(q[..., dn:], positions, self.theta)
        kv = self.kv_a(x)
        c = self.kv_norm(kv[..., :dc])  # [B, T, dc]
        kr = rope(kv[..., None, dc:], positions, self.theta)[:, :, 0]  # [B, T, dr]
        lat, k_pos, cache = _keys(cache, {"c": c, "kr": kr}, positions)
        c_all, kr_all = lat["c"].astype(self.dtype), lat["kr"].astype(self.dtype)
        s = c_all.shape[1]
        scale = (dn + dr) ** -0.5
        if self.absorbed:
            w_uk = self.k_up.kernel[...].astype(self.dtype).reshape(dc, h, dn)
            w_uv = self.v_up.kernel[...].astype(self.dtype).reshape(dc, h, self.dv)
            q_lat = jnp.einsum("bthn,chn->bthc", q_nope, w_uk, preferred_element_type=jnp.float32).astype(self.dtype)
            qq = jnp.concatenate([q_lat, q_rope], axis=-1)
            kk = jnp.concatenate([c_all, kr_all], axis=-1).transpose(0, 2, 1)[:, None]  # [B, 1, dc+dr, S]
            o_lat = attend(qq, kk, c_all[:, None], positions, k_pos, scale)  # [B, T, H, dc]
            o = jnp.einsum("bthc,chv->bthv", o_lat, w_uv, preferred_element_type=jnp.float32).astype(self.dtype)
        else:
            k_nope = self.k_up(c_all).reshape(b, s, h, dn)
            v = self.v_up(c_all).reshape(b, s, h, self.dv)
            k = jnp.concatenate([k_nope, jnp.broadcast_to(kr_all[:, :, None, :], (b, s, h, dr))], axis=-1)
            o = attend(jnp.concatenate([q_nope, q_rope], axis=-1), k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3),
                       positions, k_pos, scale)
        return self.o_proj(o.reshape(b, t, h * self.dv)), cache


def make_attention(cfg: LMConfig, rngs: nnx.Rngs) -> nnx.Module:
    return MLAttention(cfg, rngs=rngs) if cfg.attention == "mla" else GQAttention(cfg, rngs=rngs)


def init_layer_cache(cfg: LMConfig, batch: int, length: int, dtype=None) -> dict:
    """Zero cache of one layer (see module docstring for shapes)."""
    dtype = dtype or cfg.jdtype
    if cfg.attention == "mla":
        return {
            "c": jnp.zeros((batch, length, cfg.kv_lora_rank), dtype),
            "kr": jnp.zeros((batch, length, cfg.qk_rope_dim), dtype),
        }
    return {"k": jnp.zeros((batch, cfg.n_kv_heads, cfg.hd, length), dtype),
            "v": jnp.zeros((batch, cfg.n_kv_heads, length, cfg.hd), dtype)}
