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
        RunDir.create("exp", C(lr=0.2), root=tmp_path, resume=True)
    with pytest.raises(RunDirError, match="no earlier run"):
        RunDir.create("other", C(), root=tmp_path, resume=True)
    RunDir.create("nested", {"grpo": {"loss": {"eps": 0.2}}, "steps": 3}, root=tmp_path).close()
    with pytest.raises(RunDirError, match=r": grpo\.loss\.eps \(run: 0\.2, now: 0\.3\); resume"):
        RunDir.create("nested", {"grpo": {"loss": {"eps": 0.3}}, "steps": 3}, root=tmp_path, resume=True)
