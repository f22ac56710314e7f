"""experiments/bench_games.py at a tiny size on the paths the device check leaves out (Kuhn Poker, both samplers):
every ratio to pgx (and the search's to mctx on pgx) is finite."""

import math

import pytest

from jaxrl_reason.cli import run_experiment


def test_kuhn_poker_both_samplers_report_finite_ratios(tmp_path):
    pytest.importorskip("pgx")  # a failure in CI (testutil.fail_if_required)
    s = run_experiment("bench_games", ["--run-root", str(tmp_path), "--logger", "none", "--games", "kuhn_poker",
                                       "--sampler", "both", "--batch-size", "8", "--steps", "2", "--repeats", "1",
                                       "--search-batch", "2", "--num-simulations", "2"])
    ratios = {k: v for k, v in s.items() if "ratio" in k}
    assert {"kuhn_poker vmap(step)_categorical_ratio", "kuhn_poker vmap(step)_uniform_kth_ratio",
            "search_ratio"} <= set(ratios), s
    assert all(math.isfinite(v) and v > 0 for v in ratios.values()), s
    assert len(list(tmp_path.glob("bench_games/*/bench_games.md"))) == 1
