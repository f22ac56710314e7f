"""experiments/fgmres_finance.py at a tiny size, every part on: the solver table, the batch of held-out Heston
systems and the RL block-size study all report finite figures."""

import math

import pytest

from jaxrl_reason.cli import run_experiment


@pytest.mark.slow
def test_tiny_run_reports_every_table(tmp_path):
    s = run_experiment("fgmres_finance", [
        "--preset", "smoke", "--run-root", str(tmp_path), "--logger", "none", "--heston-ns", "8", "--train-ns", "4",
        "--train-systems", "2", "--train-steps", "2", "--bs-n", "32", "--markowitz-n", "16", "--maxiter", "100",
        "--restart", "16", "--batch-systems", "2", "--rl-timesteps", "512", "--rl-n", "32", "--rl-pool", "4"])
    finite = lambda k: isinstance(s[k], (int, float)) and math.isfinite(s[k])
    assert all(finite(k) for k in ("learned_final_loss", "batch_speedup", "rl_iterations", "rl_vs_best_fixed")), s
    assert s["batch_speedup"] > 0 and s["rl_iterations"] > 0, s
    assert s["heston_iters[learned polynomial on truncated CR]"] > 0, s  # converged at this size
    (run,) = (tmp_path / "fgmres_finance").iterdir()
    assert {"results.md", "batch_systems.md", "rl.md"} <= {p.name for p in run.iterdir()}
