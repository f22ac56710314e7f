"""GMRES / FGMRES input faults: complex systems are rejected (not silently made real), bad shapes raise,
integer inputs are promoted, non-finite inputs give the documented status. All checks are static."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import sparse as jsparse

from jaxrl_reason.solvers import fgmres, gmres, krylov

N = 24  # >= the default restart (20)
rng = np.random.default_rng(0)
A = (4 * np.eye(N) + rng.standard_normal((N, N)) / np.sqrt(N)).astype(np.float32)
B = rng.standard_normal(N).astype(np.float32)
ZC = np.zeros(N, np.complex64)

SOLVERS = pytest.mark.parametrize("solve", [gmres, fgmres], ids=["gmres", "fgmres"])


@SOLVERS
@pytest.mark.parametrize("case", ["b", "x0", "A dense", "A sparse", "A(v)", "M(v)"])
def test_complex_inputs_are_rejected(solve, case):
    kw = {
        "b": dict(A=A, b=B + 1j * B),
        "x0": dict(A=A, b=B, x0=ZC + 1j),
        "A dense": dict(A=A + 1j * np.eye(N), b=B),
        "A sparse": dict(A=jsparse.BCOO.fromdense(A.astype(np.complex64)), b=B),
        "A(v)": dict(A=lambda v: A @ v + 1j * v, b=B),
        "M(v)": dict(A=A, b=B, M=lambda v: v * (1 + 1j)),
    }[case]
    with pytest.raises(TypeError, match="complex systems are not supported"):
        solve(kw.pop("A"), kw.pop("b"), **kw)


def test_complex_rejected_at_trace_time_under_jit():
    with pytest.raises(TypeError, match="b is complex"):
        jax.jit(lambda b: gmres(A, b).x)(jnp.asarray(B + 1j * B))


def test_fgmres_cycle_rejects_complex():
    matvec = lambda v: jnp.asarray(A) @ v
    with pytest.raises(TypeError, match="complex"):
        krylov.fgmres_cycle(matvec, jnp.asarray(B + 1j * B), jnp.zeros(N, jnp.complex64), lambda v: v, 4, 1e-6)
    with pytest.raises(TypeError, match="precond"):
        krylov.fgmres_cycle(matvec, jnp.asarray(B), jnp.zeros(N), lambda v: v * 1j, 4, 1e-6)


@SOLVERS
def test_shape_mismatches_raise(solve):
    with pytest.raises(ValueError, match="shape"):
        solve(A, B[:-1])
    with pytest.raises(ValueError, match="vector"):
        solve(A, np.stack([B, B]))
    with pytest.raises(ValueError, match="shape"):
        solve(A[:, :-1], B)
    with pytest.raises(ValueError, match="returns shape"):
        solve(lambda v: v[:-1], B)
    with pytest.raises(ValueError, match="x0"):
        solve(A, B, x0=np.zeros(N + 1))


@SOLVERS
def test_integer_inputs_are_promoted(solve):
    Ai = np.round(4 * A).astype(np.int32)
    bi = np.arange(1, N + 1, dtype=np.int32)
    res = solve(Ai, bi, x0=np.zeros(N, np.int32), rtol=1e-6)
    assert res.x.dtype == jnp.float32 and bool(res.converged)
    np.testing.assert_allclose(np.asarray(res.x), np.linalg.solve(Ai.astype(np.float64), bi), rtol=1e-4, atol=1e-4)


@SOLVERS
@pytest.mark.parametrize("where", ["b", "A", "x0"])
def test_nonfinite_inputs_report_a_status(solve, where):
    b, a, x0 = B.copy(), A.copy(), np.zeros(N, np.float32)
    {"b": b, "A": a, "x0": x0}[where][..., 3] = np.nan
    res = solve(a, b, x0=x0)
    assert int(res.status) == krylov.NONFINITE_INPUT and not bool(res.converged)
    assert np.isfinite(np.asarray(res.x)).all()
