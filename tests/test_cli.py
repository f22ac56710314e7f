"""The CLI: errors and listing, kill-and-resume of a run (run directories and checkpoints themselves:
tests/utils/test_experiment.py, tests/utils/test_checkpoint.py)."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxrl_reason import cli
from jaxrl_reason.utils.checkpoint import Checkpointer
from testutil import subprocess_xla_flags

REPO = pathlib.Path(__file__).resolve().parents[1]


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
