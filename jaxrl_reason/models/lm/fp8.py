"""FP8 (E4M3) matmul with DeepSeek-V3 fine-grained scaling, emulated exactly on any backend.

Activations are quantised in 1 x `block` tiles along the contracting dim, weights in
`block` x `block` blocks, each with scale amax / 448 (float32). The product is computed per
contracting-dim tile as an FP8 x FP8 ``lax.dot_general`` with ``preferred_element_type=float32``
(the tensor-core GEMM on Hopper; an exact emulation on CPU since E4M3 values are exactly
representable), then every tile's partial product is multiplied by its two scales and summed in
float32 -- DeepSeek's "promote to FP32 every 128 elements" accumulation.

Why not ``jax.nn.scaled_matmul`` / ``scaled_dot_general``: in jax 0.10 they only lower through
cuDNN on Blackwell (MXFP8: block 32 with E8M0 power-of-two scales), have no CPU or Hopper lowering,
and cannot express 128 x 128 weight blocks with float32 scales. qwix is not a dependency here.
The backward pass (custom VJP) quantises the same way: dgrad = g @ W^T and wgrad = x^T @ g are FP8
products with float32 accumulation, as in DeepSeek-V3.
Where it is used (``LMConfig.fp8``): every `layers.Linear` and the routed-expert GEMMs (moe.py);
see `LMConfig` for what stays in higher precision. Measured: tests/models/lm/test_model.py
(`test_fp8_training_tracks_bf16_with_mtp`) and experiments/bench_lm.py (`fp8_vs_bf16.png`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

E4M3 = jnp.float8_e4m3fn
E4M3_MAX = 448.0


def _pad_axis(x: jax.Array, axis: int, mult: int) -> jax.Array:
    pad = (-x.shape[axis]) % mult
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def _scale(amax: jax.Array) -> jax.Array:
    return jnp.where(amax > 0, amax / E4M3_MAX, 1.0).astype(jnp.float32)


def quantize_tiles(a: jax.Array, block: int) -> tuple[jax.Array, jax.Array]:
    """a [M, K] -> (q [M, Kt, block] E4M3, scales [M, Kt] f32), K zero-padded to Kt*block."""
    a = _pad_axis(a.astype(jnp.float32), 1, block)
    m, k = a.shape
    t = a.reshape(m, k // block, block)
    s = _scale(jnp.max(jnp.abs(t), axis=-1))
    return (t / s[..., None]).astype(E4M3), s


def quantize_blocks(b: jax.Array, block: int) -> tuple[jax.Array, jax.Array]:
    """b [K, N] -> (q [Kt, block, Nt, block] E4M3, scales [Kt, Nt] f32), both dims zero-padded."""
    b = _pad_axis(_pad_axis(b.astype(jnp.float32), 0, block), 1, block)
    k, n = b.shape
    t = b.reshape(k // block, block, n // block, block)
    s = _scale(jnp.max(jnp.abs(t), axis=(1, 3)))
    return (t / s[:, None, :, None]).astype(E4M3), s


def dequantize_tiles(q: jax.Array, s: jax.Array, k: int) -> jax.Array:
    """Inverse of `quantize_tiles` (for tests): [M, k] f32."""
    return (q.astype(jnp.float32) * s[..., None]).reshape(q.shape[0], -1)[:, :k]


def _fp8_dot2d(a: jax.Array, b: jax.Array, block: int) -> jax.Array:
    """a [M, K] @ b [K, N] with E4M3 tiles/blocks; float32 [M, N]."""
    m, k = a.shape
    n = b.shape[1]
    qa, sa = quantize_tiles(a, block)  # [M, Kt, B], [M, Kt]
    qb, sb = quantize_blocks(b, block)  # [Kt, B, Nt, B], [Kt, Nt]
    kt, _, nt, _ = qb.shape
    qb = qb.reshape(kt, block, nt * block)
    # per-tile FP8 GEMM, f32 accumulation inside the tile: [Kt, M, Np]
    part = jax.lax.dot_general(
        qa, qb, dimension_numbers=(((2,), (1,)), ((1,), (0,))), preferred_element_type=jnp.float32
    )
    scale = sa.T[:, :, None] * jnp.repeat(sb, block, axis=1)[:, None, :]
    return jnp.sum(part * scale, axis=0)[:, :n]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def fp8_matmul(x: jax.Array, w: jax.Array, block: int = 128) -> jax.Array:
    """x [..., K] @ w [K, N] in emulated/real E4M3 with fine-grained scales; float32 [..., N]."""
    lead = x.shape[:-1]
    return _fp8_dot2d(x.reshape(-1, x.shape[-1]), w, block).reshape(*lead, w.shape[1])


def _fwd(x, w, block):
    return fp8_matmul(x, w, block), (x, w)


def _bwd(block, res, g):
    x, w = res
    x2 = x.reshape(-1, x.shape[-1])
    g2 = g.reshape(-1, g.shape[-1]).astype(jnp.float32)
    dx = _fp8_dot2d(g2, w.T, block).reshape(x.shape).astype(x.dtype)
    dw = _fp8_dot2d(x2.T, g2, block).astype(w.dtype)
    return dx, dw


fp8_matmul.defvjp(_fwd, _bwd)
