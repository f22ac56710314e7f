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

from jaxrl_reason.solvers import finance_study as study
from jaxrl_reason.solvers.blocksize_env import BlockSizeEnv, alternate, evaluate, policy_rows
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
    return policy_rows(results, test.families, [f"fixed k={k}" for k in test.block_sizes])


def run(config: Config, run_dir: RunDir) -> dict:
    with jax.enable_x64(True):
        t = time.perf_counter()
        net, losses = study.train_learned(config)
        train_s = time.perf_counter() - t
        for i, v in enumerate(np.asarray(losses)):
            run_dir.log(i, {"learned_residual_loss": float(v)})
        rows, hists = study.solve_table(config, run_dir, net)
        batch = study.batch_table(config, net) if config.batch_systems else []
    print(run_dir.write_table("results", rows))
    if batch:
        print(run_dir.write_table("batch_systems", batch))
    study.plot_histories(run_dir, hists)
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
