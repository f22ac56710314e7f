"""Basic layers: Linear (optionally FP8), RMSNorm, rotary embedding (HF rotate-half layout), SwiGLU.

Parameter names (`kernel` [in, out], `bias`, `scale`) are what `hf_import` and `sharding` match.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_reason.models.lm.config import LMConfig
from jaxrl_reason.models.lm.fp8 import fp8_matmul


class Linear(nnx.Module):
    """y = x @ kernel (+ LoRA delta) (+ bias). kernel [d_in, d_out]; FP8 matmul when cfg.fp8."""

    def __init__(self, d_in: int, d_out: int, cfg: LMConfig, *, rngs: nnx.Rngs, bias: bool = False):
        init = jax.nn.initializers.normal(cfg.init_std)
        self.kernel = nnx.Param(init(rngs.params(), (d_in, d_out), cfg.jparam_dtype))
        self.bias = nnx.Param(jnp.zeros((d_out,), cfg.jparam_dtype)) if bias else None
        self.fp8, self.block, self.dtype = cfg.fp8, cfg.fp8_block, cfg.jdtype
        self.lora = None  # a `lora.LoRA` adapter once `lora.apply_lora` adds one: y += lora(x)

    def __call__(self, x: jax.Array) -> jax.Array:
        w = self.kernel[...]
        if self.fp8:
            y = fp8_matmul(x, w, self.block).astype(self.dtype)
        else:
            y = jnp.dot(x.astype(self.dtype), w.astype(self.dtype), preferred_element_type=jnp.float32)
            y = y.astype(self.dtype)
        if self.lora is not None:
            y = y + self.lora(x, self.dtype)
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y


class RMSNorm(nnx.Module):
    """x / rms(x) * scale, computed in float32. scale [d]."""

    def __init__(self, d: int, cfg: LMConfig):
        self.scale = nnx.Param(jnp.ones((d,), cfg.jparam_dtype))
        self.eps, self.dtype = cfg.norm_eps, cfg.jdtype

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (y * self.scale[...].astype(jnp.float32)).astype(self.dtype)


def rope_inv_freq(d: int, theta: float, scaling: tuple | None = None) -> jax.Array:
    """Inverse frequencies [D/2] (float32) of RoPE over a head dim D; `scaling` is `LMConfig.rope_scaling`.

    llama3 (as HF's modeling_rope_utils): wavelengths above original_max_position_embeddings /
    low_freq_factor are divided by factor, those below .../high_freq_factor are kept, and the band
    between is interpolated smoothly. yarn: see `_yarn_inv_freq` (and `rope_attention_factor`).
    """
    inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    if scaling is None:
        return inv_freq
    s = dict(scaling)
    if s["rope_type"] == "yarn":
        return _yarn_inv_freq(d, theta, s)
    if s["rope_type"] != "llama3":
        raise ValueError(f"rope_scaling type {s['rope_type']!r} is not implemented")
    factor, lo, hi, old = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_position_embeddings"]
    wavelen = 2 * jnp.pi / inv_freq
    scaled = jnp.where(wavelen > old / lo, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
    return jnp.where(medium, smoothed, scaled)


def _yarn_inv_freq(d: int, theta: float, s: dict) -> jax.Array:
    """YaRN (HF's _compute_yarn_parameters): frequencies with fewer than beta_slow rotations over the
    original context are divided by factor, those with more than beta_fast kept, a linear ramp between."""
    factor, old = s["factor"], s["original_max_position_embeddings"]
    pos_freqs = theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d)
    dim_of = lambda rot: d * math.log(old / (rot * 2 * math.pi)) / (2 * math.log(theta))  # dim with `rot` rotations
    low, high = dim_of(s.get("beta_fast") or 32), dim_of(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    ramp = jnp.clip((jnp.arange(d // 2, dtype=jnp.float32) - low) / ((high + 0.001 if high == low else high) - low), 0, 1)
    return (1.0 / (factor * pos_freqs)) * ramp + (1.0 / pos_freqs) * (1 - ramp)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention-scale term 0.1 * mscale * ln(factor) + 1 (1 for factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_attention_factor(scaling: tuple | None) -> float:
    """Multiplier of cos and sin (HF's ``attention_scaling``): YaRN's attention_factor, else 1."""
    s = dict(scaling or ())
    if s.get("rope_type") != "yarn":
        return 1.0
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])
    m, m_all = s.get("mscale"), s.get("mscale_all_dim")
    if m and m_all:
        return yarn_mscale(s["factor"], m) / yarn_mscale(s["factor"], m_all)
    return yarn_mscale(s["factor"])


def rope(x: jax.Array, positions: jax.Array, theta: float, scaling: tuple | None = None) -> jax.Array:
    """Rotary embedding, HF/Llama rotate-half layout. x [B, T, ..., D] (D even), positions [B, T];
    `scaling`: `LMConfig.rope_scaling` (see `rope_inv_freq`)."""
    d = x.shape[-1]
    inv_freq = rope_inv_freq(d, theta, scaling)  # [D/2]
    ang = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
    ang = ang.reshape(ang.shape[:2] + (1,) * (x.ndim - 3) + ang.shape[-1:])
    af = rope_attention_factor(scaling)
    cos, sin = jnp.cos(ang) * af, jnp.sin(ang) * af
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., : d // 2], xf[..., d // 2 :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


class SwiGLU(nnx.Module):
    """down(silu(gate(x)) * up(x)); d_model -> d_ff -> d_model."""

    def __init__(self, d_model: int, d_ff: int, cfg: LMConfig, *, rngs: nnx.Rngs):
        self.gate = Linear(d_model, d_ff, cfg, rngs=rngs)
        self.up = Linear(d_model, d_ff, cfg, rngs=rngs)
        self.down = Linear(d_ff, d_model, cfg, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x))
