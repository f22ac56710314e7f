"""Finance linear systems with seeds and size/conditioning knobs (built with numpy/scipy;
``to_jax`` turns them into BCOO or dense JAX arrays).

- ``markowitz_kkt``: mean-variance KKT ``[[2 Sigma, A^T], [A, 0]] [w; lam] = [0; r*; 1]`` with
  ``A = [mu^T; 1^T]``; ``Sigma`` is a factor model ``B F B^T + D`` (conditioning set by
  ``idio_scale``) or a sample covariance of ``T = n / ratio`` returns (near-singular as
  ``ratio -> 1``), plus an optional ``ridge``. Symmetric indefinite, size ``n + 2``.
- ``black_scholes``: one theta-scheme step of the 1-D Black-Scholes PDE (theta = 1 implicit,
  0.5 Crank-Nicolson), tridiagonal ``[n, n]``; rhs is the explicit part applied to the payoff.
- ``heston``: one backward-Euler step of the 2-D Heston PDE with central differences including
  the mixed derivative (non-symmetric, ill-conditioned as dt grows); with default parameters
  the matrix is exactly the one of ``experiments/anchors/bench_gmres.py``. Unknowns are ordered
  S fastest: index ``iv * ns + is``.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp
from jax.experimental import sparse as jsparse


@dataclasses.dataclass(frozen=True)
class LinearSystem:
    """``A x = b`` as numpy/scipy objects. A: ``[n, n]`` ndarray or scipy sparse; b: ``[n]``."""

    A: object
    b: np.ndarray
    name: str
    params: dict

    @property
    def n(self) -> int:
        return self.b.shape[0]


def to_jax(A, *, sparse: bool | None = None, dtype=None):
    """scipy sparse -> BCOO (default) or dense; ndarray -> dense ``jnp`` array."""
    if sp.issparse(A):
        A = A.tocsr().astype(dtype or A.dtype)
        if sparse is False:
            return jnp.asarray(A.toarray())
        return jsparse.BCOO.from_scipy_sparse(A)
    A = np.asarray(A, dtype=dtype or np.asarray(A).dtype)
    return jsparse.BCOO.fromdense(A) if sparse else jnp.asarray(A)


def _check(cond, msg):
    if not cond:
        raise ValueError(msg)


def markowitz_kkt(seed: int = 0, n_assets: int = 100, n_factors: int = 5, *, covariance: str = "factor",
                  idio_scale: float = 0.1, ratio: float = 0.5, ridge: float = 0.0,
                  target_return: float | None = None) -> LinearSystem:
    """Markowitz KKT system of size ``n_assets + 2``.

    covariance="factor": ``Sigma = B F B^T + diag(d)`` with ``d ~ idio_scale^2 * U(0.5, 1.5)``;
    small ``idio_scale`` -> ill-conditioned. covariance="sample": sample covariance of
    ``T = ceil(n_assets / ratio)`` factor-model returns; ``ratio`` close to 1 -> near-singular.
    """
    _check(n_assets >= 2, f"n_assets must be >= 2, got {n_assets}")
    _check(n_factors >= 1, f"n_factors must be >= 1, got {n_factors}")
    _check(covariance in ("factor", "sample"), f"covariance must be 'factor' or 'sample', got {covariance!r}")
    _check(idio_scale > 0, f"idio_scale must be > 0, got {idio_scale}")
    _check(0 < ratio <= 1, f"ratio = n/T must be in (0, 1], got {ratio}")
    rng = np.random.default_rng(seed)
    n = n_assets
    B = rng.standard_normal((n, n_factors)) * 0.2
    F = np.diag(rng.uniform(0.5, 1.5, n_factors))
    d = idio_scale**2 * rng.uniform(0.5, 1.5, n)
    mu = 0.05 + 0.1 * rng.standard_normal(n) * 0.2
    if covariance == "factor":
        Sigma = B @ F @ B.T + np.diag(d)
    else:
        T = int(np.ceil(n / ratio))
        R = rng.standard_normal((T, n_factors)) @ np.sqrt(F) @ B.T + rng.standard_normal((T, n)) * np.sqrt(d)
        R -= R.mean(0)
        Sigma = R.T @ R / (T - 1)
    Sigma = Sigma + ridge * np.eye(n)
    A = np.vstack([mu, np.ones(n)])
    K = np.block([[2 * Sigma, A.T], [A, np.zeros((2, 2))]])
    r = float(mu.mean() if target_return is None else target_return)
    b = np.concatenate([np.zeros(n), [r, 1.0]])
    return LinearSystem(K, b, "markowitz", dict(seed=seed, n_assets=n, n_factors=n_factors,
                                                covariance=covariance, idio_scale=idio_scale, ratio=ratio))


def black_scholes(seed: int = 0, n: int = 1000, *, dt: float = 0.01, theta: float = 1.0, sigma: float | None = None,
                  r: float | None = None, strike: float = 100.0, smax: float = 300.0) -> LinearSystem:
    """Tridiagonal ``(I - theta dt L) V1 = (I + (1 - theta) dt L) payoff`` with
    ``L = 0.5 sigma^2 S^2 D2 + r S D1 - r`` on ``n`` interior nodes; sigma, r drawn from the seed
    when not given."""
    _check(n >= 3, f"n must be >= 3, got {n}")
    _check(dt > 0, f"dt must be > 0, got {dt}")
    _check(0 <= theta <= 1, f"theta must be in [0, 1], got {theta}")
    rng = np.random.default_rng(seed)
    sigma = float(rng.uniform(0.1, 0.6) if sigma is None else sigma)
    r = float(rng.uniform(0.0, 0.08) if r is None else r)
    h = smax / (n + 1)
    S = h * np.arange(1, n + 1)
    a = 0.5 * sigma**2 * S**2 / h**2
    c = r * S / (2 * h)
    L = sp.diags([(a - c)[1:], -2 * a - r, (a + c)[:-1]], [-1, 0, 1], format="csr")
    eye = sp.identity(n, format="csr")
    payoff = np.maximum(S - strike, 0.0)
    A = (eye - theta * dt * L).tocsr()
    b = (eye + (1 - theta) * dt * L) @ payoff
    return LinearSystem(A, b, "black_scholes", dict(seed=seed, n=n, dt=dt, theta=theta, sigma=sigma, r=r))


def heston_matrix(ns: int = 64, nv: int = 64, dt: float = 0.5, r: float = 0.03, kappa: float = 1.5,
                  theta: float = 0.04, sigma: float = 0.3, rho: float = -0.9, smax: float = 200.0,
                  vmax: float = 1.0) -> sp.csr_matrix:
    """``I - dt L`` of the 2-D Heston operator (same discretisation as the anchor script)."""
    _check(ns >= 3 and nv >= 3, f"need ns, nv >= 3, got {ns}, {nv}")
    _check(dt > 0, f"dt must be > 0, got {dt}")
    S, V = np.linspace(0, smax, ns), np.linspace(0, vmax, nv)
    hs, hv = S[1] - S[0], V[1] - V[0]
    Is = sp.identity(ns)
    D1 = lambda n, h: sp.diags([-1, 1], [-1, 1], shape=(n, n), dtype=float) / (2 * h)
    D2 = lambda n, h: sp.diags([1, -2, 1], [-1, 0, 1], shape=(n, n), dtype=float) / h**2
    Sd, Vd = sp.diags(S), sp.diags(V)
    L = (0.5 * sp.kron(Vd, Sd @ Sd @ D2(ns, hs)) + 0.5 * sigma**2 * sp.kron(Vd @ D2(nv, hv), Is)
         + rho * sigma * sp.kron(Vd @ D1(nv, hv), Sd @ D1(ns, hs)) + r * sp.kron(sp.identity(nv), Sd @ D1(ns, hs))
         + kappa * sp.kron(sp.diags(theta - V) @ D1(nv, hv), Is) - r * sp.identity(ns * nv))
    return (sp.identity(ns * nv) - dt * L).tocsr()


HESTON_DEFAULTS = dict(r=0.03, kappa=1.5, theta=0.04, sigma=0.3, rho=-0.9)


def heston(seed: int = 0, ns: int = 64, nv: int | None = None, *, dt: float = 0.5, randomize: bool = True) -> LinearSystem:
    """Heston step with a standard-normal rhs. ``randomize=False`` (or seed 0 with
    ``randomize=False``) gives the anchor's parameters; otherwise parameters are drawn around
    them: r in [0, 0.06], kappa in [0.5, 3], theta in [0.02, 0.1], sigma in [0.1, 0.5], rho in [-0.95, -0.3]."""
    nv = ns if nv is None else nv
    rng = np.random.default_rng(seed)
    p = dict(HESTON_DEFAULTS)
    if randomize:
        p = dict(r=rng.uniform(0, 0.06), kappa=rng.uniform(0.5, 3.0), theta=rng.uniform(0.02, 0.1),
                 sigma=rng.uniform(0.1, 0.5), rho=rng.uniform(-0.95, -0.3))
    A = heston_matrix(ns, nv, dt, **p)
    b = rng.standard_normal(ns * nv)
    return LinearSystem(A, b, "heston", dict(seed=seed, ns=ns, nv=nv, dt=dt, **{k: float(v) for k, v in p.items()}))
