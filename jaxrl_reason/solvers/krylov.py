"""GMRES(m) and flexible GMRES(m), pure and jittable, with a typed result.

Why hand-written: jax.scipy's ``gmres`` returns no iteration count, convergence flag or
history, and neither it nor lineax has a *flexible* variant (a right preconditioner that
may change at every iteration), which FGMRES and the RL block-size policy need.

Algorithm (Saad, *Iterative Methods*, Alg. 6.9 / 9.6): restarted Arnoldi with classical
Gram-Schmidt applied twice (CGS2: as stable as modified GS, but two matrix-vector
products instead of a loop), Givens rotations on the Hessenberg matrix, exit inside a
cycle as soon as the estimated residual meets the tolerance, true residual recomputed
at every restart. Everything is ``lax.while_loop``: ``jit``/``vmap`` (over right-hand
sides or whole systems) work.

Batching: under ``jax.vmap`` (a ``custom_vmap`` rule) the mapped solves run in lockstep in
one loop with a shared step counter: the Arnoldi step is one batched matvec / matmul over
all lanes, the basis update one in-place slab write, and a lane that has converged (or
failed) is frozen while the others go on; the loop ends when every lane is done. Each
lane's result (iterations, history, status) equals its own unbatched solve (up to
round-off). On the CPU the lanes go in groups whose bases fit the cache (``lanes_per_group``).

Precision: the arithmetic follows ``b``'s dtype. For float64 enable x64 first
(``jax.config.update("jax_enable_x64", True)`` globally, or locally ``with jax.enable_x64(True):``);
otherwise JAX silently computes in float32 and 1e-8 tolerances are out of reach.

Tolerance: converged when ``||b - A x|| <= max(rtol * ||b||, atol)`` (scipy's rule), judged
on the true residual at the end of a cycle. ``maxiter`` counts inner iterations (matvecs
with ``A`` in the Arnoldi process), not restart cycles as scipy does.

Failure is never silent: ``status`` (see ``STATUS_MESSAGES``) says why the solve stopped,
``converged`` is False unless the tolerance was met, and ``x`` is the best iterate found
(finite even when the input or the preconditioner produces NaN/Inf; never worse than ``x0``).
"""

from __future__ import annotations

import math
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
    "not converged: the preconditioner produced NaN/Inf (x is the best finite iterate)",
    "not converged: A*v produced NaN/Inf during the iteration (overflow?)",
)


def status_message(status) -> str:
    """Human-readable reason for a (concrete) ``status`` code."""
    return STATUS_MESSAGES[int(status)]


@struct.dataclass
class KrylovResult:
    """Outcome of a solve (add a leading batch axis when vmapped).

    x: ``[n]`` solution: the iterate with the smallest true residual (finite; a cycle that raised
    the residual is discarded). residual_norm: true ``||b - A x||``.
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
    """One GMRES(m) cycle over ``L`` lanes (right-hand sides or systems) in lockstep.

    All lanes share the step counter ``j``, so the basis update is one in-place slab write
    and the Arnoldi step is one batched matvec; a lane that meets its tolerance, breaks down
    or hits a non-finite value stops (``active`` False) and stays frozen for the cycle.
    V: ``[L, m + 1, n]`` orthonormal bases (rows past ``j`` are zero). v: ``[L, n]`` row ``j`` of
    ``V``, the vector the next step preconditions (carried, so that no step reads ``V`` after
    writing it: XLA would copy the whole basis at every step). Z: ``[L, m + 1, n]``
    preconditioned directions (flexible variant; ``[L, 0, n]`` otherwise). R: ``[m, m+1, L]``, ``R[j]`` = rotated Hessenberg column
    ``j``. cs, sn: ``[m, L]`` Givens rotations. g: ``[m+1, L]`` rotated ``beta e_1``.
    j: int32 shared steps taken. steps: ``[L]`` int32 steps each lane took. active, breakdown: ``[L]`` bool.
    """

    V: jax.Array
    v: jax.Array
    Z: jax.Array
    R: jax.Array
    cs: jax.Array
    sn: jax.Array
    g: jax.Array
    j: jax.Array
    steps: jax.Array
    active: jax.Array
    breakdown: jax.Array


FIRST_ROWS = 8  # Gram-Schmidt steps j < FIRST_ROWS read only these rows of the basis


def basis_rows(restart: int) -> int:
    """Rows of a cycle's basis buffers (``V``; ``Z`` when flexible)."""
    return restart + 1


def arnoldi_init(R0: jax.Array, m: int, flexible: bool, active: jax.Array | None = None) -> ArnoldiState:
    """Start a cycle from the residuals ``R0`` ``[L, n]``; ``active`` ``[L]`` (default all)."""
    L, n = R0.shape
    dt = R0.dtype
    beta = jnp.linalg.norm(R0, axis=1)
    v0 = R0 / jnp.where(beta > 0, beta, 1)[:, None]
    rows = basis_rows(m)
    return ArnoldiState(
        V=jnp.zeros((L, rows, n), dt).at[:, 0].set(v0),
        v=v0,
        Z=jnp.zeros((L, rows if flexible else 0, n), dt),
        R=jnp.zeros((m, m + 1, L), dt),
        cs=jnp.ones((m, L), dt),
        sn=jnp.zeros((m, L), dt),
        g=jnp.zeros((m + 1, L), dt).at[0].set(beta),
        j=jnp.int32(0),
        steps=jnp.zeros((L,), jnp.int32),
        active=jnp.ones((L,), bool) if active is None else active,
        breakdown=jnp.zeros((L,), bool),
    )


def _gram_schmidt(V: jax.Array, w: jax.Array, j: jax.Array):
    """One classical Gram-Schmidt pass against rows ``0..j`` of ``V`` ``[L, rows, n]``.

    Returns ``(h [L, rows], w - h V)``: two batched matrix-vector products over the first
    ``FIRST_ROWS`` rows while ``j`` is below that, over the whole basis after (rows past ``j``
    are finite and get zero coefficients). Reading exactly the rows in use would need dynamic
    slices, which XLA on the CPU materialises, and the loops over them made it copy the whole
    basis at every step: measured 1.4-3.6x slower in 64-lane batches than these full reads.
    """
    rows = V.shape[1]

    def project(r):  # against the first r rows only (static r)
        Vr = V[:, :r]
        h = jnp.einsum("lrn,ln->lr", Vr, w) * (jnp.arange(r) <= j)
        return jnp.pad(h, ((0, 0), (0, rows - r))), w - jnp.einsum("lr,lrn->ln", h, Vr)

    if rows <= 2 * FIRST_ROWS:
        return project(rows)
    return jax.lax.cond(j < FIRST_ROWS, lambda: project(FIRST_ROWS), lambda: project(rows))


def combine_rows(y: jax.Array, V: jax.Array) -> jax.Array:
    """``sum_i y[:, i] V[:, i]`` ``[L, n]`` for ``V`` ``[L, rows, n]`` and ``y`` ``[L, <= rows]``
    (zero past the rows in use; every row of ``V`` must be finite)."""
    y = jnp.pad(y, ((0, 0), (0, V.shape[1] - y.shape[1])))
    return jnp.einsum("lr,lrn->ln", y, V)


def arnoldi_step(matvec: Callable, st: ArnoldiState, z: jax.Array, tol: jax.Array):
    """Extend the active lanes' bases with ``A z``, ``z = M_j(V[j])`` ``[L, n]``.

    matvec: ``[L, n] -> [L, n]`` (lane-wise ``A``). tol: ``[L]``; a lane whose residual
    estimate falls to ``tol`` stops. Returns ``(state, z_ok [L], step_ok [L])``: a lane whose
    ``z`` or ``A z`` is not finite keeps its previous state and stops.
    """
    m = st.R.shape[0]
    j = st.j
    z_ok = jnp.isfinite(z).all(axis=1)
    z = jnp.where(z_ok[:, None], z, 0)
    w = matvec(z)
    h0 = jnp.linalg.norm(w, axis=1)
    V = st.V
    h, w = _gram_schmidt(V, w, j)
    h2, w = _gram_schmidt(V, w, j)  # second pass (CGS2)
    h = (h + h2)[:, : m + 1].T  # [m+1, L]
    hn = jnp.linalg.norm(w, axis=1)
    broke = hn <= jnp.finfo(w.dtype).eps * h0
    vnext = jnp.where(broke[:, None], 0, w / jnp.where(hn > 0, hn, 1)[:, None])
    h = h.at[j + 1].set(jnp.where(broke, 0, hn))

    def rotate(k, h):  # apply the earlier rotations k < j (shared by all lanes)
        c, s = st.cs[k], st.sn[k]
        a, b = h[k], h[k + 1]
        return jax.lax.dynamic_update_slice_in_dim(h, jnp.stack([c * a + s * b, -s * a + c * b]), k, 0)

    h = jax.lax.fori_loop(0, j, rotate, h)
    a, b = h[j], h[j + 1]
    rr = jnp.hypot(a, b)
    c = jnp.where(rr > 0, a / jnp.where(rr > 0, rr, 1), 1)
    s = jnp.where(rr > 0, b / jnp.where(rr > 0, rr, 1), 0)
    h = h.at[j].set(rr).at[j + 1].set(0)
    gj = st.g[j]
    ok = z_ok & jnp.isfinite(h).all(axis=0) & jnp.isfinite(vnext).all(axis=1)
    act = st.active & ok
    keep = lambda new, old: jnp.where(act, new, old)
    vkeep = jnp.where(act[:, None], vnext, 0)
    g = st.g.at[j].set(keep(c * gj, gj)).at[j + 1].set(keep(-s * gj, st.g[j + 1]))
    new = ArnoldiState(
        V=jax.lax.dynamic_update_slice_in_dim(V, vkeep[:, None], j + 1, 1),
        v=vkeep,
        Z=jax.lax.dynamic_update_slice_in_dim(st.Z, jnp.where(act[:, None], z, 0)[:, None], j, 1)
        if st.Z.shape[1] else st.Z,
        R=st.R.at[j].set(jnp.where(act, h, st.R[j])),
        cs=st.cs.at[j].set(keep(c, st.cs[j])), sn=st.sn.at[j].set(keep(s, st.sn[j])),
        g=g, j=j + 1, steps=st.steps + act.astype(jnp.int32),
        active=act & ~broke & (jnp.abs(g[j + 1]) > tol),
        breakdown=st.breakdown | (act & broke))
    return new, z_ok, ok


def arnoldi_coefficients(st: ArnoldiState) -> jax.Array:
    """Least-squares coefficients ``y`` ``[L, m]`` of the cycle (zero past each lane's steps)."""
    m = st.R.shape[0]

    def one(R, g, steps):  # R [m, m+1], g [m+1]
        active = jnp.arange(m) < steps
        Rt = R[:, :m].T  # upper triangular [m, m]
        diag = jnp.diagonal(Rt)
        ok = active & (diag != 0)  # a zero pivot (singular breakdown) gets a zero coefficient, as in scipy
        Rt = jnp.where(active[:, None] & active[None, :], Rt, 0)
        Rt = Rt + jnp.diag(jnp.where(ok, 0, 1 - diag * active))
        return jax.scipy.linalg.solve_triangular(Rt, jnp.where(ok, g[:m], 0), lower=False)

    return jax.vmap(one, in_axes=(2, 1, 0))(st.R, st.g, st.steps)


def arnoldi_update(st: ArnoldiState, precond: Callable | None = None) -> jax.Array:
    """Corrections ``dx`` ``[L, n]``: ``Z y`` (flexible) or ``M(V y)`` (fixed right
    preconditioner ``precond: [L, n] -> [L, n]``)."""
    y = arnoldi_coefficients(st)
    if st.Z.shape[1]:
        return combine_rows(y, st.Z)
    d = combine_rows(y, st.V)
    return d if precond is None else precond(d)


@struct.dataclass
class _Loop:
    x: jax.Array  # [L, n]
    rnorm: jax.Array  # [L]
    its: jax.Array  # [L]
    cycles: jax.Array  # [L]
    status: jax.Array  # [L]
    hist: jax.Array  # [L, maxiter + 1]


def _solve_lanes(op, op_axes, b, x0, precond, m_axes, rtol, atol, *, restart, maxiter, flexible,
                 iteration_dependent) -> KrylovResult:
    """Solve ``L`` systems in lockstep: b, x0 ``[L, n]``, rtol/atol ``[L]``; ``op``/``precond``
    are shared (axes ``None``) or carry a lane axis (axes ``0`` on their leaves)."""
    if op_axes is None:  # one operator for all lanes: a sparse/dense matrix times [n, L]
        matvec = lambda X: ops.matmat(op, X)
    else:
        mv = ops.lane_map(ops.matvec, op_axes, 1)
        matvec = lambda X: mv(op, X)
    if precond is None:
        apply_m = lambda V, its: V
    elif iteration_dependent:
        pm = ops.lane_map(lambda M, v, it: M(v, it), m_axes, 2)
        apply_m = lambda V, its: pm(precond, V, its)
    else:
        pm = ops.lane_map(lambda M, v: M(v), m_axes, 1)
        apply_m = lambda V, its: pm(precond, V)
    L = b.shape[0]
    lanes = jnp.arange(L)
    bnorm = jnp.linalg.norm(b, axis=1)
    tol = jnp.maximum(rtol * bnorm, atol)
    scale = jnp.where(bnorm > 0, bnorm, 1)
    r0 = b - matvec(x0)
    rnorm0 = jnp.linalg.norm(r0, axis=1)
    op_finite = ops.lane_map(ops.entries_finite, op_axes, 0)(op) if op_axes is not None else ops.entries_finite(op)
    finite_in = (jnp.isfinite(b).all(1) & jnp.isfinite(x0).all(1) & op_finite & jnp.isfinite(r0).all(1))
    status0 = jnp.where(~finite_in, NONFINITE_INPUT, jnp.where(rnorm0 <= tol, CONVERGED, RUNNING))
    hist0 = jnp.broadcast_to(jnp.where(finite_in, rnorm0 / scale, jnp.inf)[:, None], (L, maxiter + 1)).astype(b.dtype)
    init = _Loop(x=jnp.where(finite_in[:, None], x0, 0).astype(b.dtype), rnorm=jnp.where(finite_in, rnorm0, jnp.inf),
                 its=jnp.zeros((L,), jnp.int32), cycles=jnp.zeros((L,), jnp.int32),
                 status=status0.astype(jnp.int32), hist=hist0)
    eps = jnp.finfo(b.dtype).eps

    def cycle(S: _Loop) -> _Loop:
        running = S.status == RUNNING
        r = b - matvec(S.x)
        st0 = arnoldi_init(r, restart, flexible, running & (S.its < maxiter) & (jnp.linalg.norm(r, axis=1) > tol))

        def body(c):
            st, its, hist, bad = c
            st, z_ok, ok = arnoldi_step(matvec, st, apply_m(st.v, its), tol)
            was = c[0].active
            its = its + (was & ok).astype(jnp.int32)
            val = jnp.abs(st.g[st.steps, lanes]) / scale
            hist = hist.at[lanes, its].set(jnp.where(was & ok, val, hist[lanes, its]))
            bad = jnp.where(was & ~z_ok, NONFINITE_PRECONDITIONER, jnp.where(was & ~ok, NONFINITE_ITERATE, bad))
            st = st.replace(active=st.active & (its < maxiter))
            return st, its, hist, bad.astype(jnp.int32)

        cond = lambda c: (c[0].j < restart) & c[0].active.any()
        st, its, hist, bad = jax.lax.while_loop(cond, body, (st0, S.its, S.hist, jnp.zeros((L,), jnp.int32)))
        dx = arnoldi_update(st, None if iteration_dependent else (lambda D: apply_m(D, its)))
        x_new = S.x + dx
        rn = jnp.linalg.norm(b - matvec(x_new), axis=1)
        ok = jnp.isfinite(x_new).all(1) & jnp.isfinite(rn)
        # keep the better iterate: a cycle can raise the true residual when rounding breaks the Arnoldi
        # relation (ill-conditioned preconditioned directions); it then ends with STAGNATION
        better = ok & (rn < S.rnorm)
        x_new = jnp.where(better[:, None], x_new, S.x)
        rn = jnp.where(better, rn, S.rnorm)
        status = jnp.select(
            [rn <= tol, bad != 0, ~ok, st.breakdown, rn >= S.rnorm * (1 - 100 * eps), its >= maxiter],
            [CONVERGED, bad, NONFINITE_ITERATE, BREAKDOWN, STAGNATION, MAXITER], RUNNING)
        keep = lambda new, old: jnp.where(running.reshape(running.shape + (1,) * (new.ndim - 1)), new, old)
        return _Loop(x=keep(x_new, S.x), rnorm=keep(rn, S.rnorm), its=keep(its, S.its),
                     cycles=keep(S.cycles + 1, S.cycles), status=keep(status.astype(jnp.int32), S.status),
                     hist=hist)  # only running lanes wrote to it (a select would copy it every cycle)

    S = jax.lax.while_loop(lambda S: (S.status == RUNNING).any(), cycle, init)
    last = S.hist[lanes, S.its]
    hist = jnp.where(jnp.arange(maxiter + 1)[None] > S.its[:, None], last[:, None], S.hist)
    return KrylovResult(
        x=S.x, residual_norm=S.rnorm, relative_residual=S.rnorm / scale, iterations=S.its,
        restarts=S.cycles, converged=S.status == CONVERGED, status=S.status, residual_history=hist)


#: On the CPU, lanes are solved in lockstep in groups whose Krylov bases (V and Z) take at most this
#: many bytes (about half a core's L2), one group after another: bases that leave the cache make every
#: Gram-Schmidt pass memory-bound, and a group runs until its slowest lane. Measured (64 lanes, restart
#: 50, float64), groups of 1 / 4 / 16 / 64 lanes: the same system, 64 right-hand sides (``bench_krylov``),
#: n = 1,024: 340 / 309 / 470 / 464 ms (Black-Scholes + Jacobi, 160 iterations), 47 / 34 / 28 / 38 ms
#: (truncated cyclic reduction, 6); n = 256: 34 / 22 / 29 / 45 and 9.2 / 7.3 / 6.7 / 7.6 ms; n = 64
#: (4 / 16 / 64): 3.4 / 2.6 / 2.6 and 4.7 / 2.6 / 4.2 ms; n = 4,096 (1 / 4): 9.6 / 11.3 s and 276 / 137 ms.
#: Different systems, whose iteration counts differ (``fgmres_finance`` batch, learned preconditioner):
#: 16 at n = 1,024 took 121 ms one at a time and 266 ms in groups of 4; 64 at n = 16,384 39.5 / 47.5 s.
#: So this budget (one lane at a time from n ~ 1,000) favours the general case over same-system batches
#: of short solves. On accelerators all lanes form one group.
CPU_LANE_GROUP_BYTES = 1 << 20


def lanes_per_group(num_lanes: int, n: int, dtype, restart: int, flexible: bool) -> int:
    """How many lanes ``_solve_grouped`` runs in lockstep at once (all of them off the CPU)."""
    if jax.default_backend() != "cpu":
        return num_lanes
    per_lane = basis_rows(restart) * n * jnp.dtype(dtype).itemsize * (2 if flexible else 1)
    groups = math.ceil(num_lanes / max(1, CPU_LANE_GROUP_BYTES // per_lane))
    return math.ceil(num_lanes / groups)  # equal groups: at most groups - 1 lanes of padding


def _solve_grouped(op, op_axes, b, x0, precond, m_axes, rtol, atol, **kw) -> KrylovResult:
    """``_solve_lanes`` over groups of ``lanes_per_group`` lanes (``lax.map``; the last group is
    padded by repeating the last lane, and the padding is dropped from the result)."""
    L, n = b.shape
    G = lanes_per_group(L, n, b.dtype, kw["restart"], kw["flexible"])
    if G >= L:
        return _solve_lanes(op, op_axes, b, x0, precond, m_axes, rtol, atol, **kw)
    groups = -(-L // G)
    pad = groups * G - L

    def split(a):  # [L, ...] -> [groups, G, ...]
        a = jnp.concatenate([a, jnp.repeat(a[-1:], pad, 0)]) if pad else a
        return a.reshape((groups, G) + a.shape[1:])

    is_none = lambda x: x is None
    mapped = lambda tree, axes: None if axes is None else jax.tree.map(
        lambda ax, a: split(a) if ax == 0 else None, axes, tree, is_leaf=is_none)
    merged = lambda tree, axes, part: tree if axes is None else jax.tree.map(
        lambda ax, a, g: g if ax == 0 else a, axes, tree, part, is_leaf=is_none)

    def group(xs):
        b, x0, rtol, atol, op_part, m_part = xs
        return _solve_lanes(merged(op, op_axes, op_part), op_axes, b, x0, merged(precond, m_axes, m_part), m_axes,
                            rtol, atol, **kw)

    res = jax.lax.map(group, (split(b), split(x0), split(rtol), split(atol), mapped(op, op_axes), mapped(precond, m_axes)))
    return jax.tree.map(lambda a: a.reshape((groups * G,) + a.shape[2:])[:L], res)


def _solve(op, b, x0, precond, rtol, atol, *, restart, maxiter, flexible, iteration_dependent):
    """One system; under ``jax.vmap`` all mapped systems / right-hand sides are solved in
    lockstep by ``_solve_lanes`` (custom batching rule) instead of vmapping the loops."""
    kw = dict(restart=restart, maxiter=maxiter, flexible=flexible, iteration_dependent=iteration_dependent)

    @jax.custom_batching.custom_vmap
    def one(op, b, x0, precond, rtol, atol):
        res = _solve_lanes(op, None, b[None], x0[None], precond, None, rtol[None], atol[None], **kw)
        return jax.tree.map(lambda a: a[0], res)

    @one.def_vmap
    def batched(axis_size, in_batched, op, b, x0, precond, rtol, atol):
        lane = lambda a, f: a if f else jnp.broadcast_to(a, (axis_size,) + a.shape)
        op_b, b_b, x0_b, m_b, rtol_b, atol_b = in_batched
        res = _solve_grouped(op, ops.batch_axes(op_b), lane(b, b_b), lane(x0, x0_b), precond, ops.batch_axes(m_b),
                             lane(rtol, rtol_b), lane(atol, atol_b), **kw)
        return res, jax.tree.map(lambda _: True, res)

    v = jnp.zeros_like(b)
    op = _hoist(op, v)
    precond = _hoist(precond, v, *((jnp.int32(0),) if iteration_dependent else ()))
    return one(op, b, x0, precond, rtol, atol)


def _hoist(f, *example):
    """A function argument (``Partial``) with the values it closes over (e.g. tracers of an
    enclosing ``vmap``) turned into explicit pytree leaves, so the batching rule sees them."""
    if not isinstance(f, jax.tree_util.Partial):
        return f
    conv, consts = jax.closure_convert(f, *example)
    if not consts:
        return f
    k = len(consts)
    return jax.tree_util.Partial(lambda *a: conv(*a[k:], *a[:k]), *consts)


_solve_jit = jax.jit(_solve, static_argnames=("restart", "maxiter", "flexible", "iteration_dependent"))


def _wrap_precond(M):
    if M is None or isinstance(M, jax.tree_util.Partial):
        return M
    if not callable(M):
        raise TypeError(f"M must be a preconditioner (callable v -> z) or None, got {type(M).__name__}")
    # pytree preconditioners (flax.struct dataclasses) cross jit as data; plain functions as static
    return M if hasattr(M, "__dataclass_fields__") else jax.tree_util.Partial(M)


def _require_real(name: str, dtype) -> None:
    """``TypeError`` for a complex ``dtype`` (a static check: free under ``jit``). The solver's
    Gram-Schmidt and Givens rotations are real (no conjugates): a complex system would come out
    wrong, and casting it to real would drop the imaginary parts."""
    if jnp.issubdtype(dtype, jnp.complexfloating):
        raise TypeError(f"{name} is complex ({jnp.dtype(dtype)}); complex systems are not supported: solve the real "
                        "2n x 2n system [[Re A, -Im A], [Im A, Re A]] [Re x; Im x] = [Re b; Im b] instead")


def _prepare(A, b, x0, M, restart, maxiter, rtol, atol, iteration_dependent):
    op = ops.as_operator(A)
    b = jnp.asarray(b)
    _require_real("b", b.dtype)
    if x0 is not None:
        x0 = jnp.asarray(x0)
        _require_real("x0", x0.dtype)
    _require_real("A" if ops.is_explicit(op) else "A(v)", ops.check_system(op, b))
    n = b.shape[0]
    if not jnp.issubdtype(b.dtype, jnp.floating):  # integer / bool b: promoted to the default float
        b = b.astype(jnp.result_type(float))
    if ops.is_explicit(op):
        b = b.astype(jnp.result_type(b.dtype, op.dtype))
    x0 = jnp.zeros_like(b) if x0 is None else x0.astype(b.dtype)
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
        _require_real("M(v)", out.dtype)
    return op, b, x0, M, int(restart), maxiter


def gmres(A, b, x0=None, *, M=None, restart: int = 20, maxiter: int | None = None,
          rtol: float = 1e-5, atol: float = 0.0) -> KrylovResult:
    """Right-preconditioned restarted GMRES(m); ``x = x0 + M(V y)``.

    A: ``[n, n]`` dense, BCOO/BCSR, or a function ``v -> A v``. b, x0: ``[n]``.
    M: fixed preconditioner ``v -> z`` (a ``preconditioners`` object or any function).
    Shapes and arguments are checked before tracing (``ValueError``). Real systems only: a complex
    ``A``, ``b``, ``x0`` or a complex ``A(v)`` / ``M(v)`` raises ``TypeError`` (split it into the real
    2n system); an integer or bool ``b`` is promoted to the default float dtype. NaN/Inf in ``A``,
    ``b`` or ``x0`` is not an error (values are unknown under ``jit``): the result has status
    ``NONFINITE_INPUT``, ``converged`` False and a finite ``x``.
    """
    op, b, x0, M, restart, maxiter = _prepare(A, b, x0, M, restart, maxiter, rtol, atol, False)
    return _solve_jit(op, b, x0, M, jnp.asarray(rtol, b.dtype), jnp.asarray(atol, b.dtype),
                      restart=restart, maxiter=maxiter, flexible=False, iteration_dependent=False)


def fgmres(A, b, x0=None, *, M=None, restart: int = 20, maxiter: int | None = None,
           rtol: float = 1e-5, atol: float = 0.0, iteration_dependent: bool = False) -> KrylovResult:
    """Flexible GMRES(m) (Saad 1993): stores ``z_j = M_j(v_j)``, ``x = x0 + Z y``.

    ``M`` may change at every iteration: with ``iteration_dependent=True`` it is called as
    ``M(v, it)`` (``it`` = int32 global iteration index), e.g. to switch block sizes.
    With a fixed ``M`` the iterates equal those of right-preconditioned ``gmres``; arguments are
    checked as there (real systems only).
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
    a non-finite update is discarded (``x_new = x``) and a non-finite step ends the cycle.
    """
    r = b - matvec(x)
    _require_real("b - A(x)", r.dtype)  # b, x or A's output complex
    _require_real("precond(v)", jax.eval_shape(precond, r).dtype)
    tol1 = jnp.reshape(jnp.asarray(tol, r.dtype), (1,))
    st = arnoldi_init(r[None], restart, True, jnp.linalg.norm(r)[None] > tol1)
    mv, pm = jax.vmap(matvec), jax.vmap(precond)
    st = jax.lax.while_loop(lambda st: (st.j < restart) & st.active.any(),
                            lambda st: arnoldi_step(mv, st, pm(st.v), tol1)[0], st)
    x_new = x + arnoldi_update(st)[0]
    ok = jnp.isfinite(x_new).all()
    x_new = jnp.where(ok, x_new, x)
    return x_new, st.steps[0], jnp.linalg.norm(b - matvec(x_new))
