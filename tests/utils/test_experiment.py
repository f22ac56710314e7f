"""Run directories: metrics, table, plot and the resume checks."""

import numpy as np
import pytest

from jaxrl_reason.utils.experiment import RunDir, RunDirError


def test_run_dir_metrics_table_plot_and_resume_checks(tmp_path):
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class C:
        lr: float = 0.1

    run = RunDir.create("exp", C(), root=tmp_path)
    run.log_many(1, {"loss": np.array([3.0, 2.0, 1.0])})
    run.truncate_metrics(2)
    assert [r["step"] for r in run.read_metrics()] == [1, 2]
    assert run.plot(["loss"]).exists()
    assert "| a | b |" in run.write_table("t", [{"a": 1, "b": 2.5}])
    run.close()
    assert RunDir.create("exp", C(), root=tmp_path, resume=True).path == run.path
    with pytest.raises(RunDirError, match=r"differs from the run in .*: lr \(run: 0.1, now: 0.2\); .* start a new run "
                                          r"\(the same command without --resume\)"):
        RunDir.create("exp", C(lr=0.2), root=tmp_path, resume=run.path)  # --resume PATH: the strict check
    with pytest.raises(RunDirError, match="no earlier run of 'other' with this configuration under .*other; start"):
        RunDir.create("other", C(), root=tmp_path, resume=True)
    nested = RunDir.create("nested", {"grpo": {"loss": {"eps": 0.2}}, "steps": 3}, root=tmp_path)
    nested.close()
    with pytest.raises(RunDirError, match=r": grpo\.loss\.eps \(run: 0\.2, now: 0\.3\); resume"):
        RunDir.create("nested", {"grpo": {"loss": {"eps": 0.3}}, "steps": 3}, root=tmp_path, resume=nested.path)


def test_resume_takes_the_latest_run_of_this_config_that_did_something(tmp_path):
    """--resume without a path: the latest run of the same experiment and config holding a checkpoint or metrics,
    skipping newer runs of other configs and runs that did nothing; else one line saying what is there."""
    def make(config, rows=(), checkpoint=False):
        run = RunDir.create("exp", config, root=tmp_path)
        for step in rows:
            run.log(step, {"loss": 1.0})
        if checkpoint:  # in a sub-run only: still something to resume
            run.child("arm").checkpointer().save(1, {"w": np.ones(2)}, force=True)
        run.close()
        return run.path

    a = make({"lr": 0.1}, rows=[0, 1])
    b = make({"lr": 0.1}, checkpoint=True)
    c = make({"lr": 0.2}, rows=[1])
    make({"lr": 0.1})  # the newest: created, nothing done (an old failed run)
    assert RunDir.create("exp", {"lr": 0.1}, root=tmp_path, resume=True).path == b
    b.joinpath("arm", "checkpoints").rename(b / "gone")
    picked = RunDir.create("exp", {"lr": 0.1}, root=tmp_path, resume=True)
    assert picked.path == a and picked.resumed
    picked.close()
    with pytest.raises(RunDirError, match=(
            rf"^--resume: no earlier run of 'exp' with this configuration under {tmp_path / 'exp'} \(2 run\(s\) with "
            rf"other configs, the latest first: {c.name}: lr \(run: 0.2, now: 0.3\); {a.name}: lr \(run: 0.1, now: "
            r"0.3\); 2 without a checkpoint or metrics\); start one without --resume \(or give --resume RUN_DIR\)$")):
        RunDir.create("exp", {"lr": 0.3}, root=tmp_path, resume=True)


def test_a_run_that_did_no_step_is_discarded_and_one_that_did_is_kept(tmp_path):
    root = tmp_path / "runs"
    run = RunDir.create("exp", {"a": 1}, root=root)
    run.log(0, {"eval/accuracy": 0.5})  # an evaluation before the first step is not a step
    assert run.discard_if_unstarted() and not root.exists()  # the folders made for it go too
    root.mkdir()
    (root / "mine").mkdir()
    run = RunDir.create("exp", {"a": 1}, root=root)
    assert run.discard_if_unstarted() and sorted(p.name for p in root.iterdir()) == ["mine"]
    kept = []
    for what in ("row", "checkpoint", "sub-run row"):
        run = RunDir.create("exp", {"a": 1}, root=root)
        if what == "row":
            run.log(1, {"loss": 1.0})
        elif what == "checkpoint":
            run.checkpointer().save(1, {"w": np.ones(2)}, force=True)
        else:
            run.child("arm").log(1, {"loss": 1.0})
        assert not run.discard_if_unstarted() and run.path.is_dir(), what
        kept.append(run.path)
    resumed = RunDir.create("exp", {"a": 1}, root=root, resume=kept[0])
    resumed.truncate_metrics(0)  # a resumed run is never removed, whatever it holds
    assert not resumed.discard_if_unstarted() and kept[0].is_dir()
