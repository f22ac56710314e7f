"""The finance solver study of ``experiments/fgmres_finance.py`` (its config, presets and run stay there): the learned
polynomial preconditioner trained on small Heston grids, every preconditioner's FGMRES on held-out Markowitz,
Black-Scholes and Heston systems, one ``vmap`` over a batch of Heston systems against scipy one by one, and the
convergence figures. ``config`` is the experiment's config (duck-typed); float64 where the caller enables it.

    net, losses = train_learned(config)
    rows, hists = solve_table(config, run_dir, net)       # iterations, set-up and solve times per method
    batch = batch_table(config, net)                       # ours (vmap) vs scipy spilu + GMRES
    plot_histories(run_dir, hists)
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse as jsparse

from jaxrl_reason.solvers import finance, learned, scipy_reference
from jaxrl_reason.solvers import preconditioners as pc
from jaxrl_reason.solvers.krylov import fgmres
from jaxrl_reason.utils import timing
from jaxrl_reason.utils.experiment import RunDir


def stack_blocks(seeds, ns, dt):
    """Heston systems (seeds ``seeds``, grid ``ns``, step ``dt``) as stacked block-tridiagonal views."""
    ts = [learned.block_tridiagonal(finance.to_jax(finance.heston(int(s), ns=ns, dt=dt).A), ns) for s in seeds]
    return jax.tree.map(lambda *a: jnp.stack(a), *ts)


def train_learned(config):
    """The learned polynomial's coefficient net, trained on ``config.train_systems`` smaller Heston grids
    (``train_ns``, dt drawn around ``heston_dt``) -> (net, losses)."""
    rng = np.random.default_rng(config.seed)
    dts = rng.uniform(0.5 * config.heston_dt, 1.5 * config.heston_dt, config.train_systems)
    systems = [stack_blocks([1000 + i], config.train_ns, float(dt)) for i, dt in enumerate(dts)]
    systems = jax.tree.map(lambda *a: jnp.concatenate(a), *systems)
    return learned.train_coefficient_net(systems, levels=config.levels, degree=config.degree,
                                         steps=config.train_steps, seed=config.seed)


def methods_for(family: str, A, config, net):
    """name -> jittable builder ``A -> preconditioner`` (None: not applicable)."""
    out = {"none": None, "jacobi": jax.jit(pc.jacobi)}
    for k in config.block_sizes:
        out[f"block-jacobi k={k}"] = jax.jit(lambda A, k=k: pc.block_jacobi(A, k))
    # dense KKT (markowitz): ILU(0) would be a full LU
    if family != "markowitz" and A.shape[0] <= config.ilu0_max_n:
        out["ilu0 (exact tri solves)"] = pc.ilu0  # host pattern analysis + jitted sweeps
    if family == "heston":
        k = config.heston_ns
        out["cyclic reduction (truncated)"] = jax.jit(
            lambda A: learned.base_preconditioner(learned.block_tridiagonal(A, k, check=False), config.levels))
        out["learned polynomial on truncated CR"] = jax.jit(
            lambda A: learned.learned_preconditioner(net, A, learned.block_tridiagonal(A, k, check=False), config.levels))
        out["cyclic reduction (exact, direct)"] = jax.jit(
            lambda A: learned.cyclic_reduction(learned.block_tridiagonal(A, k, check=False)))
    if family == "black_scholes":
        out["cyclic reduction (exact, direct)"] = jax.jit(
            lambda A: learned.cyclic_reduction(learned.block_tridiagonal(A, 1, check=False)))
    return out


def held_out_systems(config):
    """The held-out Markowitz KKT, Black-Scholes and Heston systems of the table."""
    return {
        "markowitz": finance.markowitz_kkt(7_001, n_assets=config.markowitz_n, idio_scale=0.2),
        "black_scholes": finance.black_scholes(7_002, n=config.bs_n, dt=0.5, theta=0.5),
        "heston": finance.heston(0, ns=config.heston_ns, dt=config.heston_dt, randomize=False),
    }


def solve_table(config, run_dir: RunDir, net):
    """Every method of ``methods_for`` on every held-out system: FGMRES iterations to ``config.rtol``, set-up and
    solve times (after compilation) -> (table rows, {(family, method): residual history})."""
    rows, hists = [], {}
    for family, s in held_out_systems(config).items():
        A = finance.to_jax(s.A, sparse=True)
        b = jnp.asarray(s.b)
        for name, build in methods_for(family, A, config, net).items():
            t0 = time.perf_counter()
            M = None if build is None else jax.block_until_ready(build(A))
            setup = time.perf_counter() - t0 if build is pc.ilu0 else None
            if build is not None and setup is None:
                M, setup = timing.after_warmup(build, A)
            solve_fn = lambda b, M=M: fgmres(A, b, M=M, restart=config.restart, maxiter=config.maxiter, rtol=config.rtol)
            res, solve = timing.after_warmup(solve_fn, b)
            rows.append(dict(family=family, n=s.n, method=name, iterations=int(res.iterations),
                             converged=bool(res.converged), relres=float(res.relative_residual),
                             setup_ms=1e3 * (setup or 0.0), solve_ms=1e3 * solve,
                             total_ms=1e3 * ((setup or 0.0) + solve)))
            hists[(family, name)] = np.asarray(res.residual_history)[: int(res.iterations) + 1]
            print(rows[-1], flush=True)
    return rows, hists


def batch_heston(config):
    """``config.batch_systems`` held-out Heston systems (seeds 9,000+, randomised coefficients, dt =
    ``heston_dt``) on one sparsity pattern: ``(scipy CSR list, data [S, nnz], indices [nnz, 2], b [S, n])``."""
    systems = [finance.heston(9_000 + i, ns=config.heston_ns, dt=config.heston_dt) for i in range(config.batch_systems)]
    union = sum(abs(s.A) for s in systems).tocoo()
    rows, cols = union.row, union.col
    data = np.stack([np.asarray(s.A[rows, cols]).ravel() for s in systems])
    return [s.A for s in systems], data, np.stack([rows, cols], 1), np.stack([s.b for s in systems])


def batch_table(config, net) -> list[dict]:
    """A batch of held-out Heston systems, set-up + solve: ours is ONE jitted ``vmap`` over the systems of
    (block view + truncated cyclic reduction + learned polynomial set-up + FGMRES) from the stacked matrix
    entries; the anchor is scipy spilu + GMRES(restart) solving them one by one (the anchor script's
    settings). Times after compilation; ours the mean of 3 calls."""
    mats, data, idx, B = batch_heston(config)
    n, k = B.shape[1], config.heston_ns

    def solve_one(d, b):
        A = jsparse.BCOO((d, idx), shape=(n, n))
        M = learned.learned_preconditioner(net, A, learned.block_tridiagonal(A, k, check=False), config.levels)
        return fgmres(A, b, M=M, restart=config.restart, maxiter=config.maxiter, rtol=config.rtol)

    res, ours = timing.after_warmup(jax.jit(jax.vmap(solve_one)), jnp.asarray(data), jnp.asarray(B), repeats=3)
    its_scipy, ok_scipy, rel_scipy = [], [], []
    t = time.perf_counter()
    for A, b in zip(mats, B):
        M = scipy_reference.spilu_preconditioner(A)
        if M is None:  # the factor is exactly singular: the anchor fails on this system
            its_scipy.append(0)
            ok_scipy.append(False)
            rel_scipy.append(np.nan)
            continue
        x, its = scipy_reference.gmres(A, b, M, rtol=config.rtol, restart=config.restart, maxiter=config.maxiter)
        its_scipy.append(its)
        rel_scipy.append(np.linalg.norm(b - A @ x) / np.linalg.norm(b))
        ok_scipy.append(rel_scipy[-1] <= config.rtol * (1 + 1e-6))
    scipy_s = time.perf_counter() - t

    def row(solver, s, its, ok, rel):
        failed = np.asarray(rel)[~np.asarray(ok)]
        return dict(solver=solver, systems=len(mats), n=n, total_ms=1e3 * s, ms_per_system=1e3 * s / len(mats),
                    mean_iterations=float(np.mean(its)), max_iterations=int(np.max(its)), converged=int(np.sum(ok)),
                    failed_relres=", ".join(f"{r:.1e}" for r in np.sort(failed)))  # nan: spilu found a singular factor

    return [row(f"ours: vmap(learned set-up + FGMRES), {jax.default_backend()}", ours, np.asarray(res.iterations),
                np.asarray(res.converged), np.asarray(res.relative_residual)),
            row("scipy spilu + GMRES, one by one (CPU)", scipy_s, its_scipy, ok_scipy, rel_scipy)]


def plot_histories(run_dir: RunDir, hists):
    """``convergence_<family>.png``: each method's relative residual over FGMRES iterations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for family in sorted({f for f, _ in hists}):
        fig, ax = plt.subplots(figsize=(6, 4))
        for (f, name), h in hists.items():
            if f == family:
                ax.semilogy(np.maximum(h, 1e-16), label=name)
        ax.set_xlabel("FGMRES iteration")
        ax.set_ylabel("relative residual")
        ax.set_title(family)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(run_dir.path / f"convergence_{family}.png", dpi=100)
        plt.close(fig)
