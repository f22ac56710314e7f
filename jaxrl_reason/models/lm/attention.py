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
from jaxrl_reason.models.lm.layers import Linear, RMSNorm, rope, yarn_mscale

_NEG = -1e30


def attend(q, k, v, q_pos, k_pos, scale: float, window: int | None = None) -> jax.Array:
    """Masked softmax attention with KV-head groups.

    q [B, T, H, Dq], k [B, Hk, Dq, S], v [B, Hk, S, Dv], q_pos [B, T], k_pos [B, S] -> [B, T, H, Dv].
    Key j is visible to query i iff 0 <= k_pos[j] <= q_pos[i] (and q_pos[i] - window < k_pos[j] with a window).
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
    if window is not None:
        mask &= k_pos[:, None, :] > q_pos[:, :, None] - window
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
    """Grouped-query attention (Llama/Qwen2/Qwen3 layout, names match HF)."""

    def __init__(self, cfg: LMConfig, *, rngs: nnx.Rngs):
        d, h, hk, hd = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.hd
        self.q_proj = Linear(d, h * hd, cfg, rngs=rngs, bias=cfg.qkv_bias)
        self.k_proj = Linear(d, hk * hd, cfg, rngs=rngs, bias=cfg.qkv_bias)
        self.v_proj = Linear(d, hk * hd, cfg, rngs=rngs, bias=cfg.qkv_bias)
        self.o_proj = Linear(h * hd, d, cfg, rngs=rngs)
        # Qwen3: RMSNorm over head_dim of every q and k head, before RoPE
        self.q_norm = RMSNorm(hd, cfg) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg) if cfg.qk_norm else None
        self.h, self.hk, self.hd, self.theta, self.scaling = h, hk, hd, cfg.rope_theta, cfg.rope_scaling
        self.window = cfg.sliding_window

    def __call__(self, x, positions, cache=None):
        """x [B, T, D], positions [B, T], cache: LayerCache or None -> (y [B, T, D], updated buffers or None)."""
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, self.h, self.hd)
        k = self.k_proj(x).reshape(b, t, self.hk, self.hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = rope(q, positions, self.theta, self.scaling)
        k = rope(k, positions, self.theta, self.scaling)
        v = self.v_proj(x).reshape(b, t, self.hk, self.hd)
        new = {"k": k.transpose(0, 2, 3, 1), "v": v.transpose(0, 2, 1, 3)}  # [B, Hk, D, T], [B, Hk, T, D]
        kv, k_pos, cache = _keys(cache, new, positions)
        o = attend(q, kv["k"], kv["v"].astype(q.dtype), positions, k_pos, self.hd**-0.5, self.window)
        return self.o_proj(o.reshape(b, t, self.h * self.hd)), cache


class MLAttention(nnx.Module):
    """DeepSeek multi-head latent attention with decoupled RoPE key; naive or absorbed compute.

    Layout as HF DeepseekV3Attention: q_proj (or q_a -> q_norm -> q_b) gives per head [nope dn; rope dr];
    kv_a gives [c_kv dc; k_rope dr]; kv_b ([dc, H*(dn+dv)]) gives per head [k_nope dn; v dv].
    """

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
        self.kv_b = Linear(self.dc, h * (self.dn + self.dv), cfg, rngs=rngs)  # per head [W_uk; W_uv]
        self.o_proj = Linear(h * self.dv, d, cfg, rngs=rngs)
        self.q_lora, self.absorbed, self.theta, self.dtype = cfg.q_lora_rank, cfg.mla_absorbed, cfg.rope_theta, cfg.jdtype
        self.scaling, self.interleave = cfg.rope_scaling, cfg.mla_rope_interleave
        rs = dict(cfg.rope_scaling or ())
        m_all = rs.get("mscale_all_dim") if rs.get("rope_type") == "yarn" else None
        self.scale = dq**-0.5 * (yarn_mscale(rs["factor"], m_all) ** 2 if m_all else 1.0)

    def _rope(self, x, positions):
        """RoPE of the rope dims x [B, T, ..., dr]; interleaved pairs are first reordered to [even; odd]."""
        if self.interleave:
            x = jnp.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
        return rope(x, positions, self.theta, self.scaling)

    def __call__(self, x, positions, cache=None):
        """x [B, T, D], positions [B, T], cache: LayerCache or None -> (y [B, T, D], updated buffers or None)."""
        b, t, _ = x.shape
        h, dn, dr, dc = self.h, self.dn, self.dr, self.dc
        q = self.q_b(self.q_norm(self.q_a(x))) if self.q_lora else self.q_proj(x)
        q = q.reshape(b, t, h, dn + dr)
        q_nope, q_rope = q[..., :dn], self._rope(q[..., dn:], positions)
        kv = self.kv_a(x)
        c = self.kv_norm(kv[..., :dc])  # [B, T, dc]
        kr = self._rope(kv[..., None, dc:], positions)[:, :, 0]  # [B, T, dr]
        lat, k_pos, cache = _keys(cache, {"c": c, "kr": kr}, positions)
        c_all, kr_all = lat["c"].astype(self.dtype), lat["kr"].astype(self.dtype)
        s, scale = c_all.shape[1], self.scale
        if self.absorbed and self.kv_b.lora is None:  # (with a LoRA adapter on kv_b: naive, the adapter applied)
            w_ukv = self.kv_b.kernel[...].astype(self.dtype).reshape(dc, h, dn + self.dv)
            w_uk, w_uv = w_ukv[..., :dn], w_ukv[..., dn:]
            q_lat = jnp.einsum("bthn,chn->bthc", q_nope, w_uk, preferred_element_type=jnp.float32).astype(self.dtype)
            qq = jnp.concatenate([q_lat, q_rope], axis=-1)
            kk = jnp.concatenate([c_all, kr_all], axis=-1).transpose(0, 2, 1)[:, None]  # [B, 1, dc+dr, S]
            o_lat = attend(qq, kk, c_all[:, None], positions, k_pos, scale)  # [B, T, H, dc]
            o = jnp.einsum("bthc,chv->bthv", o_lat, w_uv, preferred_element_type=jnp.float32).astype(self.dtype)
        else:
            kv_b = self.kv_b(c_all).reshape(b, s, h, dn + self.dv)
            k_nope, v = kv_b[..., :dn], kv_b[..., dn:]
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
