"""experiments/bench_multiturn.py at its ``tiny`` preset (a tiny random Qwen2, T = 2 and 3): a row per T with every
arm's episode seconds and the ratios; the carried cache and re-prefilling wrote the same tokens (the bench asserts
it, and the assertion is live). Nothing about speed is asserted."""

import math

import pytest

from jaxrl_reason.cli import load_experiment, run_experiment


def _run(tmp_path, *flags):
    return run_experiment("bench_multiturn", ["--preset", "tiny", "--run-root", str(tmp_path), "--logger", "none",
                                              *flags])


def test_tiny_preset_reports_a_row_per_turn_count(tmp_path):
    s = _run(tmp_path)
    arms = ("carried", "reprefill", "hf") if s["hf"] else ("carried", "reprefill")
    assert [r["turns"] for r in s["rows"]] == [2, 3], s
    for row in s["rows"]:
        t = row["turns"]
        assert row["context_tokens"] == s["prompt_tokens"] + t * s["turn_tokens"] + (t - 1) * s["obs_tokens"]
        for arm in arms:
            assert math.isfinite(row[f"{arm}_s"]) and row[f"{arm}_s"] > 0, row
            assert s[f"{arm}_s_T{t}"] == row[f"{arm}_s"]
        assert row["reprefill_over_carried"] == pytest.approx(row["reprefill_s"] / row["carried_s"])
        if s["hf"]:
            assert row["hf_over_carried"] == pytest.approx(row["hf_s"] / row["carried_s"])
            assert 0.0 <= row["hf_token_agreement"] <= 1.0
    assert len(list(tmp_path.glob("bench_multiturn/*/bench_multiturn.md"))) == 1
    assert s["dot_weight_read_bytes_per_s"] > 0 and s["read_bandwidth"] > 0 and s["matmul_peak"] > 0, s
    assert s["head_dot_read_bytes_per_s"] > 0 and s["head_dot_read_bytes_per_s_m1"] > 0, s
    roofs = [row["carried_roofline_s"] for row in s["rows"]]
    assert 0 < roofs[0] < roofs[1], roofs  # one more turn: more to read and compute
    for row in s["rows"]:
        assert row["carried_of_roofline"] == pytest.approx(row["carried_roofline_s"] / row["carried_s"])
        if s["hf"]:
            assert row["hf_over_roofline"] == pytest.approx(row["hf_s"] / row["carried_roofline_s"])
    figures = load_experiment("bench_multiturn").record(s)
    assert {f["name"] for f in figures} >= {"re-prefilling / carried, T = 2", "carried, episode seconds at T = 3",
                                            "carried, % of its roofline at T = 3",
                                            "LM head dot from memory, M = 1: weight read"}, figures


def test_the_bench_refuses_different_tokens_from_the_two_paths(tmp_path, monkeypatch):
    import numpy as np

    module = load_experiment("bench_multiturn")
    turns = module.model_turns
    calls = []

    def second_differs(ep, t, n):  # the bench reads carried first, then reprefill
        calls.append(1)
        out = turns(ep, t, n)
        return out if len(calls) % 2 else np.where(out == 1, 2, 1)

    monkeypatch.setattr(module, "model_turns", second_differs)
    monkeypatch.setattr("jaxrl_reason.cli.load_experiment", lambda name: module)
    with pytest.raises(AssertionError, match="different tokens"):
        _run(tmp_path, "--turns", "2", "--no-hf")
