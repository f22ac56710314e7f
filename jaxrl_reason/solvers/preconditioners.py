"""Preconditioners with one interface: a pytree object ``M`` with ``M(v) -> z`` (``[n] -> [n]``).

Each is a ``flax.struct`` dataclass, so it can be built inside ``jit`` (setup cost is
traced like the solve), passed across ``jit`` boundaries, and vmapped over systems.
Builders take the matrix (dense, BCOO/BCSR; polynomial ones also accept a matvec
function) and return the object:

  identity()                      z = v
  jacobi(A)                       z = v / diag(A)
  block_jacobi(A, k)              z = blockdiag(A)^-1 v, static block size k, batched inverses
  neumann(A, degree, base)        z = sum_{i<=d} (I - B A)^i B v      (truncated Neumann series)
  chebyshev(A, degree, lmin, lmax, base)  Chebyshev semi-iteration on B A z = B v from z = 0
  polynomial(A, coeffs, base)     z = sum_i c_i (B A)^i B v            (learnable coefficients)

  ilu0(A, sweeps, tri_iters)      z = U^-1 L^-1 v, incomplete LU on A's sparsity pattern

A zero diagonal entry (e.g. the constraint rows of a KKT system) is treated as 1 by
``jacobi``; a singular diagonal block is inverted after a small diagonal shift. Both are
documented fall-backs, not errors: the solver's residual history shows their effect.

ILU(0) is jittable because its pattern is static: the pattern analysis (which products feed
which entry, dependency depths) runs once on the host from the concrete indices; the values
are computed in JAX by Chow-Patel fixed-point sweeps (all entries in parallel; exact after
``depth`` sweeps) and the triangular solves by Jacobi sweeps on the triangular factors (exact
after as many sweeps as the factor has levels, i.e. level scheduling with one full sparse
matvec per level; fewer sweeps give the approximate, matvec-only variant). Each sweep is a
``lax.fori_loop`` step. See ``learned.py`` for the block-cyclic-reduction preconditioner.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.experimental import sparse as jsparse

from jaxrl_reason.solvers import operators as ops


class Preconditioner(struct.PyTreeNode):
    """Base class: ``__call__(v [n]) -> z [n]``."""

    def __call__(self, v: jax.Array) -> jax.Array:  # pragma: no cover - abstract
        raise NotImplementedError


class Identity(Preconditioner):
    def __call__(self, v):
        return v


class Jacobi(Preconditioner):
    inv_diag: jax.Array  # [n]

    def __call__(self, v):
        return self.inv_diag * v


class BlockJacobi(Preconditioner):
    inv_blocks: jax.Array  # [nb, k, k]
    n: int = struct.field(pytree_node=False)

    def __call__(self, v):
        nb, k, _ = self.inv_blocks.shape
        vp = jnp.pad(v, (0, nb * k - self.n)).reshape(nb, k)
        return jnp.einsum("bij,bj->bi", self.inv_blocks, vp).reshape(-1)[: self.n]


class Polynomial(Preconditioner):
    """``z = sum_i coeffs[i] (B A)^i B v`` by Horner's rule (``degree = len(coeffs) - 1``)."""

    operator: ops.Operator
    coeffs: jax.Array  # [degree + 1]
    base: Preconditioner

    def __call__(self, v):
        bv = self.base(v)

        def horner(y, c):
            return c * bv + self.base(ops.matvec(self.operator, y)), None

        y, _ = jax.lax.scan(horner, self.coeffs[-1] * bv, self.coeffs[:-1][::-1])
        return y


class Chebyshev(Preconditioner):
    """``degree`` steps of Chebyshev semi-iteration for ``B A z = B v`` (Saad Alg. 12.1),
    assuming the spectrum of ``B A`` lies in the real interval ``[lmin, lmax]``, ``0 < lmin``."""

    operator: ops.Operator
    base: Preconditioner
    lmin: jax.Array
    lmax: jax.Array
    degree: int = struct.field(pytree_node=False)

    def __call__(self, v):
        theta, delta = (self.lmax + self.lmin) / 2, (self.lmax - self.lmin) / 2
        sigma = theta / delta
        bv = self.base(v)
        d = bv / theta
        z = d
        rho = 1 / sigma

        def step(carry, _):
            z, d, rho = carry
            r = bv - self.base(ops.matvec(self.operator, z))
            rho_new = 1 / (2 * sigma - rho)
            d = rho_new * rho * d + 2 * rho_new / delta * r
            return (z + d, d, rho_new), None

        (z, _, _), _ = jax.lax.scan(step, (z, d, rho), None, length=self.degree - 1)
        return z


def identity() -> Identity:
    return Identity()


def _safe_inv_diag(d):
    return jnp.where(d != 0, 1 / jnp.where(d != 0, d, 1), 1)


def safe_block_inverse(blocks: jax.Array) -> jax.Array:
    """Batched inverse of ``blocks [..., k, k]``; a singular block (non-finite inverse) is
    inverted after a diagonal shift of ``sqrt(eps) * max|block|``.

    The shifted inverse runs only when some block is singular, and after the first: two
    independent batched LU custom calls in one XLA CPU program can deadlock jaxlib's intra-op
    thread pool (both workers wait in ``ParallelBatchMap``; seen with 2 threads, jaxlib 0.10.2).
    """
    inv = jnp.linalg.inv(blocks)
    bad = ~jnp.isfinite(inv).all(axis=(-2, -1), keepdims=True)

    def shifted(inv):
        scale = jnp.max(jnp.abs(blocks), axis=(-2, -1), keepdims=True)
        shift = jnp.sqrt(jnp.finfo(blocks.dtype).eps) * jnp.where(scale > 0, scale, 1)
        eye = jnp.eye(blocks.shape[-1], dtype=blocks.dtype)
        return jnp.where(bad, jnp.linalg.inv(blocks + jnp.where(bad, shift, 0) * eye), inv)

    return jax.lax.cond(bad.any(), shifted, lambda inv: inv, inv)


def jacobi(A) -> Jacobi:
    """Diagonal scaling (zero diagonal entries act as 1)."""
    return Jacobi(inv_diag=_safe_inv_diag(ops.diagonal(ops.as_operator(A))))


def block_jacobi(A, block_size: int) -> BlockJacobi:
    """Inverse of the ``ceil(n/k)`` diagonal blocks of size ``k`` (static), one batched LU."""
    op = ops.as_operator(A)
    k = int(block_size)
    n = op.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"block_size must be in [1, n] = [1, {n}], got {block_size}")
    return BlockJacobi(inv_blocks=safe_block_inverse(ops.diagonal_blocks(op, k)), n=n)


def neumann(A, degree: int, base: Preconditioner | None = None) -> Polynomial:
    """Truncated Neumann series of ``(B A)^{-1} B``; converges when ``rho(I - B A) < 1``."""
    op = ops.as_operator(A)
    base = identity() if base is None else base
    return polynomial(op, jnp.ones((int(degree) + 1,)), base)


def polynomial(A, coeffs, base: Preconditioner | None = None) -> Polynomial:
    op = ops.as_operator(A)
    coeffs = jnp.asarray(coeffs)
    if coeffs.ndim != 1 or coeffs.shape[0] < 1:
        raise ValueError(f"coeffs must be a non-empty vector, got shape {coeffs.shape}")
    return Polynomial(operator=op, coeffs=coeffs, base=identity() if base is None else base)


def chebyshev(A, degree: int, lmin, lmax, base: Preconditioner | None = None) -> Chebyshev:
    if int(degree) < 1:
        raise ValueError(f"degree must be >= 1, got {degree}")
    if not 0 < float(lmin) < float(lmax):
        raise ValueError(f"need 0 < lmin < lmax, got lmin={lmin}, lmax={lmax}")
    return Chebyshev(operator=ops.as_operator(A), base=identity() if base is None else base,
                     lmin=jnp.asarray(lmin), lmax=jnp.asarray(lmax), degree=int(degree))


class ILU0(Preconditioner):
    """``z = U^-1 L^-1 v`` with unit-lower ``L`` and upper ``U`` on ``A``'s pattern.

    rows, cols: ``[nnz]`` pattern (diagonal included); vals: ``[nnz]`` ``L`` entries below the
    diagonal, ``U`` entries on and above it. diag_pos: ``[n]`` position of each diagonal entry.
    """

    rows: jax.Array
    cols: jax.Array
    vals: jax.Array
    diag_pos: jax.Array
    lower_iters: int = struct.field(pytree_node=False)
    upper_iters: int = struct.field(pytree_node=False)

    def __call__(self, v):
        n = self.diag_pos.shape[0]
        lower, upper = self.rows > self.cols, self.rows < self.cols
        d = self.vals[self.diag_pos]
        spmv = lambda w, mask, x: jnp.zeros(n, x.dtype).at[self.rows].add(jnp.where(mask, w, 0) * x[self.cols])
        y = jax.lax.fori_loop(0, self.lower_iters, lambda _, y: v - spmv(self.vals, lower, y), v)
        return jax.lax.fori_loop(0, self.upper_iters, lambda _, z: (y - spmv(self.vals, upper, z)) / d, y / d)


def _ilu0_pattern(rows: np.ndarray, cols: np.ndarray, n: int):
    """Host analysis: product pairs feeding each entry, factor depth, triangular levels."""
    pos = {(int(i), int(j)): p for p, (i, j) in enumerate(zip(rows, cols))}
    by_row: dict[int, list[int]] = {}
    for (i, j) in pos:
        by_row.setdefault(i, []).append(j)
    pa, pb, tgt = [], [], []
    for (i, j), p in pos.items():
        for k in by_row.get(i, ()):
            if k < min(i, j) and (k, j) in pos:
                pa.append(pos[(i, k)]), pb.append(pos[(k, j)]), tgt.append(p)
    order = sorted(pos, key=lambda ij: (min(ij), ij[0] > ij[1]))
    deps: dict[int, list[int]] = {}
    for a, b, t in zip(pa, pb, tgt):
        deps.setdefault(t, []).extend((a, b))
    depth = np.zeros(len(rows), np.int64)
    for (i, j) in order:
        p = pos[(i, j)]
        ds = deps.get(p, []) + ([pos[(j, j)]] if i > j else [])
        depth[p] = 1 + max((depth[q] for q in ds), default=0)

    def tri_levels(lower: bool):
        lev = np.zeros(n, np.int64)
        for i in (range(n) if lower else range(n - 1, -1, -1)):
            nb = [lev[j] for j in by_row.get(i, ()) if (j < i if lower else j > i)]
            lev[i] = 1 + max(nb, default=0)
        return int(lev.max())

    return (np.asarray(pa, np.int32), np.asarray(pb, np.int32), np.asarray(tgt, np.int32),
            int(depth.max()), tri_levels(True), tri_levels(False))


def ilu0(A, sweeps: int | None = None, tri_iters: int | None = None) -> ILU0:
    """ILU(0) of a dense or BCOO/BCSR matrix with concrete sparsity pattern.

    sweeps: Chow-Patel sweeps for the factor values (``None`` = exact: the dependency depth).
    tri_iters: Jacobi sweeps per triangular solve (``None`` = exact: the number of levels).
    A zero pivot is replaced by 1 (reported by the solver only through slow convergence).
    Raises ``ValueError`` for non-square input, traced indices or a negative sweep count.
    """
    op = ops.as_operator(A)
    if not ops.is_explicit(op):
        raise ValueError("ilu0 needs a dense or sparse matrix, not a matvec function")
    n = op.shape[0]
    if op.shape != (n, n):
        raise ValueError(f"ilu0 needs a square matrix, got shape {op.shape}")
    if isinstance(op, jsparse.BCOO):
        idx = op.indices
        if isinstance(idx, jax.core.Tracer):
            raise ValueError("ilu0 needs a concrete sparsity pattern (build it outside jit)")
        r, c = np.asarray(idx[:, 0]), np.asarray(idx[:, 1])
        data = op.data
    else:
        if isinstance(op, jax.core.Tracer):
            raise ValueError("ilu0 of a dense matrix needs concrete entries (build it outside jit)")
        r, c = np.nonzero(np.asarray(op))
        data = op[r, c]
    # merge duplicates and add missing diagonal entries (value 0)
    key = np.concatenate([r.astype(np.int64) * n + c, np.arange(n, dtype=np.int64) * (n + 1)])
    uniq, inv = np.unique(key, return_inverse=True)
    vals0 = jnp.zeros(uniq.shape[0], data.dtype).at[jnp.asarray(inv[: r.shape[0]])].add(data)
    rows, cols = (uniq // n).astype(np.int32), (uniq % n).astype(np.int32)
    pa, pb, tgt, depth, lev_l, lev_u = _ilu0_pattern(rows, cols, n)
    diag_pos = np.searchsorted(uniq, np.arange(n, dtype=np.int64) * (n + 1)).astype(np.int32)
    sweeps = depth if sweeps is None else int(sweeps)
    for name, val in (("sweeps", sweeps), ("tri_iters", 0 if tri_iters is None else tri_iters)):
        if val < 0:
            raise ValueError(f"{name} must be >= 0, got {val}")
    lower = jnp.asarray(rows > cols)
    colsj, pa, pb, tgt = jnp.asarray(cols), jnp.asarray(pa), jnp.asarray(pb), jnp.asarray(tgt)
    dp = jnp.asarray(diag_pos)

    def sweep(_, v):
        s = jnp.zeros_like(v).at[tgt].add(v[pa] * v[pb])
        u = vals0 - s
        piv = v[dp][colsj]
        piv = jnp.where(piv != 0, piv, 1)
        return jnp.where(lower, u / piv, u)

    init = jnp.where(lower, vals0 / jnp.where(vals0[dp][colsj] != 0, vals0[dp][colsj], 1), vals0)
    vals = jax.lax.fori_loop(0, sweeps, sweep, init)
    vals = vals.at[dp].set(jnp.where(vals[dp] != 0, vals[dp], 1))
    ti_l = lev_l if tri_iters is None else int(tri_iters)
    ti_u = lev_u if tri_iters is None else int(tri_iters)
    return ILU0(rows=jnp.asarray(rows), cols=colsj, vals=vals, diag_pos=dp, lower_iters=ti_l, upper_iters=ti_u)
