"""experiments/bench_roofline.py at its ``tiny`` preset: the machine's measured peaks, the GRPO step's phases against
them (fractions consistent with the plan's FLOPs and bytes), and sampling with each prompt prefilled once per group
drawing the same tokens as prefilling every row. Nothing about speed is asserted."""

import math

import pytest

from jaxrl_reason.cli import load_experiment, run_experiment
from jaxrl_reason.utils import roofline


def test_tiny_preset_measures_the_step_against_the_machine(tmp_path):
    s = run_experiment("bench_roofline", ["--preset", "tiny", "--run-root", str(tmp_path), "--logger", "none"])
    for k in ("matmul_peak_f32", "matmul_peak_bf16", "read_bandwidth", "update_s", "sample_s", "update_flops",
              "sample_flops", "sample_bytes"):
        assert math.isfinite(s[k]) and s[k] > 0, (k, s[k])
    assert s["matmul_peak_f32"] == max(v for k, v in s.items() if k.startswith("matmul_float32_"))
    assert s["update_fraction_of_peak"] == pytest.approx(s["update_flops"] / s["update_s"] / s["matmul_peak_f32"])
    roof = roofline.roofline_s(s["sample_flops"], s["sample_bytes"], s["matmul_peak_f32"], s["read_bandwidth"])
    assert s["sample_roofline_s"] == pytest.approx(roof) and s["sample_bound"] in ("compute", "bandwidth")
    assert s["prefill_tokens_equal"] is True and s["prefill_once_per_group_speedup"] > 0
    names = [f["name"] for f in load_experiment("bench_roofline").record(s)]
    assert "GRPO update, % of the matmul peak" in names and len(names) == len(set(names))


def test_peaks_are_measured_not_assumed():
    """A bigger matmul does more FLOPs per call, the rate stays a rate; the bandwidth is bytes over seconds."""
    small = roofline.matmul_flops_per_s(8, 8, 8, repeats=2)
    big = roofline.matmul_flops_per_s(256, 256, 256, repeats=2)
    assert 0 < small < big  # a tiny matmul is all overhead
    assert roofline.roofline_s(10.0, 1.0, 5.0, 1.0) == 2.0 and roofline.roofline_s(1.0, 10.0, 5.0, 1.0) == 10.0
    assert roofline.read_bandwidth(8, repeats=2) > 1e8
