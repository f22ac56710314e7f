"""Block cyclic reduction, ILU(0) and the meta-learned polynomial preconditioner."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

from jaxrl_reason.solvers import fgmres, finance, learned
from jaxrl_reason.solvers import preconditioners as pc


def _block_tridiag(nb, k, seed=0):
    rng = np.random.default_rng(seed)
    A = np.zeros((nb * k, nb * k))
    for i in range(nb):
        for j in range(max(0, i - 1), min(nb, i + 2)):
            A[i * k:(i + 1) * k, j * k:(j + 1) * k] = rng.standard_normal((k, k)) + (4 * np.eye(k) if i == j else 0)
    return A


@pytest.mark.parametrize("nb", [1, 2, 5, 8])
def test_cyclic_reduction_is_exact_with_all_levels(nb):
    A = _block_tridiag(nb, 3)
    v = np.random.default_rng(1).standard_normal(A.shape[0])
    with jax.enable_x64(True):
        T = learned.block_tridiagonal(finance.to_jax(sp.csr_matrix(A)), 3)
        np.testing.assert_allclose(np.asarray(T(jnp.asarray(v))), A @ v, atol=1e-12)
        z = learned.cyclic_reduction(T)(jnp.asarray(v))
    np.testing.assert_allclose(np.asarray(z), np.linalg.solve(A, v), atol=1e-10)


def test_truncated_cyclic_reduction_beats_block_jacobi_on_heston():
    s = finance.heston(3, ns=16, nv=16, dt=1.0)
    with jax.enable_x64(True):
        A, b = finance.to_jax(s.A), jnp.asarray(s.b)
        T = learned.block_tridiagonal(A, 16)
        its = [int(fgmres(A, b, M=learned.cyclic_reduction(T, lv), restart=40, maxiter=400, rtol=1e-8).iterations)
               for lv in (0, 2, 4)]
    assert its[0] > its[1] > its[2] == 1, its


def test_block_tridiagonal_bad_input():
    A = np.eye(6)
    A[0, 5] = 1.0
    with pytest.raises(ValueError, match="not block tridiagonal"):
        learned.block_tridiagonal(jnp.asarray(A), 2)
    with pytest.raises(ValueError, match="multiple"):
        learned.block_tridiagonal(jnp.eye(6), 4)
    with pytest.raises(ValueError, match="levels"):
        learned.cyclic_reduction(learned.block_tridiagonal(jnp.eye(8), 2), 5)


def test_safe_block_inverse_shifts_only_singular_blocks_and_runs_one_lu_unless_needed():
    rng = np.random.default_rng(0)
    blocks = rng.standard_normal((4, 3, 3)) + 3 * np.eye(3)
    blocks[2] = 0.0  # singular: inverted after a diagonal shift
    blocks[3, :, 0] = 0.0  # singular, nonzero
    inv = np.asarray(jax.jit(pc.safe_block_inverse)(jnp.asarray(blocks)))
    assert np.isfinite(inv).all()
    np.testing.assert_allclose(inv[:2], np.linalg.inv(blocks[:2]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(inv[2], np.eye(3) / np.sqrt(np.finfo(np.float32).eps), rtol=1e-3)
    # the fallback LU sits in the conditional's branch, never beside the first one (two
    # independent batched LU calls can deadlock XLA CPU's intra-op pool)
    hlo = jax.jit(pc.safe_block_inverse).lower(jnp.asarray(blocks)).compile().as_text()
    entry = hlo[hlo.index("ENTRY"):]
    assert entry.count("getrf") == 1 and "conditional(" in entry


def _ref_ilu0(A):
    A = np.array(A, float)
    n = A.shape[0]
    S = A != 0
    np.fill_diagonal(S, True)
    for i in range(1, n):
        for k in range(i):
            if S[i, k]:
                A[i, k] /= A[k, k]
                A[i, k + 1:] -= np.where(S[i, k + 1:], A[i, k] * A[k, k + 1:], 0)
    return np.tril(A, -1) + np.eye(n), np.triu(A)


def test_ilu0_matches_reference_and_approximate_variant_is_close():
    n = 30
    A = sp.random(n, n, density=0.15, random_state=1).toarray() + 4 * np.eye(n)
    L, U = _ref_ilu0(A)
    v = np.random.default_rng(0).standard_normal(n)
    want = np.linalg.solve(U, np.linalg.solve(L, v))
    with jax.enable_x64(True):
        exact = pc.ilu0(finance.to_jax(sp.csr_matrix(A)))(jnp.asarray(v))
        dense = pc.ilu0(jnp.asarray(A))(jnp.asarray(v))
        approx = pc.ilu0(jnp.asarray(A), sweeps=3, tri_iters=3)(jnp.asarray(v))
    np.testing.assert_allclose(np.asarray(exact), want, atol=1e-12)
    np.testing.assert_allclose(np.asarray(dense), want, atol=1e-12)
    err = np.abs(np.asarray(approx) - want).max() / np.abs(want).max()
    assert 0 < err < 1e-2


def test_ilu0_is_exact_lu_on_tridiagonal_black_scholes():
    s = finance.black_scholes(0, n=100, dt=0.5)
    with jax.enable_x64(True):
        A = finance.to_jax(s.A)
        r = fgmres(A, jnp.asarray(s.b), M=pc.ilu0(A), rtol=1e-10)
    assert bool(r.converged) and int(r.iterations) == 1


def test_ilu0_bad_input():
    with pytest.raises(ValueError, match="matvec"):
        pc.ilu0(lambda v: v)
    with pytest.raises(ValueError, match="sweeps"):
        pc.ilu0(jnp.eye(3), sweeps=-1)


@pytest.mark.slow
def test_learned_coefficients_beat_the_base_preconditioner_on_held_out_systems():
    def stack(seeds, ns):
        ts = [learned.block_tridiagonal(finance.to_jax(finance.heston(s, ns=ns, dt=1.5).A), ns) for s in seeds]
        return jax.tree.map(lambda *a: jnp.stack(a), *ts)

    train, test = stack(range(6), 8), stack(range(100, 103), 8)
    with jax.enable_x64(True):
        train, test = jax.tree.map(lambda a: a.astype(jnp.float64), (train, test))
        net0, _ = learned.train_coefficient_net(train, levels=-2, degree=3, steps=0)
        net, losses = learned.train_coefficient_net(train, levels=-2, degree=3, steps=60, lr=1e-2)
        held = jax.jit(lambda n_: jnp.mean(jax.vmap(lambda t: learned.residual_loss(n_, t, -2, jax.random.key(7)))(
            test)))
        before, after = float(held(net0)), float(held(net))
    assert np.isfinite(np.asarray(losses)).all()
    assert after < before - 0.3, (before, after)
