"""experiments/device_check.py: every benchmark's reduced preset in one run and one table."""

import inspect
import math

import pytest

from jaxrl_reason.cli import load_experiment, run_experiment
from jaxrl_reason.utils.experiment import RunDir


def _figure_ok(row) -> bool:
    return any(isinstance(row[k], (int, float)) and math.isfinite(row[k]) and row[k] > 0 for k in ("ratio", "ours"))


@pytest.mark.slow
def test_cpu_preset_writes_one_table_with_a_row_per_benchmark(tmp_path):
    dc = load_experiment("device_check")
    summary = run_experiment("device_check", ["--preset", "cpu", "--run-root", str(tmp_path)])
    rows = summary["rows"]
    assert {r["benchmark"] for r in rows} == set(dc.BENCHES)
    for r in rows:
        assert r["status"] == "ok" and _figure_ok(r) or r["status"].startswith(("error: ", "skipped: ")), r
    ok = {r["benchmark"] for r in rows if r["status"] == "ok"}
    assert {"games", "search", "krylov", "lm"} <= ok, rows
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
