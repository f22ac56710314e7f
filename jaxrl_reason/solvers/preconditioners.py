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

A zero diagonal entry (e.g. the constraint rows of a KKT system) is treated as 1 by
``jacobi``; a singular diagonal block is inverted after a small diagonal shift. Both are
documented fall-backs, not errors: the solver's residual history shows their effect.
ILU(0) is not provided: its triangular solves are sequential, exactly what this package
avoids; see ``learned.py`` for GPU-friendly alternatives (line relaxation, polynomials).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

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
    blocks = ops.diagonal_blocks(op, k)
    inv = jnp.linalg.inv(blocks)
    bad = ~jnp.isfinite(inv).all(axis=(1, 2))
    scale = jnp.max(jnp.abs(blocks), axis=(1, 2), keepdims=True)
    shift = jnp.sqrt(jnp.finfo(blocks.dtype).eps) * jnp.where(scale > 0, scale, 1)
    inv_shifted = jnp.linalg.inv(blocks + shift * jnp.eye(k, dtype=blocks.dtype))
    inv = jnp.where(bad[:, None, None], inv_shifted, inv)
    return BlockJacobi(inv_blocks=inv, n=n)


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
