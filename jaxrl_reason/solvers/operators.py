"""Linear operators for the solvers: dense arrays, ``jax.experimental.sparse`` BCOO/BCSR
matrices and plain matvec functions behind one pytree-friendly interface.

``as_operator(A)`` returns a pytree (the array, the sparse matrix, or a
``jax.tree_util.Partial`` around a function) that can cross ``jit`` boundaries;
``matvec(op, v)`` applies it. Diagonal and diagonal-block extraction are only
defined for explicit matrices (a matvec function has no entries to read).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse as jsparse

Operator = Any  # jax.Array | jsparse.BCOO | jsparse.BCSR | jax.tree_util.Partial


def as_operator(A) -> Operator:
    """Wrap ``A`` (dense ``[n, n]``, BCOO/BCSR, or ``v -> A v``) as a jit-friendly pytree."""
    if isinstance(A, jsparse.BCSR):
        return A.to_bcoo()  # one sparse code path; BCOO matvec is a gather + segment-sum
    if isinstance(A, (jsparse.JAXSparse, jax.tree_util.Partial)):
        return A
    if callable(A):
        return jax.tree_util.Partial(A)
    A = jnp.asarray(A)
    return A


def is_explicit(op: Operator) -> bool:
    """True for dense and sparse matrices (entries readable), False for matvec functions."""
    return not isinstance(op, jax.tree_util.Partial)


def matvec(op: Operator, v: jax.Array) -> jax.Array:
    """``A @ v`` for ``v`` of shape ``[n]`` (under ``vmap`` over ``v`` only, a BCOO matrix
    is applied with ``matmat``, not with ``L`` separate sparse products)."""
    if isinstance(op, jax.tree_util.Partial):
        return op(v)
    if isinstance(op, jsparse.BCOO):
        return _bcoo_matvec(op, v)
    return op @ v


@jax.custom_batching.custom_vmap
def _bcoo_matvec(op, v):
    return op @ v


@_bcoo_matvec.def_vmap
def _bcoo_matvec_batched(axis_size, in_batched, op, v):
    op_b, v_b = in_batched
    axes = batch_axes(op_b)
    if axes is not None:  # a batch of matrices: the generic rule
        v = v if v_b else jnp.broadcast_to(v, (axis_size,) + v.shape)
        return lane_map(lambda o, x: o @ x, axes, 1)(op, v), True
    return matmat(op, v), True


def batch_axes(flags):
    """``custom_vmap`` batched flags (a pytree of bools) -> axes (0 batched, None shared) for
    ``lane_map``, or None when nothing is batched."""
    return jax.tree.map(lambda f: 0 if f else None, flags) if any(jax.tree.leaves(flags)) else None


def lane_map(fn: Callable, axes, num_mapped: int) -> Callable:
    """``fn(obj, *vs)`` vmapped over lanes: ``obj``'s leaves on ``axes`` (``obj``'s pytree with 0/None
    leaves, or None: nothing mapped), each of the ``num_mapped`` ``vs`` on axis 0.

    Maps leaf by leaf because a ``None`` inside a custom pytree node (a BCOO whose data is batched
    and whose indices are shared) is not a valid ``vmap`` axis prefix.
    """
    def mapped(obj, *vs):
        leaves, tdef = jax.tree.flatten(obj)
        leaf_axes = [None] * len(leaves) if axes is None else tdef.flatten_up_to(axes)
        return jax.vmap(lambda ls, *v: fn(tdef.unflatten(ls), *v), in_axes=(leaf_axes,) + (0,) * num_mapped)(leaves, *vs)

    return mapped


def matmat(op: Operator, X: jax.Array) -> jax.Array:
    """``A`` applied to each row of ``X`` ``[L, n]`` -> ``[L, n]`` (several right-hand sides).

    BCOO: one gather of the rows of ``X^T`` ``[n, L]`` at the column indices and one
    scatter-add of ``L``-wide rows (``vmap`` of the matvec would scatter ``L`` times more
    single entries, ~10x slower on CPU); dense: one matrix product; functions: ``vmap``.
    """
    if isinstance(op, jax.tree_util.Partial):
        return jax.vmap(op)(X)
    if isinstance(op, jsparse.BCOO):
        rows, cols = op.indices[:, 0], op.indices[:, 1]
        XT = X.T
        return jnp.zeros(XT.shape, jnp.result_type(op.dtype, X.dtype)).at[rows].add(op.data[:, None] * XT[cols]).T
    return X @ op.T


def entries_finite(op: Operator) -> jax.Array:
    """bool scalar: every stored entry is finite (True for matvec functions: checked via A x)."""
    if isinstance(op, jsparse.BCOO):
        return jnp.isfinite(op.data).all()
    if isinstance(op, jax.tree_util.Partial):
        return jnp.bool_(True)
    return jnp.isfinite(op).all()


def check_system(op: Operator, b, name: str = "A"):
    """Raise ``ValueError`` (before tracing) unless ``op`` maps ``b``'s shape ``[n]`` to ``[n]``;
    returns the dtype of ``op``'s entries (matrices) or of ``op(b)`` (functions)."""
    b_shape = tuple(np.shape(b))
    if len(b_shape) != 1:
        raise ValueError(f"b must be a vector [n]; got shape {b_shape} (vmap over several right-hand sides)")
    n = b_shape[0]
    if n == 0:
        raise ValueError("b is empty (n = 0)")
    if is_explicit(op):
        if tuple(op.shape) != (n, n):
            raise ValueError(f"{name} has shape {tuple(op.shape)} but b has shape {b_shape}; need {name} [n, n] with n = {n}")
        return jnp.dtype(op.dtype)
    try:
        out = jax.eval_shape(op, jax.ShapeDtypeStruct(b_shape, jnp.result_type(b)))
    except Exception as e:  # noqa: BLE001 - surface the user's error with context
        raise ValueError(f"{name}(v) failed for v of shape {b_shape}: {type(e).__name__}: {e}") from e
    if tuple(out.shape) != b_shape:
        raise ValueError(f"{name}(v) returns shape {tuple(out.shape)} for v of shape {b_shape}; must return [n]")
    return jnp.dtype(out.dtype)


def diagonal(op: Operator) -> jax.Array:
    """Main diagonal ``[n]`` of an explicit matrix (duplicates in BCOO are summed)."""
    if not is_explicit(op):
        raise ValueError("the diagonal of a matvec function is unknown; pass a dense or sparse matrix")
    if isinstance(op, jsparse.BCOO):
        rows, cols = op.indices[:, 0], op.indices[:, 1]
        vals = jnp.where(rows == cols, op.data, 0)
        return jnp.zeros(op.shape[0], op.dtype).at[rows].add(vals)
    return jnp.diagonal(op)


def diagonal_blocks(op: Operator, block_size: int) -> jax.Array:
    """Diagonal blocks ``[nb, k, k]`` (``nb = ceil(n / k)``); the padding past ``n`` is identity."""
    if not is_explicit(op):
        raise ValueError("diagonal blocks of a matvec function are unknown; pass a dense or sparse matrix")
    n, k = op.shape[0], int(block_size)
    nb = -(-n // k)
    pad = nb * k - n
    if isinstance(op, jsparse.BCOO):
        rows, cols = op.indices[:, 0], op.indices[:, 1]
        same = (rows // k) == (cols // k)
        blocks = jnp.zeros((nb, k, k), op.dtype)
        blocks = blocks.at[rows // k, rows % k, cols % k].add(jnp.where(same, op.data, 0))
    else:
        Ap = jnp.pad(op, ((0, pad), (0, pad)))
        blocks = Ap.reshape(nb, k, nb, k)[jnp.arange(nb), :, jnp.arange(nb), :]
    if pad:
        idx = jnp.arange(n, nb * k)
        blocks = blocks.at[idx // k, idx % k, idx % k].set(1)
    return blocks


def to_dense(op: Operator, n: int | None = None, dtype=None) -> jax.Array:
    """Dense ``[n, n]`` matrix of any operator (matvec functions: by applying to the identity)."""
    if isinstance(op, jsparse.BCOO):
        return op.todense()
    if isinstance(op, jax.tree_util.Partial):
        eye = jnp.eye(n, dtype=dtype)
        return jax.vmap(op, in_axes=1, out_axes=1)(eye)
    return op


MatvecFn = Callable[[jax.Array], jax.Array]
