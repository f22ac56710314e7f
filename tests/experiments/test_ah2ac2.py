"""experiments/ah2ac2.py and ah2ac2_seeds.py at a tiny size (one file: the seeds study trains the same IPPO, so
it reuses the compiled programs): records, BC, IPPO, HDR-IPPO and the 2-player cross-play report finite figures.
The 3-player cross-play is off (its nine pairings of bots compile nine game runners: ~1 min of CPU)."""

import math

import pytest

from jaxrl_reason.cli import run_experiment

IPPO = ["--ippo.num-envs", "4", "--ippo.num-steps", "8", "--ippo.num-updates", "1", "--ippo.hidden", "8",
        "--ippo.num-minibatches", "1", "--ippo.update-epochs", "1", "--eval-games", "2"]


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


@pytest.mark.slow
def test_ah2ac2_tiny_run_reports_finite_scores(tmp_path):
    s = run_experiment("ah2ac2", ["--run-root", str(tmp_path), "--logger", "none", "--num-records", "8",
                                  "--bc.epochs", "1", "--bc.hidden", "8", "--bc.batch-games", "4", *IPPO,
                                  "--no-crossplay-3p"])
    assert s["records_valid"] == 8 and 0 <= s["bc_accuracy"] <= 1, s
    held = [s[f"heldout_{a}"] for a in ("random", "bc", "ippo", "hdr_ippo")]
    assert all(_finite(v) and 0 <= v <= 25 for v in held) and _finite(s["heldout_sem_max"]), s
    assert s["games_per_pair"] == 2 and _finite(s["records_mean_score"]), s


@pytest.mark.slow
def test_ah2ac2_seeds_tiny_run_reports_the_spread(tmp_path):
    s = run_experiment("ah2ac2_seeds", ["--run-root", str(tmp_path), "--logger", "none", "--seeds", "2", *IPPO])
    assert s["seeds"] == 2 and len(s["heldout_per_seed"]) == 2, s
    assert all(_finite(s[k]) for k in ("heldout_mean", "heldout_se_over_seeds", "heldout_seed_std")), s
