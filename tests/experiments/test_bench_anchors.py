"""experiments/anchors/: every anchor script (kept as the anchor projects measured with) runs at a tiny size and
prints a finite, positive throughput; none of its optional arms reports a failure."""

import math
import re
import runpy
import sys

import jax
import pytest

from jaxrl_reason.cli import experiments_dir

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
        pytest.importorskip(package)  # a failure in CI (tests/ci_packages.py)
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
