"""experiments/device_check.py: every benchmark's reduced preset in one run and one table; and the anchor scripts of
experiments/anchors/ (kept as the anchor projects measured with) at a tiny size, each printing finite figures."""

import inspect
import math
import re
import runpy
import sys

import jax
import pytest
from testutil import in_ci

from jaxrl_reason.cli import experiments_dir, load_experiment, run_experiment
from jaxrl_reason.utils.experiment import RunDir


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


@pytest.mark.slow
def test_cpu_preset_writes_one_table_with_a_row_per_benchmark(tmp_path):
    """Every benchmark runs at its tiny size without an error or a skipped row, each row with its finite ratio
    (only where an anchor is not installed, outside CI, may a row be ours alone)."""
    dc = load_experiment("device_check")
    summary = run_experiment("device_check", ["--preset", "cpu", "--run-root", str(tmp_path), "--logger", "none"])
    rows = summary["rows"]
    assert {r["benchmark"] for r in rows} == set(dc.BENCHES)
    assert summary["rows_ok"] == len(rows) and summary["rows_failed"] == summary["rows_skipped"] == 0, rows
    for r in rows:
        assert r["status"] == "ok" and _finite(r["wall_s"]), r
        if r["note"].startswith("not installed"):
            assert not in_ci(), f"an anchor is missing in CI: {r}"
            assert _finite(r["ours"]) or _finite(r["ratio"]), r
        else:
            assert _finite(r["ratio"]), r
    (table,) = tmp_path.glob("device_check/*/device_check.md")
    assert len(table.read_text().splitlines()) == 2 + len(rows)


def test_reduced_configs_build_for_both_bases():
    """Every reduction names real fields (the gpu ones cannot run here, so at least they must build)."""
    dc = load_experiment("device_check")
    for name, bench in dc.BENCHES.items():
        for base in ("gpu", "cpu"):
            if bench.script is not None:
                main = dc._load_script(bench.module)["main"]
                inspect.signature(main).bind(**bench.reduce[base]({}))
            else:
                mod = load_experiment(bench.module)
                config = bench.reduce[base](mod.PRESETS[base])
                if bench.no_anchor is not None:
                    bench.no_anchor(config)
            assert bench.budget_s[base] > 0, name
    assert sum(b.budget_s["gpu"] for b in dc.BENCHES.values()) <= dc.PRESETS["gpu"].budget_s


def test_failing_and_over_budget_benchmarks_are_rows(tmp_path, monkeypatch):
    dc = load_experiment("device_check")

    def boom(mod, kw, run_dir):
        raise RuntimeError("no such device\nsecond line")

    fig = lambda result, config, mod: [dc._fig("answer", ours=result, ratio=2.0, unit="x")]
    fake = lambda script, budget: dc.Bench("fake", {"cpu": lambda kw: kw}, fig, {"cpu": budget}, script=script)
    monkeypatch.setattr(dc, "BENCHES", {"boom": fake(boom, 1), "fine": fake(lambda m, kw, rd: 42.0, 1),
                                        "late": fake(lambda m, kw, rd: 1.0, 100)})
    monkeypatch.setattr(dc, "_load_script", lambda name: {})
    run_dir = RunDir.create("device_check", {}, root=tmp_path)
    try:
        summary = dc.run(dc.Config(base="cpu", benchmarks=("boom", "fine", "late"), budget_s=50), run_dir)
    finally:
        run_dir.close()
    by = {r["benchmark"]: r for r in summary["rows"]}
    assert by["boom"]["status"] == "error: RuntimeError: no such device"
    assert by["fine"]["status"] == "ok" and by["fine"]["ours"] == 42.0 and by["fine"]["ratio"] == 2.0
    assert by["late"]["status"] == "skipped: budget"
    assert (summary["rows_ok"], summary["rows_failed"], summary["rows_skipped"]) == (1, 1, 1)
    assert "no such device" in (run_dir.path / "device_check.md").read_text()
    strict_dir = RunDir.create("strict", {}, root=tmp_path)
    try:
        with pytest.raises(SystemExit, match="1 row"):
            dc.run(dc.Config(base="cpu", benchmarks=("boom",), budget_s=50, strict=True), strict_dir)
    finally:
        strict_dir.close()


def test_config_rejects_unknown_benchmarks_and_bases():
    dc = load_experiment("device_check")
    with pytest.raises(ValueError, match="benchmarks"):
        dc.Config(benchmarks=("nope",))
    with pytest.raises(ValueError, match="base"):
        dc.Config(base="tpu")


#: script -> (its argv at a tiny size, the reference packages it needs)
ANCHORS = {
    "bench_gmres": (["8", "0.5"], ("pyamg", "lineax")),
    "bench_hf_generate": (["2", "4"], ("torch", "transformers")),
    "bench_jaxmarl_hanabi": (["4", "4"], ("jaxmarl",)),
    "bench_jaxmarl_mpe": (["MPE_simple_tag_v3", "4", "4"], ("jaxmarl",)),
    "bench_mctx": (["2", "2"], ("pgx",)),
    "bench_pgx": (["tic_tac_toe", "4", "4"], ("pgx",)),
}
FIGURE = re.compile(r"(?:steps|tokens|simulations)/s=([\d,.]+)|relres=([\d.e+-]+)")


@pytest.mark.parametrize("name", sorted(ANCHORS))
def test_anchor_script_prints_finite_figures(name, monkeypatch, capfd):
    argv, needs = ANCHORS[name]
    for package in needs:
        pytest.importorskip(package)  # a failure in CI (testutil.fail_if_required)
    path = experiments_dir() / "anchors" / f"{name}.py"
    monkeypatch.setattr(sys, "argv", [str(path), *argv])
    x64 = jax.config.jax_enable_x64
    try:
        runpy.run_path(str(path), run_name="__main__")
    finally:
        jax.config.update("jax_enable_x64", x64)  # bench_gmres turns it on for the process
    out = capfd.readouterr().out
    assert "failed" not in out, out
    figures = [float((a or b).replace(",", "")) for a, b in FIGURE.findall(out)]
    assert figures and all(math.isfinite(f) and f > 0 for f in figures), out
