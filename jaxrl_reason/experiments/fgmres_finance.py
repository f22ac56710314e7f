"""FGMRES on held-out finance systems: iterations to 1e-8 and wall time (setup + solve) for
none / Jacobi / block-Jacobi (fixed sizes) / ILU(0) / block cyclic reduction (truncated and
exact) / the meta-learned polynomial on Markowitz, Black-Scholes and Heston; plus the RL
block-size policy (PPO on ``fgmres_blocksize``) against every fixed block size on held-out
systems, with two references (the best size per system in hindsight, the two largest sizes in turn)
and each row's paired per-system difference to the best single fixed size (``--preset rl``); and a batch
of held-out Heston systems solved as one ``vmap`` (learned set-up + FGMRES) against scipy spilu + GMRES
one system after another (``batch_systems``; the issue's GPU comparison is ``--preset gpu``).
Writes ``results.md`` / ``rl.md`` / ``batch_systems.md`` tables and ``convergence_<family>.png``.

Float64 throughout (``jax.enable_x64``) except the RL environment (float32, rtol 1e-5).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse as jsparse

from jaxrl_reason.solvers import fgmres, finance, learned, scipy_reference
from jaxrl_reason.solvers import preconditioners as pc
from jaxrl_reason.solvers.blocksize_env import BlockSizeEnv, alternate, evaluate
from jaxrl_reason.utils import timing
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    heston_ns: int = 32  # held-out Heston grid ns = nv (the anchor uses 128 -> n = 16,384)
    heston_dt: float = 2.0
    bs_n: int = 1000
    markowitz_n: int = 200
    block_sizes: tuple = (4, 16)
    restart: int = 50
    maxiter: int = 1000
    rtol: float = 1e-8
    train_ns: int = 16  # learned preconditioner: trained on smaller Heston grids
    train_systems: int = 16
    train_steps: int = 150
    degree: int = 3
    levels: int = -2  # cyclic-reduction levels relative to exact (-2: two levels short)
    ilu0_max_n: int = 4096  # ILU(0) rows are skipped above this n (its jitted set-up did not finish in 5 min at 16,384)
    rl_timesteps: int = 0  # PPO timesteps for the block-size policy (0 = skip the RL part)
    rl_n: int = 64
    rl_pool: int = 32
    rl_work_weight: float = 0.0  # 0: the reward prices inner iterations only (the table's measure); 1: block size too
    batch_systems: int = 0  # held-out Heston systems solved as one batch (learned preconditioner) vs scipy ILU one by one

    def __post_init__(self):
        check_hyperparameters(self)
        if self.heston_ns < 4 or self.train_ns < 4 or self.heston_ns & (self.heston_ns - 1):
            raise ValueError(f"heston_ns must be a power of two >= 4 (got {self.heston_ns}); train_ns >= 4")
        if not 1 <= self.restart <= self.maxiter:
            raise ValueError(f"need 1 <= restart <= maxiter, got restart={self.restart}, maxiter={self.maxiter}")
        if not 0 < self.rtol < 1:
            raise ValueError(f"rtol must be in (0, 1), got {self.rtol}")
        if self.levels > 0 or self.degree < 0 or self.train_systems < 1 or self.train_steps < 0:
            raise ValueError("need levels <= 0 (relative to exact), degree >= 0, train_systems >= 1, train_steps >= 0")
        if self.rl_work_weight < 0:
            raise ValueError(f"rl_work_weight must be >= 0, got {self.rl_work_weight}")
        if self.rl_timesteps < 0 or self.batch_systems < 0:
            raise ValueError(f"rl_timesteps and batch_systems must be >= 0, got {self.rl_timesteps}, {self.batch_systems}")


SMOKE = Config(heston_ns=16, bs_n=200, markowitz_n=50, train_ns=8, train_systems=4, train_steps=20, maxiter=300)
PRESETS = {
    "cpu": Config(batch_systems=16),
    "smoke": SMOKE,
    # the n = 16,384, dt = 2
    "target": Config(heston_ns=128, train_ns=32, block_sizes=(16, 128), batch_systems=64),
    # the RL block-size study at CPU size (the solver table at smoke size): 1M PPO steps, 128-system pools (4 min)
    "rl": dataclasses.replace(SMOKE, rl_timesteps=1_000_000, rl_pool=128),
    "gpu": Config(heston_ns=128, train_ns=32, train_systems=64, train_steps=500, rl_timesteps=500_000, batch_systems=64),
}


def stack_blocks(seeds, ns, dt):
    ts = [learned.block_tridiagonal(finance.to_jax(finance.heston(int(s), ns=ns, dt=dt).A), ns) for s in seeds]
    return jax.tree.map(lambda *a: jnp.stack(a), *ts)


def train_learned(config: Config):
    rng = np.random.default_rng(config.seed)
    dts = rng.uniform(0.5 * config.heston_dt, 1.5 * config.heston_dt, config.train_systems)
    systems = [stack_blocks([1000 + i], config.train_ns, float(dt)) for i, dt in enumerate(dts)]
    systems = jax.tree.map(lambda *a: jnp.concatenate(a), *systems)
    return learned.train_coefficient_net(systems, levels=config.levels, degree=config.degree,
                                         steps=config.train_steps, seed=config.seed)


def methods_for(family: str, A, config: Config, net):
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


def held_out_systems(config: Config):
    return {
        "markowitz": finance.markowitz_kkt(7_001, n_assets=config.markowitz_n, idio_scale=0.2),
        "black_scholes": finance.black_scholes(7_002, n=config.bs_n, dt=0.5, theta=0.5),
        "heston": finance.heston(0, ns=config.heston_ns, dt=config.heston_dt, randomize=False),
    }


def solve_table(config: Config, run_dir: RunDir, net):
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


def batch_heston(config: Config):
    """``config.batch_systems`` held-out Heston systems (seeds 9,000+, randomised coefficients, dt =
    ``heston_dt``) on one sparsity pattern: ``(scipy CSR list, data [S, nnz], indices [nnz, 2], b [S, n])``."""
    systems = [finance.heston(9_000 + i, ns=config.heston_ns, dt=config.heston_dt) for i in range(config.batch_systems)]
    union = sum(abs(s.A) for s in systems).tocoo()
    rows, cols = union.row, union.col
    data = np.stack([np.asarray(s.A[rows, cols]).ravel() for s in systems])
    return [s.A for s in systems], data, np.stack([rows, cols], 1), np.stack([s.b for s in systems])


def batch_table(config: Config, net) -> list[dict]:
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


def rl_table(config: Config, run_dir: RunDir):
    from jaxrl_reason.rl import ppo

    env = BlockSizeEnv(n=config.rl_n, pool_size=config.rl_pool, work_weight=config.rl_work_weight, seed=config.seed)
    test = BlockSizeEnv(n=config.rl_n, pool_size=config.rl_pool, work_weight=config.rl_work_weight, seed=config.seed,
                        split="test")
    pcfg = ppo.PPOConfig(num_envs=32, num_steps=16, total_timesteps=config.rl_timesteps, updates_per_chunk=1)
    out = jax.jit(ppo.make_train(pcfg, env))(jax.random.key(config.seed))
    for i, v in enumerate(np.asarray(out["metrics"]["episode_return"])):
        run_dir.log(i, {"rl_episode_return": float(v)})
    graphdef = ppo.make_chunked(pcfg, env).graphdef
    policy, carry0 = ppo.evaluation_policy(test, graphdef, out["runner_state"].params)
    choose = lambda ts: policy(carry0, jax.random.key(0), ts)[1]
    idx = np.arange(config.rl_pool)
    fixed = [evaluate(test, lambda ts, a=a: jnp.int32(a), idx) for a in range(test.num_actions)]
    results = {f"fixed k={k}": r for k, r in zip(test.block_sizes, fixed)}
    # references that explain the RL row: the best size chosen per system in hindsight (no policy that picks one
    # size per system can beat it) and the two largest sizes taken in turn, cycle by cycle (what FGMRES allows)
    its = np.stack([np.where(r["converged"], r["iterations"], np.inf) for r in fixed], 1)  # [P, K]
    best = np.argmin(its, 1)
    results["best fixed size per system (hindsight)"] = {
        key: np.stack([np.asarray(r[key]) for r in fixed], 1)[idx, best] for key in ("iterations", "work", "converged")}
    big = np.argsort(test.block_sizes)[-2:]
    results[f"k={test.block_sizes[big[1]]} and k={test.block_sizes[big[0]]} in turn per cycle"] = evaluate(
        test, alternate(int(big[1]), int(big[0])), idx)
    results["PPO block-size policy"] = evaluate(test, choose, idx)
    return rl_rows(results, test.families, [f"fixed k={k}" for k in test.block_sizes])


def rl_rows(results: dict, families, fixed_names) -> list[dict]:
    """Table rows: mean iterations / work / converged over held-out systems, iterations per family, and the
    paired per-system difference of iterations to the best single fixed size (mean, standard error)."""
    families = np.asarray(families)
    mean_its = {name: float(np.asarray(results[name]["iterations"]).mean()) for name in fixed_names}
    best_fixed = np.asarray(results[min(fixed_names, key=lambda n: (not np.all(results[n]["converged"]), mean_its[n]))]
                            ["iterations"], np.float64)
    rows = []
    for name, r in results.items():
        its = np.asarray(r["iterations"], np.float64)
        d = its - best_fixed
        rows.append(dict(policy=name, iterations=float(its.mean()), work=float(np.asarray(r["work"]).mean()),
                         converged=float(np.asarray(r["converged"]).mean()),
                         **{f"its_{f}": float(its[families == f].mean()) for f in dict.fromkeys(families)},
                         vs_best_fixed=float(d.mean()), vs_best_fixed_se=float(d.std(ddof=1) / np.sqrt(d.size))))
    return rows


def run(config: Config, run_dir: RunDir) -> dict:
    with jax.enable_x64(True):
        t = time.perf_counter()
        net, losses = train_learned(config)
        train_s = time.perf_counter() - t
        for i, v in enumerate(np.asarray(losses)):
            run_dir.log(i, {"learned_residual_loss": float(v)})
        rows, hists = solve_table(config, run_dir, net)
        batch = batch_table(config, net) if config.batch_systems else []
    print(run_dir.write_table("results", rows))
    if batch:
        print(run_dir.write_table("batch_systems", batch))
    plot_histories(run_dir, hists)
    summary = {"learned_train_s": train_s, "learned_final_loss": float(np.asarray(losses)[-5:].mean()) if len(losses) else None}
    for r in rows:
        if r["family"] == "heston":
            summary[f"heston_iters[{r['method']}]"] = r["iterations"] if r["converged"] else None
    if batch:
        summary.update(batch_ours_ms=batch[0]["total_ms"], batch_scipy_ms=batch[1]["total_ms"],
                       batch_speedup=batch[1]["total_ms"] / batch[0]["total_ms"])
    if config.rl_timesteps:
        rl = rl_table(config, run_dir)
        print(run_dir.write_table("rl", rl))
        ppo_row = rl[-1]
        summary.update(rl_iterations=ppo_row["iterations"],
                       best_fixed_iterations=ppo_row["iterations"] - ppo_row["vs_best_fixed"],
                       rl_vs_best_fixed=ppo_row["vs_best_fixed"], rl_vs_best_fixed_se=ppo_row["vs_best_fixed_se"])
    return summary


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
