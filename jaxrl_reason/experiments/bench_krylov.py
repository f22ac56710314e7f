"""Krylov benchmark on the anchor's Heston system (``experiments/anchors/bench_gmres.py``), side by
side in one process: scipy GMRES (none / Jacobi / spilu), pyamg fgmres (+ the same spilu),
jax.scipy gmres (none / Jacobi), lineax GMRES (none / Jacobi), and ours (FGMRES none / Jacobi /
ILU(0) / block cyclic reduction truncated and exact). GMRES(50) to 1e-8, float64; times are the
second call (no compilation), setup (factorisation) reported separately. Also: ``vmap`` over
``batch_rhs`` right-hand sides vs one solve (cost ratio).
"""

from __future__ import annotations

import dataclasses
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.solvers import fgmres, finance, learned, scipy_reference
from jaxrl_reason.solvers import preconditioners as pc
from jaxrl_reason.utils import timing
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Config:
    ns: int = 64  # grid ns = nv; the target uses 128 (n = 16,384) with dt = 2
    dt: float = 0.5
    restart: int = 50
    maxiter: int = 2000  # inner iterations for the unpreconditioned runs (they may not converge)
    rtol: float = 1e-8
    batch_rhs: int = 64
    batch_ns: tuple[int, ...] = (8, 16, 32)  # systems (n = batch_ns**2) of the vmap-over-RHS measurement
    anchors: bool = True

    def __post_init__(self):
        check_hyperparameters(self)
        if self.ns < 4 or self.ns & (self.ns - 1):
            raise ValueError(f"ns must be a power of two >= 4, got {self.ns}")
        if not 1 <= self.restart <= self.maxiter or self.batch_rhs < 1 or min(self.batch_ns, default=0) < 4:
            raise ValueError("need 1 <= restart <= maxiter, batch_rhs >= 1, batch_ns (one or more) >= 4")


PRESETS = {
    "cpu": Config(),
    "target": Config(ns=128, dt=2.0, maxiter=1000),
    "gpu": Config(ns=128, dt=2.0, maxiter=10_000, batch_ns=(32, 128)),
}


def anchor_rows(A, b, config: Config):
    import scipy.sparse as sp

    warnings.filterwarnings("ignore")
    rows = []
    relres = lambda x: float(np.linalg.norm(b - A @ x) / np.linalg.norm(b))
    its_scipy = max(1, config.maxiter // config.restart)

    def scipy_run(name, M, setup=0.0):
        t = time.perf_counter()
        x, its = scipy_reference.gmres(A, b, M, rtol=config.rtol, restart=config.restart, maxiter=config.maxiter)
        rows.append(dict(solver="scipy gmres", precond=name, iterations=its, relres=relres(x),
                         setup_ms=1e3 * setup, solve_ms=1e3 * (time.perf_counter() - t)))

    scipy_run("none", None)
    d = A.diagonal()
    scipy_run("jacobi", sp.diags(1 / d))
    t = time.perf_counter()
    M_ilu = scipy_reference.spilu_preconditioner(A)
    t_ilu = time.perf_counter() - t
    scipy_run("spilu", M_ilu, t_ilu)
    try:
        import pyamg

        res = []
        t = time.perf_counter()
        x, _ = pyamg.krylov.fgmres(A, b, M=M_ilu, tol=config.rtol, restart=config.restart, maxiter=its_scipy,
                                   residuals=res)
        rows.append(dict(solver="pyamg fgmres", precond="spilu", iterations=len(res) - 1, relres=relres(x),
                         setup_ms=1e3 * t_ilu, solve_ms=1e3 * (time.perf_counter() - t)))
    except ImportError:
        pass
    from jax.experimental import sparse as jsp

    Aj, bj = jsp.BCSR.from_scipy_sparse(A), jnp.asarray(b)
    dj = jnp.asarray(d)
    for name, M in (("none", None), ("jacobi", lambda v: v / dj)):
        f = jax.jit(lambda bb, M=M: jax.scipy.sparse.linalg.gmres(lambda v: Aj @ v, bb, M=M, tol=config.rtol,
                                                                   restart=config.restart, maxiter=its_scipy)[0])
        x, s = timing.after_warmup(f, bj)
        rows.append(dict(solver="jax.scipy gmres", precond=name, iterations="n/a (not reported)",
                         relres=relres(np.asarray(x)), setup_ms=0.0, solve_ms=1e3 * s))
    try:
        import lineax as lx

        op = lx.FunctionLinearOperator(lambda v: Aj @ v, jax.ShapeDtypeStruct(bj.shape, bj.dtype))
        for name, opts in (("none", {}), ("jacobi", {"preconditioner": lx.DiagonalLinearOperator(1 / dj)})):
            solver = lx.GMRES(rtol=config.rtol, atol=config.rtol, restart=config.restart, max_steps=its_scipy)
            f = jax.jit(lambda bb, opts=opts, solver=solver: (lambda s: (s.value, s.stats["num_steps"]))(
                lx.linear_solve(op, bb, solver, options=opts, throw=False)))
            (x, steps), s = timing.after_warmup(f, bj)
            rows.append(dict(solver="lineax gmres", precond=name, iterations=f"{int(steps)} cycles",
                             relres=relres(np.asarray(x)), setup_ms=0.0, solve_ms=1e3 * s))
    except ImportError:
        pass
    return rows


def our_rows(A_sp, b, config: Config):
    A, bj = finance.to_jax(A_sp), jnp.asarray(b)
    k = config.ns
    builders = {
        "none": None,
        "jacobi": jax.jit(pc.jacobi),
        "ilu0": pc.ilu0,
        "cyclic reduction, 2 levels short": jax.jit(
            lambda A: learned.base_preconditioner(learned.block_tridiagonal(A, k, check=False), -2)),
        "cyclic reduction, exact": jax.jit(lambda A: learned.cyclic_reduction(learned.block_tridiagonal(A, k, check=False))),
    }
    rows = []
    for name, build in builders.items():
        if build is None:
            M, setup = None, 0.0
        elif build is pc.ilu0:
            t = time.perf_counter()
            M = jax.block_until_ready(build(A))
            setup = time.perf_counter() - t
        else:
            M, setup = timing.after_warmup(build, A)
        solve_fn = lambda bb, M=M: fgmres(A, bb, M=M, restart=config.restart, maxiter=config.maxiter, rtol=config.rtol)
        res, s = timing.after_warmup(solve_fn, bj)
        rows.append(dict(solver="ours fgmres", precond=name, iterations=int(res.iterations),
                         relres=float(res.relative_residual), setup_ms=1e3 * setup, solve_ms=1e3 * s,
                         status=res.message))
    return rows


def batch_cases(k: int) -> dict:
    """``name -> (A, M)`` of the vmap-over-RHS measurement, from cheap to expensive
    preconditioner (n = ``k**2`` for Heston, the same n for Black-Scholes)."""
    heston = finance.to_jax(finance.heston(0, ns=k, dt=0.5, randomize=False).A)
    bs = finance.to_jax(finance.black_scholes(0, n=k * k, dt=0.001).A)
    return {
        f"black_scholes n={k * k}, jacobi": (bs, pc.jacobi(bs)),
        f"heston n={k * k}, jacobi": (heston, pc.jacobi(heston)),
        f"heston n={k * k}, block-jacobi {k}": (heston, pc.block_jacobi(heston, k)),
        f"heston n={k * k}, cyclic reduction 2 levels short":
            (heston, learned.base_preconditioner(learned.block_tridiagonal(heston, k), -2)),
    }


def batch_rows(config: Config, rounds: int = 9) -> list[dict]:
    """One solve vs ``vmap`` over ``batch_rhs`` right-hand sides (same system and preconditioner),
    timed interleaved and back to back; the vmapped solves run in lockstep (``krylov`` batching rule). A and M are
    jit arguments (not constants that XLA could fold into the program)."""
    solve = lambda A, M, b: fgmres(A, b, M=M, restart=config.restart, maxiter=config.maxiter, rtol=config.rtol)
    one, many = jax.jit(solve), jax.jit(jax.vmap(solve, in_axes=(None, None, 0)))
    rows = []
    cases = {name: case for k in config.batch_ns for name, case in batch_cases(k).items()}
    for name, (A, M) in cases.items():
        B = jax.random.normal(jax.random.key(0), (config.batch_rhs, A.shape[0]), jnp.float64)
        t = {k: v.median for k, v in timing.interleaved(
            {"one": lambda i: one(A, M, B[0]), "batch": lambda i: many(A, M, B)}, rounds).items()}
        # back to back: each repeated on its own, so the single solve runs with a warm cache (interleaved, it
        # follows the batch and starts cold)
        r1, one_warm = timing.after_warmup(one, A, M, B[0], repeats=rounds)
        rb, batch_warm = timing.after_warmup(many, A, M, B, repeats=rounds)
        rows.append(dict(case=name, batch=config.batch_rhs, one_ms=1e3 * t["one"], batch_ms=1e3 * t["batch"],
                         ratio=t["batch"] / t["one"], one_warm_ms=1e3 * one_warm, batch_warm_ms=1e3 * batch_warm,
                         ratio_warm=batch_warm / one_warm, one_iterations=int(r1.iterations),
                         max_batch_iterations=int(rb.iterations.max()), all_converged=bool(rb.converged.all())))
    return rows


def run(config: Config, run_dir: RunDir) -> dict:
    A = finance.heston_matrix(config.ns, config.ns, config.dt)
    b = np.random.default_rng(0).standard_normal(A.shape[0])
    with jax.enable_x64(True):
        rows = (anchor_rows(A, b, config) if config.anchors else []) + our_rows(A, b, config)
        batch = batch_rows(config)
    print(run_dir.write_table("krylov", rows))
    print(run_dir.write_table("batch_rhs", batch))
    run_dir.save_json("batch_rhs", batch)
    return {"n": A.shape[0], "dt": config.dt,
            **{f"vmap{config.batch_rhs}_over_one[{r['case']}]": r["ratio"] for r in batch},
            **{f"vmap{config.batch_rhs}_over_one_warm[{r['case']}]": r["ratio_warm"] for r in batch}}


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
