"""utils/loggers.py: the rows RunDir logs reach TensorBoard and W&B (offline), and a resume continues the W&B run."""

import json
import sys

import pytest

from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.loggers import LoggerError


def _wandb_files(run_path):
    return sorted(run_path.glob("wandb/offline-run-*/run-*.wandb"))


def test_wandb_offline_gets_the_rows_and_a_resume_continues_the_same_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")  # the test extra installs it
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = {"lr": 0.125}
    run = RunDir.create("exp", config, root=tmp_path, loggers=("wandb",))
    for step, loss in ((1, 0.8125), (2, 0.40625)):
        run.log(step, {"loss": loss, "bad": float("nan")})
    run.log_table("samples", 2, [{"prompt": "2+2?", "completion": "<answer>4</answer>", "reward": 1.0}])
    run.close()
    (table,) = run.path.glob("wandb/offline-run-*/files/media/table/samples_*.table.json")  # a W&B table
    assert json.loads(table.read_text())["data"] == [["2+2?", "<answer>4</answer>", 1.0]]
    (first,) = _wandb_files(run.path)
    data = first.read_bytes()
    assert b"0.8125" in data and b"0.40625" in data and b"lr" in data  # the rows and the config
    assert not (run.path / "tb").exists()  # only the loggers asked for

    again = RunDir.create("exp", config, root=tmp_path, resume=True, loggers=("wandb",))
    again.truncate_metrics(1)
    again.log(2, {"loss": 0.59375})
    again.close()
    files = _wandb_files(run.path)
    assert len(files) == 2 and {f.name for f in files} == {first.name}  # the same W&B run id, resumed
    (resumed,) = [f for f in files if f != first]
    assert b"0.59375" in resumed.read_bytes()
    assert [json.loads(line)["loss"] for line in (run.path / "metrics.jsonl").read_text().splitlines()] == [0.8125,
                                                                                                           0.59375]


def test_unknown_or_missing_loggers_are_errors_before_a_run_directory(tmp_path, monkeypatch):
    with pytest.raises(LoggerError, match=r"unknown logger\(s\) \['mlflow'\]; choose from \('tensorboard', 'wandb'\)"):
        RunDir.create("exp", {}, root=tmp_path, loggers=("mlflow",))
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(LoggerError, match="needs the wandb package: pip install wandb"):
        RunDir.create("exp", {}, root=tmp_path, loggers=("tensorboard", "wandb"))
    assert not (tmp_path / "exp").exists()
    run = RunDir.create("exp", {}, root=tmp_path, loggers=())  # --logger none: metrics.jsonl alone
    run.log(1, {"loss": 1.0})
    run.close()
    assert sorted(p.name for p in run.path.iterdir()) == [".lock", "config.json", "metrics.jsonl", "run.json"]


def test_tables_reach_tensorboard_and_a_resume_drops_their_later_rows(tmp_path):
    """``RunDir.log_table``: rows in ``<name>.jsonl`` and TensorBoard text; a resume from step 1 keeps the table's
    rows up to it in both (the events are rebuilt)."""
    run = RunDir.create("exp", {}, root=tmp_path)
    for step in (1, 2):
        run.log(step, {"loss": 1.0 / step})
        run.log_table("samples", step, [{"prompt": "2+2 | ?", "completion": f"<answer>{step}</answer>\nok"}])
    run.close()
    assert [json.loads(line)["step"] for line in (run.path / "samples.jsonl").read_text().splitlines()] == [1, 2]
    events = lambda: b"".join(f.read_bytes() for f in (run.path / "tb").iterdir())  # the text summaries' bytes
    assert b"| prompt | completion |" in events() and "2+2 \\| ?".encode() in events()
    assert b"<answer>2</answer>\xe2\x8f\x8eok" in events()  # one line per cell

    again = RunDir.create("exp", {}, root=tmp_path, resume=True)
    again.truncate_metrics(1)
    again.close()
    assert [r["step"] for r in again.tables()["samples"]] == [1]
    assert b"<answer>1</answer>" in events() and b"<answer>2</answer>" not in events()
