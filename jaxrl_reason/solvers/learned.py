"""Learned, GPU-friendly preconditioners: block cyclic reduction + a meta-learned polynomial.

Everything here is applied with batched, static-shape dense operations (einsum over blocks,
batched inverses at setup) and matrix-vector products: no sequential triangular solve.

* ``block_tridiagonal(A, k)`` reads a block-tridiagonal matrix (e.g. a 2-D grid operator with
  the S lines of a Heston grid as blocks, ``k = ns``) into ``[nb, k, k]`` lower/diag/upper blocks.
* ``cyclic_reduction(T, levels)``: block cyclic reduction (Hockney/Buzbee-Golub-Nielson).
  Each level eliminates the odd-numbered blocks from the even ones with one batched inverse,
  so ``levels = ceil(log2 nb)`` gives an exact solve in ``log2 nb`` parallel steps (a direct
  solver, O(nb k^3) setup); fewer levels stop early and treat the reduced system with
  block-Jacobi (a cheaper, approximate preconditioner).
* ``CoefficientNet`` (flax NNX MLP) maps cheap system features (diagonal statistics and probe
  moments of ``P A`` computed with matvecs) to the coefficients of a polynomial correction
  ``z = sum_i c_i (P A)^i P v`` of a base preconditioner ``P``; ``train_coefficient_net``
  meta-trains it across a distribution of systems on a residual loss
  ``log ||r - A M r||^2 / ||r||^2`` (random ``r``), ``learned_preconditioner`` builds ``M`` for
  a new (held-out, possibly larger) system.

Why hand-written: no JAX library offers block cyclic reduction for block-tridiagonal
preconditioning (``jax.lax.linalg.tridiagonal_solve`` is scalar-tridiagonal only).
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct
from jax.experimental import sparse as jsparse

from jaxrl_reason.solvers import operators as ops
from jaxrl_reason.solvers import preconditioners as pc
from jaxrl_reason.utils.guard import guard_optimizer


class BlockTridiagonal(struct.PyTreeNode):
    """``A`` as blocks: row block ``i`` is ``lower[i] x_{i-1} + diag[i] x_i + upper[i] x_{i+1}``.

    lower, diag, upper: ``[nb, k, k]`` (``lower[0]`` and ``upper[-1]`` are zero).
    """

    lower: jax.Array
    diag: jax.Array
    upper: jax.Array

    def __call__(self, v: jax.Array) -> jax.Array:
        """``A v`` for ``v`` ``[nb * k]``."""
        nb, k, _ = self.diag.shape
        x = v.reshape(nb, k)
        xm = jnp.concatenate([jnp.zeros_like(x[:1]), x[:-1]])
        xp = jnp.concatenate([x[1:], jnp.zeros_like(x[:1])])
        mv = lambda M, y: jnp.einsum("bij,bj->bi", M, y)
        return (mv(self.lower, xm) + mv(self.diag, x) + mv(self.upper, xp)).reshape(-1)


def block_tridiagonal(A, block_size: int, *, check: bool = True) -> BlockTridiagonal:
    """Blocks of a dense or BCOO/BCSR ``[n, n]`` matrix, ``n = nb * block_size``.

    Raises ``ValueError`` if ``n`` is not a multiple of ``block_size`` or (when the indices are
    concrete and ``check``) if an entry lies outside the three block diagonals.
    """
    op = ops.as_operator(A)
    if not ops.is_explicit(op):
        raise ValueError("block_tridiagonal needs a dense or sparse matrix, not a matvec function")
    n, k = op.shape[0], int(block_size)
    if k < 1 or n % k:
        raise ValueError(f"n = {n} must be a positive multiple of block_size = {block_size}")
    nb = n // k
    if isinstance(op, jsparse.BCOO):
        rows, cols, data = op.indices[:, 0], op.indices[:, 1], op.data
    else:
        rows, cols = jnp.divmod(jnp.arange(n * n), n)
        data = op.reshape(-1)
    br, bc = rows // k, cols // k
    off = bc - br
    if check and not isinstance(off, jax.core.Tracer):
        bad = (np.abs(np.asarray(off)) > 1) & (np.asarray(data) != 0)
        if bad.any():
            raise ValueError(f"matrix is not block tridiagonal with block_size={k}: "
                             f"{int(bad.sum())} nonzeros beyond the neighbouring blocks")
    out = jnp.zeros((3, nb, k, k), op.dtype)
    keep = jnp.abs(off) <= 1
    out = out.at[jnp.where(keep, off + 1, 0), br, rows % k, cols % k].add(jnp.where(keep, data, 0))
    return BlockTridiagonal(lower=out[0], diag=out[1], upper=out[2])


class _Level(struct.PyTreeNode):
    """One reduction level over ``m`` (odd, padded) blocks: ``me = (m+1)/2`` even, ``me-1`` odd."""

    lower_odd: jax.Array  # [me-1, k, k]
    upper_odd: jax.Array  # [me-1, k, k]
    dinv_odd: jax.Array  # [me-1, k, k]
    alpha: jax.Array  # [me, k, k] multipliers of the odd block below each even block
    gamma: jax.Array  # [me, k, k] multipliers of the odd block above


def _mv(M, y):
    return jnp.einsum("bij,bj->bi", M, y)


def _pad_odd(x, fill):
    return x if x.shape[0] % 2 else jnp.concatenate([x, fill[None]])


class CyclicReduction(pc.Preconditioner):
    """Block cyclic reduction; exact inverse when ``len(levels) = ceil(log2 nb)``."""

    levels: tuple
    dinv_last: jax.Array  # [nb_reduced, k, k] block-Jacobi on the reduced system
    nb: int = struct.field(pytree_node=False)

    def __call__(self, v):
        k = self.dinv_last.shape[-1]
        f = v.reshape(self.nb, k)
        stack = []
        for lev in self.levels:
            m0 = f.shape[0]
            f = _pad_odd(f, jnp.zeros_like(f[0]))
            fo = jnp.concatenate([jnp.zeros_like(f[:1]), f[1::2], jnp.zeros_like(f[:1])])
            stack.append((f, m0))
            f = f[0::2] + _mv(lev.alpha, fo[:-1]) + _mv(lev.gamma, fo[1:])
        x = _mv(self.dinv_last, f)
        for lev, (fprev, m0) in zip(self.levels[::-1], stack[::-1]):
            rhs = fprev[1::2] - _mv(lev.lower_odd, x[:-1]) - _mv(lev.upper_odd, x[1:])
            xo = _mv(lev.dinv_odd, rhs)
            full = jnp.stack([x[:-1], xo], axis=1).reshape(-1, k)
            x = jnp.concatenate([full, x[-1:]])[:m0]
        return x.reshape(-1)


def max_levels(nb: int) -> int:
    """Levels for an exact solve of ``nb`` blocks."""
    return max(0, math.ceil(math.log2(nb))) if nb > 1 else 0


def cyclic_reduction(T: BlockTridiagonal, levels: int | None = None) -> CyclicReduction:
    """Factor ``T`` with ``levels`` reduction steps (``None`` = exact, ``max_levels(nb)``)."""
    nb, k, _ = T.diag.shape
    top = max_levels(nb)
    levels = top if levels is None else int(levels)
    if not 0 <= levels <= top:
        raise ValueError(f"levels must be in [0, {top}] for {nb} blocks, got {levels}")
    Lo, D, Up = T.lower, T.diag, T.upper
    zero, eye = jnp.zeros((k, k), D.dtype), jnp.eye(k, dtype=D.dtype)
    out = []
    for _ in range(levels):
        Lo, D, Up = _pad_odd(Lo, zero), _pad_odd(D, eye), _pad_odd(Up, zero)
        dinv_o = pc.safe_block_inverse(D[1::2])
        z = jnp.zeros_like(D[:1])
        dz = jnp.concatenate([z, dinv_o, z])  # dz[e] = inverse of odd block e-1
        Loz = jnp.concatenate([z, Lo[1::2], z])
        Upz = jnp.concatenate([z, Up[1::2], z])
        alpha = -Lo[0::2] @ dz[:-1]
        gamma = -Up[0::2] @ dz[1:]
        Dn = D[0::2] + alpha @ Upz[:-1] + gamma @ Loz[1:]
        Ln, Un = alpha @ Loz[:-1], gamma @ Upz[1:]
        out.append(_Level(lower_odd=Lo[1::2], upper_odd=Up[1::2], dinv_odd=dinv_o, alpha=alpha, gamma=gamma))
        Lo, D, Up = Ln, Dn, Un
    return CyclicReduction(levels=tuple(out), dinv_last=pc.safe_block_inverse(D), nb=nb)


# ----------------------------------------------------------------------------- learned part

NUM_FEATURES = 6


def features(matvec, P, diag: jax.Array, num_probes: int = 4) -> jax.Array:
    """Scale-free system features ``[NUM_FEATURES]`` from matvecs only.

    log10 mean |diag|, spread of log10 |diag|, and probe moments ``log ||(P A - I)^j r|| / ||r||``
    (j = 1, 2, 3) plus the Rayleigh quotient of ``P A`` on fixed Rademacher probes.
    """
    n = diag.shape[0]
    R = jnp.where(jax.random.bernoulli(jax.random.key(0), 0.5, (num_probes, n)), 1.0, -1.0).astype(diag.dtype)
    E = jax.vmap(lambda r: P(matvec(r)) - r)
    E1 = E(R)
    E2 = E(E1)
    E3 = E(E2)
    nr = jnp.linalg.norm(R, axis=1)
    lg = lambda X: jnp.mean(jnp.log10(jnp.linalg.norm(X, axis=1) / nr + 1e-30))
    ray = jnp.mean(jnp.sum(R * (E1 + R), axis=1) / nr**2)
    ld = jnp.log10(jnp.abs(diag) + 1e-30)
    return jnp.stack([jnp.mean(ld), jnp.std(ld), lg(E1), lg(E2), lg(E3), ray]).astype(jnp.float32)


class CoefficientNet(nnx.Module):
    """features ``[F]`` -> polynomial coefficients ``[degree+1]``; starts at ``c = e_0`` (``M = P``,
    the base preconditioner itself), so training can only move away from it where the loss gains."""

    def __init__(self, degree: int = 4, hidden: Sequence[int] = (32, 32), *, rngs: nnx.Rngs):
        sizes = [NUM_FEATURES, *hidden, degree + 1]
        self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(sizes[:-1], sizes[1:])])
        last = self.layers[-1]
        last.kernel.value = last.kernel.value * 0.01
        self.degree = degree

    def __call__(self, f):
        x = f
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = jnp.tanh(x)
        return x.at[0].add(1.0)


def base_preconditioner(T: BlockTridiagonal, levels: int | None) -> CyclicReduction:
    """Cyclic reduction with ``levels`` (negative = that many levels short of exact)."""
    top = max_levels(T.diag.shape[0])
    lv = top if levels is None else (top + levels if levels < 0 else min(levels, top))
    return cyclic_reduction(T, max(lv, 0))


def learned_preconditioner(net: CoefficientNet, A, T: BlockTridiagonal, levels: int | None) -> pc.Polynomial:
    """``M v = sum_i c_i (P A)^i P v`` with ``P`` = truncated cyclic reduction of ``T`` and
    ``c = net(features)``; ``A`` is the operator FGMRES uses (``T`` itself works)."""
    op = ops.as_operator(A)
    P = base_preconditioner(T, levels)
    mv = lambda v: ops.matvec(op, v)
    diag = jnp.diagonal(T.diag, axis1=1, axis2=2).reshape(-1)
    c = net(features(mv, P, diag)).astype(T.diag.dtype)
    return pc.Polynomial(operator=op, coeffs=c, base=P)


def residual_loss(net: CoefficientNet, T: BlockTridiagonal, levels: int | None, key, num_rhs: int = 4) -> jax.Array:
    """``mean log10 ||r - A M r||^2 / ||r||^2`` over random ``r``."""
    M = learned_preconditioner(net, T, T, levels)
    R = jax.random.normal(key, (num_rhs, T.diag.shape[0] * T.diag.shape[1]), T.diag.dtype)
    E = jax.vmap(lambda r: r - T(M(r)))(R)
    return jnp.mean(jnp.log10(jnp.sum(E**2, 1) / jnp.sum(R**2, 1) + 1e-30))


def train_coefficient_net(systems: BlockTridiagonal, *, levels: int | None, degree: int = 4, steps: int = 200,
                          lr: float = 3e-3, seed: int = 0, batch: int = 8, log_every: int = 0):
    """Meta-train ``CoefficientNet`` over stacked systems ``systems`` (leading axis ``B``).

    Returns ``(net, losses [steps])``; the whole loop is one jitted ``lax.scan``.
    """
    B = systems.diag.shape[0]
    net = CoefficientNet(degree, rngs=nnx.Rngs(seed))
    graphdef, params = nnx.split(net)
    tx = guard_optimizer(optax.adam(lr))
    opt = tx.init(params)

    def loss_fn(params, idx, key):
        n_ = nnx.merge(graphdef, params)
        sub = jax.tree.map(lambda a: a[idx], systems)
        keys = jax.random.split(key, idx.shape[0])
        return jnp.mean(jax.vmap(lambda t, k: residual_loss(n_, t, levels, k))(sub, keys))

    def step(carry, key):
        params, opt = carry
        k1, k2 = jax.random.split(key)
        idx = jax.random.randint(k1, (min(batch, B),), 0, B)
        loss, g = jax.value_and_grad(loss_fn)(params, idx, k2)
        upd, opt = tx.update(g, opt, params)
        return (optax.apply_updates(params, upd), opt), loss

    (params, _), losses = jax.jit(lambda p, o, k: jax.lax.scan(step, (p, o), jax.random.split(k, steps)))(
        params, opt, jax.random.key(seed))
    return nnx.merge(graphdef, params), losses
