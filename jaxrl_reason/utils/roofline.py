"""This machine's own limits, measured through XLA: matmul throughput at given shapes and dtypes, and memory
bandwidth; and where a program stands against them (its roofline).

    peak = matmul_flops_per_s(4096, 576, 1536, "bfloat16")     # FLOP/s of one jitted [M, K] @ [K, N]
    bw = read_bandwidth()                                       # bytes/s read from 256 MiB (sum or GEMV)
    roofline_s(flops, moved, peak, bw)                          # the least time: compute- or bandwidth-bound

Each figure is the best of ``repeats`` timed calls after a compiling one (a peak is what the machine can do; the
median belongs to benchmarks of our programs, ``utils.timing.interleaved``). Inputs are random and committed to the
device before timing; outputs are blocked on.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np


def _best_seconds(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return float(best)


def matmul_flops_per_s(m: int, k: int, n: int, dtype="float32", device=None, repeats: int = 5) -> float:
    """FLOP/s (2 M K N per call) of a jitted [M, K] @ [K, N] in ``dtype`` (accumulating in it) on ``device``."""
    device = device or jax.devices()[0]
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.device_put(jax.random.normal(ka, (m, k), dtype), device)
    b = jax.device_put(jax.random.normal(kb, (k, n), dtype), device)
    return 2.0 * m * k * n / _best_seconds(jax.jit(jnp.matmul), a, b, repeats=repeats)


def read_bandwidth(mib: int = 256, device=None, repeats: int = 5) -> float:
    """Bytes/s read from memory on ``device``: the faster of two jitted float32 reads of ``mib`` MiB (larger than the
    caches), a sum and a matrix-vector product [1, 512] @ [512, mib MiB / 2 KiB] (on XLA CPU the product's own
    kernel reads up to ~1.5x faster than the sum's reduction: 32-34 vs 22-31 GB/s on the 2-core machine)."""
    device = device or jax.devices()[0]
    x = jax.device_put(jnp.ones((mib << 18,), jnp.float32), device)
    v = jax.device_put(jnp.ones((1, 512), jnp.float32), device)
    summed = _best_seconds(jax.jit(jnp.sum), x, repeats=repeats)
    product = _best_seconds(jax.jit(lambda v, x: v @ x.reshape(512, -1)), v, x, repeats=repeats)
    return x.nbytes / min(summed, product)


def matmul_peaks(shapes, dtypes=("float32", "bfloat16"), device=None, repeats: int = 5) -> dict:
    """{dtype: {"M x K x N": FLOP/s}} for every (M, K, N) of ``shapes``, with each dtype's best under "peak"."""
    out = {}
    for dtype in dtypes:
        rates = {f"{m}x{k}x{n}": matmul_flops_per_s(m, k, n, dtype, device, repeats) for m, k, n in shapes}
        out[dtype] = {**rates, "peak": max(rates.values())}
    return out


def roofline_s(flops: float, moved_bytes: float, flops_per_s: float, bytes_per_s: float) -> float:
    """The least seconds a program of ``flops`` moving ``moved_bytes`` takes here: max(compute, memory)."""
    return max(flops / flops_per_s, moved_bytes / bytes_per_s)


__all__ = ["matmul_flops_per_s", "matmul_peaks", "read_bandwidth", "roofline_s"]
