"""One source for every figure (``utils.records``): each page's generated blocks equal their regeneration from
``docs/records/``, every record parses, the headline figures quoted in prose agree with their records, the
results page and README stay readable, and ``--record`` writes a record from a run."""

from __future__ import annotations

import json
import pathlib

import pytest

from jaxrl_reason import cli
from jaxrl_reason.utils import records

REPO = pathlib.Path(__file__).resolve().parents[2]
RECORDS = REPO / "docs" / "records"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

#: (page, claim, figure, how the page writes it): ``{v}`` the record's value, ``{se}`` its SE, as the tables do.
QUOTED = [
    ("README.md", "grpo_main_job", "start accuracy", "accuracy {v} ->"),
    ("README.md", "grpo_main_job", "final accuracy", "-> {v} ("),
    ("README.md", "grpo_main_job", "gain", "+{v} ± {se} points, n = 512"),
    ("README.md", "grpo_main_job_seeds", "mean gain over seeds 0-2", "+{v} ± {se} over seeds 0-2"),
    ("README.md", "grpo_vs_trl", "speed-up (TRL step time / ours)", "is {v}x faster than TRL"),
    ("README.md", "grpo_vs_trl", "peak RSS (ours / TRL)", "at {v}x its memory"),
    ("README.md", "spiral_rae", "mean over seeds 0-3", "+{v} ± {se} (1,024 games each"),
    ("README.md", "memagent", "RL agent, 1x", "accuracy {v} at 1x"),
    ("README.md", "astro_search", "MCTS - best-of-N, seeds 0-1 pooled", "+{v} ± {se} solved"),
    ("README.md", "astro_smollm2", "accuracy after RL, ASTRO - direct", "direct SFT + RL {v} ± {se} (n = 512"),
    ("README.md", "spiral_smollm2", "TicTacToe win rate vs random, RAE - none, seeds 0-1",
     "win vs random +{v} ± {se} (seeds"),
    ("README.md", "rally", "- LLM SFT", "+{v} ± {se} return"),
    ("docs/capabilities/grpo.md", "grpo_main_job", "final accuracy", "0.432 -> {v} as below"),
    ("docs/capabilities/hanabi.md", "hanabi_throughput", "belief obs (like for like: JaxMARL's observation)",
     "belief {v}, like for like"),
    ("docs/benchmarks.md", "hanabi_throughput", "belief obs (like for like: JaxMARL's observation)",
     "belief {v} (like for like"),
    ("docs/capabilities/memagent.md", "memagent", "RL agent, 1x", "0.53 vs {v} at 1x"),
]


def test_pages_equal_their_regeneration_from_the_records():
    recs = records.read_records(RECORDS)
    stale = [str(p.relative_to(REPO)) for p in PAGES if records.update_page(p, recs, check=True)]
    assert not stale, f"regenerate with `python -m jaxrl_reason.utils.records docs/`: {stale}"
    used = {c for p in PAGES for m in records.BLOCK.finditer(p.read_text()) for c in m.group(2).split()}
    assert {"grpo_main_job", "grpo_vs_trl", "hanabi_throughput"} <= used
    assert records.main(["--records", str(RECORDS), "--check", str(REPO / "docs")]) == 0


def test_every_record_parses_and_says_where_it_comes_from():
    recs = records.read_records(RECORDS)
    assert len(recs) >= 20
    for claim, r in recs.items():
        assert r["command"] and r["commit"] and r["machine"] and r["status"] in records.STATUSES, claim
        assert r["status"] == "current" or "pending" in r["note"] or "rerun" in r["note"], f"{claim}: older, no note"
        assert "source" not in r or r["source"].startswith("transcribed from docs/results.md at "), claim
    assert recs["grpo_main_job"]["status"] == recs["grpo_smollm2"]["status"] == "current"  # the headline claims


@pytest.mark.parametrize("page, claim, figure, written", QUOTED)
def test_headline_figures_agree_with_their_records(page, claim, figure, written):
    fig = next(f for f in records.read_records(RECORDS)[claim]["figures"] if f["name"] == figure)
    text = written.format(v=records.fmt(fig["value"]), se=records.fmt(fig["se"], like=fig["value"]))
    assert text in (REPO / page).read_text(), f"{page} does not write {claim}'s {figure} as {text!r}"


def test_results_page_and_readme_stay_readable():
    results = (REPO / "docs" / "results.md").read_text()
    assert len(results.split()) <= 5000
    long = [i for i, line in enumerate(results.splitlines(), 1) if len(line) > 400]
    assert not long, f"docs/results.md lines over 400 characters: {long}"
    assert len((REPO / "README.md").read_text().split()) <= 1500


def test_write_render_and_update_a_page(tmp_path):
    figs = [{"name": "accuracy", "value": 0.316, "se": 0.01, "n": 8192}, {"name": "speed-up", "value": 2.2,
                                                                          "se": None, "n": None, "unit": "x"}]
    rec = records.write_record(tmp_path / "recs" / "demo.json", "demo", figs, title="A demo claim", status="older",
                               note="rerun pending", source="a test")
    assert rec["command"] and rec["commit"] and "jax" in rec["machine"] and rec["date"]
    again = records.write_record(tmp_path / "recs" / "demo.json", "demo", figs[:1], commit="abc1234", machine="m")
    assert again["title"] == "A demo claim" and again["status"] == "current"  # a rerun keeps the title
    with pytest.raises(records.RecordError, match="numeric value"):
        records.write_record(tmp_path / "bad.json", "bad", [{"name": "x", "value": "high"}], commit="c", machine="m")
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- records: demo -->\nstale\n<!-- /records -->\nend\n")
    recs = records.read_records(tmp_path / "recs")
    assert records.update_page(page, recs, check=True) and "stale" in page.read_text()  # check writes nothing
    assert records.update_page(page, recs) and not records.update_page(page, recs)
    text = page.read_text()
    assert "| A demo claim | accuracy | 0.316 ± 0.010 | 8192 | current (abc1234," in text and "stale" not in text
    assert text.startswith("intro\n") and text.endswith("<!-- /records -->\nend\n")
    page.write_text("<!-- records: demo nope -->\n<!-- /records -->\n")
    with pytest.raises(records.RecordError, match="unknown claims \\['nope'\\]"):
        records.update_page(page, recs)
    (tmp_path / "recs" / "demo.json").write_text(json.dumps({**rec, "status": "maybe"}))
    with pytest.raises(records.RecordError, match="status"):
        records.read_records(tmp_path / "recs")


def test_grpo_record_hook_gives_start_final_and_gain():
    grpo = cli.load_experiment("grpo")
    figs = grpo.record({"start_accuracy": 0.4, "start_se": 0.02, "final_accuracy": 0.5, "final_se": 0.03,
                        "n_heldout": 512, "gain_points": 10.0, "gain_se_points": 3.6, "final_eval": {"n": 512}})
    assert [(f["name"], f["value"], f["se"], f["n"]) for f in figs] == [
        ("start accuracy", 0.4, 0.02, 512), ("final accuracy", 0.5, 0.03, 512), ("gain", 10.0, 3.6, 512)]


def test_cli_record_writes_the_summary_figures(tmp_path):
    out = tmp_path / "records" / "ppo_catch_demo.json"
    summary = cli.run_experiment("ppo_catch", [
        "--run-root", str(tmp_path), "--logger", "none", "--record", str(out), "--ppo.total-timesteps", "256",
        "--ppo.num-envs", "16", "--ppo.num-steps", "8", "--ppo.updates-per-chunk", "1", "--eval-episodes", "10"])
    rec = records.read_records(out.parent)["ppo_catch_demo"]
    assert rec["command"].startswith("jaxrl-reason run ppo_catch --run-root") and "--record" in rec["command"]
    assert rec["status"] == "current" and rec["commit"] and rec["machine"]
    figs = {f["name"]: f["value"] for f in rec["figures"]}
    assert figs["ppo_return"] == summary["ppo_return"] and figs["random_return"] == summary["random_return"]


def test_seeds_combines_one_figure_of_several_runs(tmp_path):
    runs = []
    for seed, gain in enumerate((11.3, 7.2, 4.1)):
        path = tmp_path / f"seed{seed}.json"
        records.write_record(path, f"seed{seed}", [{"name": "gain", "value": gain, "se": 3.0, "n": 512,
                                                   "unit": "points"}], command=f"run --seed {seed}", commit="abc",
                             machine="m")
        runs.append(str(path))
    assert records.main(["seeds", str(tmp_path / "all.json"), "all", "gain", *runs]) == 0
    figs = json.loads((tmp_path / "all.json").read_text())["figures"]
    assert [f["name"] for f in figs] == ["gain, run 0", "gain, run 1", "gain, run 2", "mean gain over 3 runs"]
    assert figs[-1]["value"] == pytest.approx(7.5333, abs=1e-3)
    assert figs[-1]["se"] == pytest.approx(2.0851, abs=1e-3) and figs[-1]["n"] == 3  # sd (ddof 1) / sqrt(3)
    with pytest.raises(records.RecordError, match="gain"):
        records.over_seeds([json.loads(pathlib.Path(runs[0]).read_text())], "gain")
