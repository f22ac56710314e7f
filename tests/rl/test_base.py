"""rl/base.py ``run_steps``: one step per chunk (progress, metrics and the log line every step), evaluations,
checkpoints and log lines each at its own interval, none dividing the steps, and an exact resume."""

import dataclasses

import flax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason.cli import load_experiment
from jaxrl_reason.rl.base import run_steps
from jaxrl_reason.utils.experiment import RunDir, RunDirError, read_metrics


@flax.struct.dataclass
class Count:
    step: jnp.ndarray
    total: jnp.ndarray


def step(state):
    """A trainer's step: data drawn by the step index, one metrics row."""
    x = float(np.random.default_rng([7, int(state.step)]).random())
    return Count(step=state.step + 1, total=state.total + x), {"x": x}


def _run(run_dir, steps=5, **kw):
    seen = []
    end = run_steps(run_dir, step, Count(jnp.int32(0), jnp.float32(0.0)), steps, 2,
                    lambda s: {"eval/total": float(s.total)}, save_every=3, log_every=2,
                    after_step=lambda s: seen.append(int(s.step)), show={"x": "x", "s/step": "time_step_s"}, **kw)
    run_dir.close()
    return end, seen


def test_intervals_need_not_divide_the_steps_and_a_resume_is_exact(tmp_path, capsys):
    run = RunDir.create("t", {}, root=tmp_path / "a")
    full, seen = _run(run)
    rows = read_metrics(run.metrics_path)
    assert seen == [1, 2, 3, 4, 5] and int(full.step) == 5
    assert [r["step"] for r in rows if "eval/total" in r] == [0, 2, 4, 5]  # before, every 2 and after the last
    assert [r["step"] for r in rows if "x" in r] == [1, 2, 3, 4, 5] and all(r["time_step_s"] >= 0 for r in rows
                                                                          if "x" in r)
    assert sorted(int(p.name) for p in (tmp_path / "a").glob("t/*/checkpoints/*")) == [3, 5]
    err = capsys.readouterr().err
    assert "[train] step 2/5 x " in err and "[train] step 5/5 x " in err and "step 1/5" not in err

    part = RunDir.create("t", {}, root=tmp_path / "b")
    _run(part, steps=4)  # stops after step 4: checkpoints 3 and 4
    (part.path / "checkpoints" / "4").rename(part.path / "gone")  # as if killed between 3 and 4
    resumed, seen = _run(RunDir.create("t", {}, root=tmp_path / "b", resume=True))
    assert seen == [4, 5] and float(resumed.total) == float(full.total)
    no_time = lambda rs: [{k: v for k, v in r.items() if k != "time_step_s"} for r in rs]
    assert no_time(read_metrics(part.metrics_path)) == no_time(rows)


def test_zero_steps_evaluates_once_and_an_older_chunk_numbered_checkpoint_is_refused(tmp_path):
    run = RunDir.create("t", {}, root=tmp_path)
    end, seen = _run(run, steps=0)
    assert seen == [] and [r["step"] for r in run.read_metrics()] == [0]
    old = RunDir.create("t", {}, root=tmp_path / "old")
    old.checkpointer().save(1, Count(jnp.int32(2), jnp.float32(0.0)), force=True)  # chunk 1 of 2 steps
    old.close()
    with pytest.raises(RunDirError, match="checkpoint 1 holds the state after step 2: .* numbered checkpoints by "
                                          "evaluation chunk"):
        _run(RunDir.create("t", {}, root=tmp_path / "old", resume=True))


@pytest.mark.parametrize("name,field", [("spiral", "steps"), ("memagent", "rl_steps"), ("joyagents", "rl_steps")])
def test_lm_experiments_take_steps_that_are_not_a_multiple_of_eval_every(name, field):
    """The LM experiments hand their schedule to ``run_steps``: any step count passes the config check (it used
    to refuse one that ``eval_every`` does not divide), 0 means evaluate at the start and the end only, and a
    negative interval is a one-line error naming it."""
    experiment = load_experiment(name)
    config = experiment.Config()
    assert getattr(dataclasses.replace(config, **{field: 7}, eval_every=3), field) == 7
    assert dataclasses.replace(config, eval_every=0).eval_every == 0
    with pytest.raises(ValueError, match="eval_every must be >= 0"):
        dataclasses.replace(config, eval_every=-1)
