"""GMRES / FGMRES: agreement with scipy, flexible == right-preconditioned, operators, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse.linalg as spla
from jax.experimental import sparse as jsparse

from jaxrl_reason.solvers import fgmres, gmres, krylov
from jaxrl_reason.solvers import preconditioners as pc

N = 40


def _system(n=N, seed=0, shift=4.0):
    rng = np.random.default_rng(seed)
    A = shift * np.eye(n) + rng.standard_normal((n, n)) / np.sqrt(n)
    return A, rng.standard_normal(n)


def test_history_matches_scipy_float64():
    A, b = _system()
    hist = []
    spla.gmres(A, b, rtol=1e-12, restart=8, maxiter=50, callback=hist.append, callback_type="pr_norm")
    with jax.enable_x64(True):
        res = gmres(jnp.asarray(A), jnp.asarray(b), restart=8, rtol=1e-12)
        assert res.x.dtype == jnp.float64
    hist = np.asarray(hist)
    k = min(len(hist), int(res.iterations))
    assert k >= 16  # spans several restart cycles
    ours, ref = np.asarray(res.residual_history)[1 : k + 1], hist[:k]
    # above the round-off floor the histories agree to far better than 1e-6; below ~1e-10 the
    # restart residual ||b - A x|| is cancellation-dominated (summation order moves it by ~1e-6 rel.)
    above = ref > 1e-10
    assert above.sum() >= 12
    np.testing.assert_allclose(ours[above], ref[above], rtol=1e-9)
    np.testing.assert_allclose(ours, ref, rtol=1e-5)
    assert bool(res.converged) and int(res.status) == krylov.CONVERGED
    assert float(res.relative_residual) <= 1e-12
    np.testing.assert_allclose(np.asarray(res.x), np.linalg.solve(A, b), rtol=1e-9)


def test_fgmres_fixed_preconditioner_equals_right_preconditioned_gmres():
    A, b = _system(shift=1.5)
    with jax.enable_x64(True):
        Aj, bj = jnp.asarray(A), jnp.asarray(b)
        M = pc.block_jacobi(Aj, 8)
        r1 = gmres(Aj, bj, M=M, restart=6, rtol=1e-10)
        r2 = fgmres(Aj, bj, M=M, restart=6, rtol=1e-10)
        r0 = gmres(Aj, bj, restart=6, rtol=1e-10)
    assert int(r1.iterations) == int(r2.iterations) and bool(r1.converged)
    np.testing.assert_allclose(np.asarray(r2.residual_history), np.asarray(r1.residual_history), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(r2.x), np.asarray(r1.x), rtol=1e-9, atol=1e-12)
    assert int(r1.iterations) < int(r0.iterations)  # the preconditioner is actually used


def test_dense_sparse_matvec_agree_float32():
    A, b = _system()
    Aj, bj = jnp.asarray(A, jnp.float32), jnp.asarray(b, jnp.float32)
    outs = [gmres(op, bj, restart=10, rtol=1e-5) for op in
            (Aj, jsparse.BCOO.fromdense(Aj), jsparse.BCSR.fromdense(Aj), lambda v: Aj @ v)]
    for r in outs:
        assert r.x.dtype == jnp.float32 and bool(r.converged)
        np.testing.assert_allclose(np.asarray(r.x), np.asarray(outs[0].x), rtol=1e-4, atol=1e-5)


def test_vmap_over_rhs_and_jit():
    A, _ = _system()
    Aj = jnp.asarray(A, jnp.float32)
    B = jax.random.normal(jax.random.key(0), (5, N))
    batched = jax.jit(jax.vmap(lambda b: fgmres(Aj, b, restart=10, rtol=1e-5)))(B)
    assert batched.x.shape == (5, N) and bool(batched.converged.all())
    single = fgmres(Aj, B[3], restart=10, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(batched.x[3]), np.asarray(single.x), rtol=1e-4, atol=1e-5)


def _group_bytes(lanes: int, restart: int, n: int) -> int:
    """A ``CPU_LANE_GROUP_BYTES`` that makes the flexible solver run ``lanes`` lanes per group (float64)."""
    return lanes * krylov.basis_rows(restart) * n * 8 * 2


@pytest.fixture(scope="module", params=["one lockstep group", "groups of 2 lanes"])
def lockstep_case(request):
    """5 right-hand sides that stop at different points (one zero, one NaN), solved batched, in one
    lockstep group or (as on the CPU for large bases) in groups of 2 with one lane of padding."""
    with pytest.MonkeyPatch.context() as mp:
        if request.param == "groups of 2 lanes":
            mp.setattr(krylov, "CPU_LANE_GROUP_BYTES", _group_bytes(2, 7, N))
            assert krylov.lanes_per_group(5, N, jnp.float64, 7, True) == 2
        return _solve_lockstep_case()


def _solve_lockstep_case():
    A, _ = _system(shift=1.5)
    B = np.random.default_rng(3).standard_normal((5, N))
    B[1] *= 1e-3  # same direction scale: converges with the others
    B[2] = A @ np.eye(N)[0]  # x = e_0: quick
    B[3] = 0.0  # converged at once
    B[4, 2] = np.nan  # reported, must not disturb the others
    with jax.enable_x64(True):
        Aj, Bj = jnp.asarray(A), jnp.asarray(B)
        M = pc.block_jacobi(Aj, 4)
        solve = lambda b: fgmres(Aj, b, M=M, restart=7, maxiter=60, rtol=1e-10)
        batched = jax.jit(jax.vmap(solve))(Bj)
        singles = [solve(Bj[i]) for i in range(5)]
    return batched, singles


def test_vmap_lockstep_equals_per_rhs_solves(lockstep_case):
    batched, singles = lockstep_case
    its = [int(r.iterations) for r in singles]
    assert len(set(its)) >= 3, its  # lanes really stop at different iterations
    for i, r in enumerate(singles):
        assert int(batched.iterations[i]) == int(r.iterations)
        assert int(batched.status[i]) == int(r.status) and int(batched.restarts[i]) == int(r.restarts)
        np.testing.assert_allclose(np.asarray(batched.residual_history[i]), np.asarray(r.residual_history),
                                   rtol=1e-6, atol=1e-14)
        np.testing.assert_allclose(np.asarray(batched.x[i]), np.asarray(r.x), rtol=1e-8, atol=1e-12)
    assert int(batched.status[4]) == krylov.NONFINITE_INPUT and int(batched.status[3]) == krylov.CONVERGED
    assert bool(batched.converged[:4].all())


@pytest.mark.parametrize("group_lanes", [2, 1])
def test_vmap_over_systems_and_iteration_dependent_preconditioner(monkeypatch, group_lanes):
    monkeypatch.setattr(krylov, "CPU_LANE_GROUP_BYTES", _group_bytes(group_lanes, 10, N) // 2)  # float32
    A0, b0 = _system(shift=1.5)
    A1, b1 = _system(seed=1, shift=2.0)
    As, bs = jnp.asarray(np.stack([A0, A1]), jnp.float32), jnp.asarray(np.stack([b0, b1]), jnp.float32)

    def solve(A, b):
        M2, M8 = pc.block_jacobi(A, 2), pc.block_jacobi(A, 8)
        switch = lambda v, it: jax.lax.cond(it % 2 == 0, lambda u: M2(u), lambda u: M8(u), v)
        return fgmres(A, b, M=switch, restart=10, rtol=1e-5, iteration_dependent=True)

    batched = jax.jit(jax.vmap(solve))(As, bs)
    single = jax.jit(solve)
    for i in range(2):
        r = single(As[i], bs[i])
        assert bool(r.converged) and int(batched.iterations[i]) == int(r.iterations)
        np.testing.assert_allclose(np.asarray(batched.x[i]), np.asarray(r.x), rtol=1e-4, atol=1e-5)


def test_iteration_dependent_flexible_preconditioner():
    A, b = _system(shift=1.5)
    Aj, bj = jnp.asarray(A, jnp.float32), jnp.asarray(b, jnp.float32)
    M2, M8 = pc.block_jacobi(Aj, 2), pc.block_jacobi(Aj, 8)
    switch = lambda v, it: jax.lax.cond(it % 2 == 0, lambda u: M2(u), lambda u: M8(u), v)
    r = fgmres(Aj, bj, M=switch, restart=10, rtol=1e-5, iteration_dependent=True)
    assert bool(r.converged), r.message


def test_non_convergence_is_flagged_not_nan():
    A, b = _system(shift=0.3)  # eigenvalues around the origin: GMRES(2) crawls
    r = gmres(jnp.asarray(A, jnp.float32), jnp.asarray(b, jnp.float32), restart=2, maxiter=6, rtol=1e-8)
    assert not bool(r.converged) and int(r.status) in (krylov.MAXITER, krylov.STAGNATION)
    assert int(r.iterations) <= 6 and np.isfinite(np.asarray(r.x)).all()
    assert np.isfinite(np.asarray(r.residual_history)).all()
    assert "not converged" in r.message


def test_singular_inconsistent_system_reports_failure():
    A, b = _system(n=20)
    A[:, 0] = 0.0  # singular; b has a component outside range(A)
    b = b.copy()
    b[:] = 0.0
    b[0] = 1.0
    A[0, :] = 0.0
    r = gmres(jnp.asarray(A, jnp.float32), jnp.asarray(b, jnp.float32), restart=20, rtol=1e-6, maxiter=200)
    assert not bool(r.converged)
    assert int(r.status) in (krylov.BREAKDOWN, krylov.STAGNATION), r.message
    assert np.isfinite(np.asarray(r.x)).all()


def test_indefinite_kkt_system_converges():
    n = 30
    rng = np.random.default_rng(1)
    Q = rng.standard_normal((n, n))
    H = Q @ Q.T / n + np.eye(n)
    C = rng.standard_normal((3, n))
    K = np.block([[H, C.T], [C, np.zeros((3, 3))]])
    assert (np.linalg.eigvalsh(K) < 0).sum() == 3
    rhs = rng.standard_normal(n + 3)
    r = gmres(jnp.asarray(K, jnp.float32), jnp.asarray(rhs, jnp.float32), restart=33, rtol=1e-5)
    assert bool(r.converged), r.message


@pytest.mark.parametrize("where", ["A", "b"])
def test_nan_or_inf_input_is_reported(where):
    A, b = _system()
    A, b = A.astype(np.float32), b.astype(np.float32)
    if where == "A":
        A[3, 5] = np.nan
    else:
        b[7] = np.inf
    for op in (jnp.asarray(A), jsparse.BCOO.fromdense(jnp.asarray(A))):
        r = gmres(op, jnp.asarray(b), restart=10)
        assert int(r.status) == krylov.NONFINITE_INPUT and not bool(r.converged)
        assert np.isfinite(np.asarray(r.x)).all() and int(r.iterations) == 0


def test_preconditioner_nan_is_reported():
    A, b = _system()
    Aj, bj = jnp.asarray(A, jnp.float32), jnp.asarray(b, jnp.float32)
    bad = pc.Jacobi(inv_diag=jnp.ones(N).at[4].set(jnp.nan))
    for solve in (gmres, fgmres):
        r = solve(Aj, bj, M=bad, restart=10)
        assert int(r.status) == krylov.NONFINITE_PRECONDITIONER, r.message
        assert np.isfinite(np.asarray(r.x)).all() and not bool(r.converged)


def test_bad_arguments_raise_before_tracing():
    A, b = _system()
    Aj, bj = jnp.asarray(A, jnp.float32), jnp.asarray(b, jnp.float32)
    with pytest.raises(ValueError, match="shape"):
        gmres(Aj, bj[:-1])
    with pytest.raises(ValueError, match="vector"):
        gmres(Aj, jnp.stack([bj, bj]))
    with pytest.raises(ValueError, match="restart"):
        gmres(Aj, bj, restart=N + 1)
    with pytest.raises(ValueError, match="returns shape"):
        gmres(lambda v: v[:-1], bj)
    with pytest.raises(ValueError, match="preconditioner M returns shape"):
        fgmres(Aj, bj, M=lambda v: jnp.concatenate([v, v]))
    with pytest.raises(ValueError, match="maxiter"):
        gmres(Aj, bj, maxiter=0)
    with pytest.raises(ValueError, match="x0"):
        gmres(Aj, bj, x0=jnp.zeros(3))


def test_zero_rhs_returns_zero():
    A, _ = _system()
    r = gmres(jnp.asarray(A, jnp.float32), jnp.zeros(N, jnp.float32))
    assert bool(r.converged) and int(r.iterations) == 0 and float(jnp.abs(r.x).max()) == 0


@pytest.mark.parametrize("group_lanes", [3, 1])
def test_vmap_over_sparse_systems_with_a_shared_pattern(monkeypatch, group_lanes):
    """BCOO matrices whose data is batched and whose indices are shared (one sparsity pattern, as
    for a family of discretised PDE steps): each lane equals its own solve, in one lockstep group or
    one lane at a time."""
    monkeypatch.setattr(krylov, "CPU_LANE_GROUP_BYTES", _group_bytes(group_lanes, 10, N) // 2)  # float32
    dense = [_system(seed=s, shift=2.0 + s)[0] for s in range(3)]
    pattern = np.abs(np.random.default_rng(5).standard_normal((N, N))) > 1.0
    np.fill_diagonal(pattern, True)
    rows, cols = np.nonzero(pattern)
    idx = jnp.asarray(np.stack([rows, cols], 1))
    data = jnp.asarray(np.stack([A[rows, cols] for A in dense]), jnp.float32)
    B = jax.random.normal(jax.random.key(1), (3, N))

    def solve(d, b):
        A = jsparse.BCOO((d, idx), shape=(N, N))
        return fgmres(A, b, M=pc.jacobi(A), restart=10, rtol=1e-5)

    batched = jax.jit(jax.vmap(solve))(data, B)
    for i in range(3):
        r = solve(data[i], B[i])
        assert bool(r.converged) and int(batched.iterations[i]) == int(r.iterations)
        np.testing.assert_allclose(np.asarray(batched.x[i]), np.asarray(r.x), rtol=1e-4, atol=1e-5)


def test_a_cycle_that_raises_the_residual_is_discarded():
    """Nearly rank-one preconditioned directions (M v = 1e6 c + v) break the Arnoldi relation in
    float32: the cycle's update makes the true residual worse; the solver reports failure and
    keeps the better iterate (here x0), it does not return the worse one (relres 1.69 before)."""
    rng = np.random.default_rng(0)
    A = 4.0 * np.eye(N) + rng.standard_normal((N, N)) / np.sqrt(N)
    b, c = rng.standard_normal(N), rng.standard_normal(N)
    Aj, bj, cj = (jnp.asarray(a, jnp.float32) for a in (A, b, c))
    res = fgmres(Aj, bj, M=lambda v: 1e6 * cj + v, restart=10, maxiter=40, rtol=1e-6)
    assert not bool(res.converged) and int(res.status) != krylov.CONVERGED
    assert float(res.relative_residual) <= 1.0 + 1e-6
    np.testing.assert_allclose(float(res.residual_norm), float(jnp.linalg.norm(bj - Aj @ res.x)), rtol=1e-4)


def test_cpu_lane_groups_fit_the_cache_budget():
    if jax.default_backend() != "cpu":
        pytest.skip("lane groups are a CPU rule")
    per_lane = krylov.basis_rows(50) * 64 * 8 * 2  # restart 50, float64, flexible, n = 64
    assert 16 * per_lane <= krylov.CPU_LANE_GROUP_BYTES < 21 * per_lane
    assert krylov.lanes_per_group(64, 64, jnp.float64, 50, True) == 16  # 4 equal groups
    assert krylov.lanes_per_group(64, 256, jnp.float64, 50, True) == 5  # 13 groups, 1 lane of padding
    assert krylov.lanes_per_group(64, 1024, jnp.float64, 50, True) == 1
    assert krylov.lanes_per_group(3, 16, jnp.float64, 50, True) == 3
