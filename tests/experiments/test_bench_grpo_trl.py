"""experiments/bench_grpo_trl.py: both arms (ours, TRL's ``GRPOTrainer``), each in its own subprocess, at the
``--tiny`` size (a random tiny Qwen3 and synthetic rows): the summary's step times, memory and ratios are finite."""

import json
import math
import runpy
import tempfile

import pytest

from jaxrl_reason.cli import available_experiments


def _positive(v) -> bool:
    return isinstance(v, float) and math.isfinite(v) and v > 0


@pytest.mark.slow
def test_tiny_run_reports_finite_ratios(tmp_path, monkeypatch):
    for package in ("torch", "transformers", "trl", "datasets"):
        pytest.importorskip(package)  # a failure in CI (testutil.fail_if_required)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the tiny checkpoint and TRL's output dir (arms: subprocesses)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    main = runpy.run_path(str(available_experiments()["bench_grpo_trl"]))["main"]
    s = main(["--tiny", "--rounds", "1", "--warmup", "1", "--steps", "1", "--prompts", "2", "--group", "2",
              "--max-new-tokens", "4", "--record", str(tmp_path / "trl.json")])
    for arm in ("ours", "trl"):
        assert _positive(s[arm]["step_s"]) and _positive(s[arm]["peak_rss_gib"]), s
    assert _positive(s["ratio_step_ours_over_trl"]) and _positive(s["ratio_rss_ours_over_trl"]), s
    assert len(s["speedup_per_round"]) == 1 and all(_positive(r) for r in s["speedup_per_round"]), s
    figures = {f["name"]: f["value"] for f in json.loads((tmp_path / "trl.json").read_text())["figures"]}
    assert figures["speed-up, slowest round"] == figures["speed-up, fastest round"] == s["speedup_per_round"][0]
