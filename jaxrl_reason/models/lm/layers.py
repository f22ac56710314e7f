"""Basic layers: Linear (optionally FP8), RMSNorm, rotary embedding (HF rotate-half layout), SwiGLU.

Parameter names (`kernel` [in, out], `bias`, `scale`) are what `hf_import` and `sharding` match.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_reason.models.lm.config import LMConfig
from jaxrl_reason.models.lm.fp8 import fp8_matmul


class Linear(nnx.Module):
    """y = x @ kernel (+ bias). kernel [d_in, d_out]; FP8 matmul when cfg.fp8."""

    def __init__(self, d_in: int, d_out: int, cfg: LMConfig, *, rngs: nnx.Rngs, bias: bool = False):
        init = jax.nn.initializers.normal(cfg.init_std)
        self.kernel = nnx.Param(init(rngs.params(), (d_in, d_out), cfg.jparam_dtype))
        self.bias = nnx.Param(jnp.zeros((d_out,), cfg.jparam_dtype)) if bias else None
        self.fp8, self.block, self.dtype = cfg.fp8, cfg.fp8_block, cfg.jdtype

    def __call__(self, x: jax.Array) -> jax.Array:
        w = self.kernel[...]
        if self.fp8:
            y = fp8_matmul(x, w, self.block).astype(self.dtype)
        else:
            y = jnp.dot(x.astype(self.dtype), w.astype(self.dtype), preferred_element_type=jnp.float32)
            y = y.astype(self.dtype)
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


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding, HF/Llama rotate-half layout. x [B, T, ..., D] (D even), positions [B, T]."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))  # [D/2]
    ang = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
    ang = ang.reshape(ang.shape[:2] + (1,) * (x.ndim - 3) + ang.shape[-1:])
    cos, sin = jnp.cos(ang), jnp.sin(ang)
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
