"""Run directories, checkpoints (missing / corrupt / mismatched), CLI errors, kill-and-resume."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason import cli
from jaxrl_reason.utils.checkpoint import CheckpointError, Checkpointer
from jaxrl_reason.utils.experiment import RunDir, RunDirError
from testutil import subprocess_xla_flags

REPO = pathlib.Path(__file__).resolve().parents[1]


def _state(seed=0):
    return {"w": jnp.arange(6.0).reshape(2, 3) + seed, "key": jax.random.key(seed), "n": jnp.int32(seed),
            "empty": jnp.zeros((3, 0))}


def test_checkpoint_round_trip_and_errors(tmp_path):
    ck = Checkpointer(tmp_path / "ck", interval=2)
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        ck.restore(_state())
    assert not ck.save(1, _state(1))  # not due
    assert ck.save(2, _state(2)) and ck.save(3, _state(3), force=True)
    step, restored = ck.restore(_state())
    assert step == 3
    np.testing.assert_array_equal(restored["w"], _state(3)["w"])
    np.testing.assert_array_equal(jax.random.key_data(restored["key"]), jax.random.key_data(_state(3)["key"]))
    with pytest.raises(CheckpointError, match="model or config changed"):
        ck.restore({"w": jnp.zeros((2, 4)), "key": jax.random.key(0), "n": jnp.int32(0), "empty": jnp.zeros((3, 0))})
    with pytest.raises(CheckpointError, match="holds 3 arrays but the training state has 1"):
        ck.restore({"w": jnp.zeros((2, 3))})
    # corrupt the newest step: clear error naming the fix; the older step stays restorable
    for f in (tmp_path / "ck" / "3").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=r"corrupt: unreadable.*delete .*3 to resume from step 2"):
        ck.restore(_state())
    step, restored = ck.restore(_state(), step=2)
    assert step == 2 and int(restored["n"]) == 2


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


def test_cli_rejects_unknown_experiment_and_bad_config(tmp_path, capsys):
    with pytest.raises(SystemExit, match="unknown experiment 'nope'; available: .*ppo_catch"):
        cli.main(["run", "nope"])
    with pytest.raises(SystemExit):
        cli.main(["run", "ppo_catch", "--run-root", str(tmp_path), "--ppo.num-envs", "30"])
    assert "num_envs=30 must be divisible" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["run", "ppo_catch", "--run-root", str(tmp_path), "--ppo.num-envs", "many"])
    assert "many" in capsys.readouterr().err
    assert not (tmp_path / "ppo_catch").exists()  # nothing started
    cli.main(["list"])
    listing = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert listing["ppo_catch"].split(None, 1)[1].startswith("[cpu, gpu] PPO (PureJaxRL shape)")
    # the whole first paragraph of the docstring, on one line (the grpo one wraps over two source lines)
    assert listing["grpo"].endswith("reward functions; ends with the trained policy in HF format.")
    # bad input met while running (not by the config's own checks) is one line too, e.g. a batch the mesh cannot split
    with pytest.raises(SystemExit, match=r"^ppo_catch: ValueError: PPOConfig num_envs = 12 is not divisible by the 8 "
                                         r"devices of the 'data' mesh axis .*; use a multiple of 8$"):
        cli.main(["run", "ppo_catch", "--run-root", str(tmp_path), "--ppo.num-envs", "12", "--ppo.num-minibatches", "1",
                  "--ppo.mesh", "data=8"])
    with pytest.raises(SystemExit):
        cli.main(["run", "grpo", "--help"])
    helped = capsys.readouterr().out
    assert "  cpu: the defaults" in helped and "  gpu: heldout=1024, " in helped and "grpo.lr=1e-06" in helped


def _final_params(run_dir: pathlib.Path):
    import orbax.checkpoint as ocp

    ck = Checkpointer(run_dir / "checkpoints")
    step = ck.latest_step()
    with ocp.CheckpointManager(run_dir / "checkpoints") as m:
        raw = m.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    return step, raw.state


ARGS = ["--ppo.total-timesteps", str(16 * 8 * 12), "--ppo.num-envs", "16", "--ppo.num-steps", "8",
        "--ppo.updates-per-chunk", "1", "--eval-episodes", "10"]


@pytest.mark.slow
def test_kill_and_resume_matches_uninterrupted_run(tmp_path):
    script = str(REPO / "experiments" / "ppo_catch.py")
    # the three runs compile the same programs: share them through JAX's persistent cache (halves the test)
    env = {**os.environ, "XLA_FLAGS": subprocess_xla_flags(1),
           "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    run = lambda root, *extra: subprocess.run(
        [sys.executable, script, "--run-root", str(root), *ARGS, *extra],
        capture_output=True, text=True, env=env, timeout=300,
    )
    # interrupted run: SIGKILL as soon as a few checkpoints exist
    proc = subprocess.Popen([sys.executable, script, "--run-root", str(tmp_path / "a"), *ARGS],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 240
    while time.time() < deadline:
        ck = list((tmp_path / "a").glob("ppo_catch/*/checkpoints/3"))
        if ck:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run_a = next((tmp_path / "a" / "ppo_catch").iterdir())
    killed_at = Checkpointer(run_a / "checkpoints").latest_step()
    assert killed_at is not None and killed_at < 12, "the run was not interrupted"
    assert not (run_a / "summary.json").exists()
    resumed = run(tmp_path / "a", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed {run_a} at chunk {killed_at}/12" in resumed.stdout + resumed.stderr
    fresh = run(tmp_path / "b")
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    run_b = next((tmp_path / "b" / "ppo_catch").iterdir())
    step_a, params_a = _final_params(run_a)
    step_b, params_b = _final_params(run_b)
    assert step_a == step_b == 12
    for k in params_b:
        np.testing.assert_array_equal(params_a[k], params_b[k])
    rows_a = [json.loads(l) for l in (run_a / "metrics.jsonl").read_text().splitlines()]
    rows_b = [json.loads(l) for l in (run_b / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows_a] == list(range(1, 13))
    assert rows_a == rows_b
