"""GMRES(m) and flexible GMRES(m), pure and jittable, with a typed result.

Why hand-written: jax.scipy's ``gmres`` returns no iteration count, convergence flag or
history, and neither it nor lineax has a *flexible* variant (a right preconditioner that
may change at every iteration), which FGMRES and the RL block-size policy need.

Algorithm (Saad, *Iterative Methods*, Alg. 6.9 / 9.6): restarted Arnoldi with classical
Gram-Schmidt applied twice (CGS2: as stable as modified GS, but two matrix-vector
products instead of a loop), Givens rotations on the Hessenberg matrix, exit inside a
cycle as soon as the estimated residual meets the tolerance, true residual recomputed
at every restart. Everything is ``lax.while_loop``: ``jit``/``vmap`` (over right-hand
sides or whole systems) work; a vmapped batch runs until its slowest member finishes.

Precision: the arithmetic follows ``b``'s dtype. For float64 enable x64 first
(``jax.config.update("jax_enable_x64", True)`` globally, or locally ``with jax.enable_x64(True):``);
otherwise JAX silently computes in float32 and 1e-8 tolerances are out of reach.

Tolerance: converged when ``||b - A x|| <= max(rtol * ||b||, atol)`` (scipy's rule), judged
on the true residual at the end of a cycle. ``maxiter`` counts inner iterations (matvecs
with ``A`` in the Arnoldi process), not restart cycles as scipy does.

Failure is never silent: ``status`` (see ``STATUS_MESSAGES``) says why the solve stopped,
``converged`` is False unless the tolerance was met, and ``x`` stays finite (the last
finite iterate) when the input or the preconditioner produces NaN/Inf.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_reason.solvers import operators as ops

RUNNING, CONVERGED, MAXITER, BREAKDOWN, STAGNATION, NONFINITE_INPUT, NONFINITE_PRECONDITIONER, NONFINITE_ITERATE = range(8)
STATUS_MESSAGES = (
    "running",
    "converged: residual norm <= max(rtol*||b||, atol)",
    "not converged: iteration limit (maxiter) reached",
    "not converged: Arnoldi breakdown with non-zero residual (A or A*M singular; b not in its range?)",
    "not converged: stagnation, a whole restart cycle did not reduce the residual (singular or "
    "badly preconditioned system; try a larger restart or a better preconditioner)",
    "not converged: A or b contains NaN/Inf",
    "not converged: the preconditioner produced NaN/Inf (x is the last finite iterate)",
    "not converged: A*v produced NaN/Inf during the iteration (overflow?)",
)


def status_message(status) -> str:
    """Human-readable reason for a (concrete) ``status`` code."""
    return STATUS_MESSAGES[int(status)]


@struct.dataclass
class KrylovResult:
    """Outcome of a solve (add a leading batch axis when vmapped).

    x: ``[n]`` solution (last finite iterate). residual_norm: true ``||b - A x||``.
    relative_residual: ``residual_norm / ||b||``. iterations: int32 inner iterations used.
    restarts: int32 completed cycles. converged: bool. status: int32 code into ``STATUS_MESSAGES``.
    residual_history: ``[maxiter + 1]`` estimated relative residual after each inner iteration
    (entry 0 is the initial one); entries past ``iterations`` repeat the last value.
    """

    x: jax.Array
    residual_norm: jax.Array
    relative_residual: jax.Array
    iterations: jax.Array
    restarts: jax.Array
    converged: jax.Array
    status: jax.Array
    residual_history: jax.Array

    @property
    def message(self) -> str:
        return status_message(self.status)


@struct.dataclass
class ArnoldiState:
    """One GMRES cycle in progress (``m`` = restart length).

    V: ``[m+1, n]`` orthonormal basis. Z: ``[m, n]`` preconditioned directions (flexible
    variant; ``[0, n]`` otherwise). R: ``[m, m+1]`` row ``j`` = rotated Hessenberg column
    ``j``. cs, sn: ``[m]`` Givens rotations. g: ``[m+1]`` rotated ``beta e_1``.
    j: int32 steps done. breakdown: bool, an exact invariant subspace was met.
    """

    V: jax.Array
    Z: jax.Array
    R: jax.Array
    cs: jax.Array
    sn: jax.Array
    g: jax.Array
    j: jax.Array
    breakdown: jax.Array


def arnoldi_init(r: jax.Array, m: int, flexible: bool) -> ArnoldiState:
    """Start a cycle from the residual ``r`` ``[n]``."""
    n, dt = r.shape[0], r.dtype
    beta = jnp.linalg.norm(r)
    v0 = r / jnp.where(beta > 0, beta, 1)
    return ArnoldiState(
        V=jnp.zeros((m + 1, n), dt).at[0].set(v0),
        Z=jnp.zeros((m if flexible else 0, n), dt),
        R=jnp.zeros((m, m + 1), dt),
        cs=jnp.ones((m,), dt),
        sn=jnp.zeros((m,), dt),
        g=jnp.zeros((m + 1,), dt).at[0].set(beta),
        j=jnp.int32(0),
        breakdown=jnp.bool_(False),
    )


def arnoldi_step(matvec: Callable, st: ArnoldiState, z: jax.Array) -> ArnoldiState:
    """Extend the basis with ``A z`` where ``z = M_j(V[j])`` (``z = V[j]`` unpreconditioned)."""
    m = st.R.shape[0]
    j = st.j
    w = matvec(z)
    h0 = jnp.linalg.norm(w)
    mask = (jnp.arange(m + 1) <= j).astype(w.dtype)
    h = (st.V @ w) * mask
    w = w - h @ st.V
    h2 = (st.V @ w) * mask  # second Gram-Schmidt pass (CGS2)
    w = w - h2 @ st.V
    h = h + h2
    hn = jnp.linalg.norm(w)
    eps = jnp.finfo(w.dtype).eps
    broke = hn <= eps * h0
    V = st.V.at[j + 1].set(jnp.where(broke, 0, w / jnp.where(hn > 0, hn, 1)))
    h = h.at[j + 1].set(jnp.where(broke, 0, hn))

    def rotate(k, h):  # apply the earlier rotations k < j
        c, s = st.cs[k], st.sn[k]
        a, b = h[k], h[k + 1]
        new = jnp.where(k < j, jnp.stack([c * a + s * b, -s * a + c * b]), jnp.stack([a, b]))
        return jax.lax.dynamic_update_slice(h, new, (k,))

    h = jax.lax.fori_loop(0, m, rotate, h)
    a, b = h[j], h[j + 1]
    rr = jnp.hypot(a, b)
    c = jnp.where(rr > 0, a / jnp.where(rr > 0, rr, 1), 1)
    s = jnp.where(rr > 0, b / jnp.where(rr > 0, rr, 1), 0)
    h = h.at[j].set(rr).at[j + 1].set(0)
    gj = st.g[j]
    g = st.g.at[j].set(c * gj).at[j + 1].set(-s * gj)
    Z = st.Z.at[j].set(z) if st.Z.shape[0] else st.Z
    return ArnoldiState(V=V, Z=Z, R=st.R.at[j].set(h), cs=st.cs.at[j].set(c), sn=st.sn.at[j].set(s),
                        g=g, j=j + 1, breakdown=broke)


def arnoldi_coefficients(st: ArnoldiState) -> jax.Array:
    """Least-squares coefficients ``y`` ``[m]`` of the cycle (zero past ``st.j``)."""
    m = st.R.shape[0]
    active = jnp.arange(m) < st.j
    Rt = st.R[:, :m].T  # upper triangular [m, m]
    diag = jnp.diagonal(Rt)
    ok = active & (diag != 0)  # a zero pivot (singular breakdown) gets a zero coefficient, as in scipy
    Rt = jnp.where(active[:, None] & active[None, :], Rt, 0)
    Rt = Rt + jnp.diag(jnp.where(ok, 0, 1 - diag * active))
    g = jnp.where(ok, st.g[:m], 0)
    return jax.scipy.linalg.solve_triangular(Rt, g, lower=False)


def arnoldi_update(st: ArnoldiState, precond: Callable | None = None) -> jax.Array:
    """Correction ``dx`` ``[n]``: ``Z y`` (flexible) or ``M(V y)`` (fixed right preconditioner)."""
    y = arnoldi_coefficients(st)
    if st.Z.shape[0]:
        return y @ st.Z
    d = y @ st.V[:-1]
    return d if precond is None else precond(d)


@struct.dataclass
class _Loop:
    x: jax.Array
    rnorm: jax.Array
    its: jax.Array
    cycles: jax.Array
    status: jax.Array
    hist: jax.Array


def _solve(op, b, x0, precond, rtol, atol, *, restart, maxiter, flexible, iteration_dependent):
    matvec = lambda v: ops.matvec(op, v)
    if precond is None:
        apply_m = lambda v, it: v
    elif iteration_dependent:
        apply_m = precond
    else:
        apply_m = lambda v, it: precond(v)
    bnorm = jnp.linalg.norm(b)
    tol = jnp.maximum(rtol * bnorm, atol)
    scale = jnp.where(bnorm > 0, bnorm, 1)
    r0 = b - matvec(x0)
    rnorm0 = jnp.linalg.norm(r0)
    finite_in = jnp.isfinite(b).all() & jnp.isfinite(x0).all() & ops.entries_finite(op) & jnp.isfinite(r0).all()
    status0 = jnp.where(~finite_in, NONFINITE_INPUT, jnp.where(rnorm0 <= tol, CONVERGED, RUNNING))
    hist0 = jnp.full((maxiter + 1,), jnp.where(finite_in, rnorm0 / scale, jnp.inf), b.dtype)
    init = _Loop(x=jnp.where(finite_in, x0, 0), rnorm=jnp.where(finite_in, rnorm0, jnp.inf),
                 its=jnp.int32(0), cycles=jnp.int32(0), status=jnp.int32(status0), hist=hist0)
    init = init.replace(x=init.x.astype(b.dtype))

    def cycle(L: _Loop) -> _Loop:
        r = b - matvec(L.x)
        st0 = arnoldi_init(r, restart, flexible)

        def inner_cond(c):
            st, its, hist, bad = c
            return (st.j < restart) & (its < maxiter) & (jnp.abs(st.g[st.j]) > tol) & ~st.breakdown & (bad == 0)

        def inner_body(c):
            st, its, hist, bad = c
            z = apply_m(st.V[st.j], its)
            z_ok = jnp.isfinite(z).all()
            new = arnoldi_step(matvec, st, jnp.where(z_ok, z, 0))
            new_ok = z_ok & jnp.isfinite(new.R[st.j]).all() & jnp.isfinite(new.V[st.j + 1]).all()
            st = jax.tree.map(lambda a, o: jnp.where(new_ok, a, o), new, st)
            its = its + new_ok.astype(jnp.int32)
            hist = hist.at[its].set(jnp.abs(st.g[st.j]) / scale)
            bad = jnp.where(z_ok, jnp.where(new_ok, 0, NONFINITE_ITERATE), NONFINITE_PRECONDITIONER).astype(jnp.int32)
            return st, its, hist, bad

        st, its, hist, bad = jax.lax.while_loop(
            inner_cond, inner_body, (st0, L.its, L.hist, jnp.int32(0)))
        x_new = L.x + arnoldi_update(st, None if iteration_dependent else (lambda d: apply_m(d, its)))
        rn = jnp.linalg.norm(b - matvec(x_new))
        ok = jnp.isfinite(x_new).all() & jnp.isfinite(rn)
        x_new = jnp.where(ok, x_new, L.x)
        rn = jnp.where(ok, rn, L.rnorm)
        eps = jnp.finfo(b.dtype).eps
        status = jnp.select(
            [rn <= tol, bad != 0, ~ok, st.breakdown, rn >= L.rnorm * (1 - 100 * eps), its >= maxiter],
            [CONVERGED, bad, NONFINITE_ITERATE, BREAKDOWN, STAGNATION, MAXITER], RUNNING)
        return _Loop(x=x_new, rnorm=rn, its=its, cycles=L.cycles + 1, status=jnp.int32(status), hist=hist)

    L = jax.lax.while_loop(lambda L: L.status == RUNNING, cycle, init)
    hist = jnp.where(jnp.arange(maxiter + 1) > L.its, L.hist[L.its], L.hist)
    return KrylovResult(
        x=L.x, residual_norm=L.rnorm, relative_residual=L.rnorm / scale, iterations=L.its,
        restarts=L.cycles, converged=L.status == CONVERGED, status=L.status, residual_history=hist)


_solve_jit = jax.jit(_solve, static_argnames=("restart", "maxiter", "flexible", "iteration_dependent"))


def _wrap_precond(M):
    if M is None or isinstance(M, jax.tree_util.Partial):
        return M
    if not callable(M):
        raise TypeError(f"M must be a preconditioner (callable v -> z) or None, got {type(M).__name__}")
    # pytree preconditioners (flax.struct dataclasses) cross jit as data; plain functions as static
    return M if hasattr(M, "__dataclass_fields__") else jax.tree_util.Partial(M)


def _prepare(A, b, x0, M, restart, maxiter, rtol, atol, iteration_dependent):
    op = ops.as_operator(A)
    b = jnp.asarray(b)
    ops.check_system(op, b)
    n = b.shape[0]
    if not jnp.issubdtype(b.dtype, jnp.floating):
        b = b.astype(jnp.result_type(float))
    if ops.is_explicit(op):
        b = b.astype(jnp.result_type(b.dtype, op.dtype))
    x0 = jnp.zeros_like(b) if x0 is None else jnp.asarray(x0, b.dtype)
    if x0.shape != b.shape:
        raise ValueError(f"x0 has shape {x0.shape}, b has shape {b.shape}")
    if not 1 <= int(restart) <= n:
        raise ValueError(f"restart must be in [1, n] = [1, {n}], got {restart} (a Krylov space has at most n dimensions)")
    maxiter = 10 * n if maxiter is None else int(maxiter)
    if maxiter < 1:
        raise ValueError(f"maxiter must be >= 1, got {maxiter}")
    if not (float(rtol) >= 0 and float(atol) >= 0):
        raise ValueError(f"rtol and atol must be >= 0, got rtol={rtol}, atol={atol}")
    M = _wrap_precond(M)
    if M is not None:
        args = (jax.ShapeDtypeStruct(b.shape, b.dtype),) + ((jax.ShapeDtypeStruct((), jnp.int32),) if iteration_dependent else ())
        try:
            out = jax.eval_shape(M, *args)
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"preconditioner M failed on a vector of shape {b.shape}: {type(e).__name__}: {e}") from e
        if tuple(out.shape) != b.shape:
            raise ValueError(f"preconditioner M returns shape {tuple(out.shape)} for v of shape {b.shape}")
    return op, b, x0, M, int(restart), maxiter


def gmres(A, b, x0=None, *, M=None, restart: int = 20, maxiter: int | None = None,
          rtol: float = 1e-5, atol: float = 0.0) -> KrylovResult:
    """Right-preconditioned restarted GMRES(m); ``x = x0 + M(V y)``.

    A: ``[n, n]`` dense, BCOO/BCSR, or a function ``v -> A v``. b, x0: ``[n]``.
    M: fixed preconditioner ``v -> z`` (a ``preconditioners`` object or any function).
    Shapes and arguments are checked before tracing (``ValueError``).
    """
    op, b, x0, M, restart, maxiter = _prepare(A, b, x0, M, restart, maxiter, rtol, atol, False)
    return _solve_jit(op, b, x0, M, jnp.asarray(rtol, b.dtype), jnp.asarray(atol, b.dtype),
                      restart=restart, maxiter=maxiter, flexible=False, iteration_dependent=False)


def fgmres(A, b, x0=None, *, M=None, restart: int = 20, maxiter: int | None = None,
           rtol: float = 1e-5, atol: float = 0.0, iteration_dependent: bool = False) -> KrylovResult:
    """Flexible GMRES(m) (Saad 1993): stores ``z_j = M_j(v_j)``, ``x = x0 + Z y``.

    ``M`` may change at every iteration: with ``iteration_dependent=True`` it is called as
    ``M(v, it)`` (``it`` = int32 global iteration index), e.g. to switch block sizes.
    With a fixed ``M`` the iterates equal those of right-preconditioned ``gmres``.
    """
    op, b, x0, M, restart, maxiter = _prepare(A, b, x0, M, restart, maxiter, rtol, atol, iteration_dependent)
    return _solve_jit(op, b, x0, M, jnp.asarray(rtol, b.dtype), jnp.asarray(atol, b.dtype),
                      restart=restart, maxiter=maxiter, flexible=True, iteration_dependent=iteration_dependent)


Solver = Callable[..., KrylovResult]


def fgmres_cycle(matvec: Callable, b: jax.Array, x: jax.Array, precond: Callable, restart: int,
                 tol: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One FGMRES(m) cycle from ``x`` with a fixed ``precond`` and early exit at ``tol``.

    The building block for drivers that change the preconditioner between cycles (the RL
    block-size environment). Returns ``(x_new [n], inner iterations int32, ||b - A x_new||)``;
    a non-finite update is discarded (``x_new = x``).
    """
    st = arnoldi_init(b - matvec(x), restart, True)

    def cond(st):
        return (st.j < restart) & (jnp.abs(st.g[st.j]) > tol) & ~st.breakdown

    st = jax.lax.while_loop(cond, lambda st: arnoldi_step(matvec, st, precond(st.V[st.j])), st)
    x_new = x + arnoldi_update(st)
    ok = jnp.isfinite(x_new).all()
    x_new = jnp.where(ok, x_new, x)
    return x_new, st.j, jnp.linalg.norm(b - matvec(x_new))
