"""The CLI: errors and listing, kill-and-resume of a run (run directories and checkpoints themselves:
tests/utils/test_experiment.py, tests/utils/test_checkpoint.py)."""

import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxrl_reason import cli
from jaxrl_reason.data import write_jsonl
from jaxrl_reason.utils.checkpoint import Checkpointer
from jaxrl_reason.utils.experiment import read_metrics
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


#: a counter trained by rl.base.run_steps (4 steps, evaluated before, every 2 steps and after the last), written to
#: a test's folder and run by path; $TINY_FAIL_AT fails that step (0: before the first), $TINY_CTRL_C_AT sends this
#: process SIGINT during the steps it lists (twice: the same step twice)
TINY = '''"""A counter trained in steps (tests/test_cli.py)."""
import dataclasses
import os
import signal

import flax
import jax.numpy as jnp

from jaxrl_reason.rl.base import run_steps


@flax.struct.dataclass
class State:
    step: jnp.ndarray
    x: jnp.ndarray


@dataclasses.dataclass(frozen=True)
class Config:
    lr: float = 1.0  # added to x every step
    steps: int = 4


PRESETS = {"cpu": Config()}


def run(config, run_dir):
    fail_at = int(os.environ.get("TINY_FAIL_AT", "-1"))
    ctrl_c = [int(s) for s in os.environ.get("TINY_CTRL_C_AT", "").split(",") if s]
    if fail_at == 0:
        raise ValueError("no data")

    def step(state):
        done = int(state.step) + 1
        if done == fail_at:
            raise ValueError(f"bad row at step {done}")
        for _ in range(ctrl_c.count(done)):
            signal.raise_signal(signal.SIGINT)  # its handler runs before this returns (os.kill's at a later bytecode)
        return State(state.step + 1, state.x + config.lr), {"x": state.x + config.lr}

    def evaluate(state):
        x = float(state.x)
        return {"eval/accuracy": x / 10, "eval/se": 0.01, "eval/n": 8, "eval/pass@4": x / 5, "eval/pass@1": x / 10,
                "eval/response_length": 3.0, "eval_data/accuracy": x / 20, "eval_data/n": 4}

    end = run_steps(run_dir, step, State(jnp.int32(0), jnp.float32(0.0)), config.steps, 2, evaluate, desc="tiny",
                    save_every=1)
    return {"x": float(end.x)}
'''


def _tiny(tmp_path, monkeypatch):
    """(run(*args, root=...) -> summary, the script, the default run root) of the tiny experiment, in a clean
    environment."""
    exp = tmp_path / "tiny.py"
    exp.write_text(TINY)
    monkeypatch.delenv("TINY_FAIL_AT", raising=False)
    monkeypatch.delenv("TINY_CTRL_C_AT", raising=False)
    runs = tmp_path / "runs"
    return (lambda *args, root=runs: cli.run_experiment(str(exp), ["--run-root", str(root), "--logger", "none",
                                                                    *args])), exp, runs


def _no_time(rows):
    return [{k: v for k, v in r.items() if k != "time_step_s"} for r in rows]


def test_a_failed_run_leaves_nothing_and_resume_takes_the_latest_run_of_this_config(tmp_path, monkeypatch, capsys):
    run, _, root = _tiny(tmp_path, monkeypatch)
    monkeypatch.setenv("TINY_FAIL_AT", "0")
    with pytest.raises(SystemExit, match="^tiny: ValueError: no data$"):
        run()
    assert not root.exists()  # failed before its first step: nothing behind
    monkeypatch.setenv("TINY_FAIL_AT", "3")
    with pytest.raises(SystemExit, match="^tiny: ValueError: bad row at step 3$"):
        run()
    (failed,) = (root / "tiny").iterdir()  # failed after two steps: kept, to resume
    assert sorted(p.name for p in (failed / "checkpoints").iterdir()) == ["1", "2"]
    monkeypatch.delenv("TINY_FAIL_AT")
    assert run("--lr", "2") == {"x": 8.0}  # a newer run of another config
    (other,) = set((root / "tiny").iterdir()) - {failed}
    stale = root / "tiny" / "29990101-000000-000000"  # the newest: this config, nothing done (an older version's)
    stale.mkdir()
    shutil.copy(failed / "config.json", stale / "config.json")
    capsys.readouterr()
    assert run("--resume") == {"x": 4.0}
    out = capsys.readouterr()
    assert f"run dir: {failed} (--resume: the latest run of this configuration)" in out.out
    assert f"resumed {failed} at chunk 2/4" in out.out + out.err
    rows = read_metrics(failed / "metrics.jsonl")
    assert [r["x"] for r in rows if "x" in r] == [1, 2, 3, 4]
    assert [r["step"] for r in rows if "eval/n" in r] == [0, 2, 4]
    with pytest.raises(SystemExit, match=re.escape(
            f"tiny: RunDirError: --resume: no earlier run of 'tiny' with this configuration under {root / 'tiny'} (2 "
            f"run(s) with other configs, the latest first: {other.name}: lr (run: 2.0, now: 3.0); {failed.name}: lr "
            "(run: 1.0, now: 3.0); 1 without a checkpoint or metrics); start one without --resume")):
        run("--lr", "3", "--resume")

    # the user's story: grpo with a --data that is not there fails before anything loads and leaves nothing, so the
    # right command's --resume finds no run of its configuration (it used to take the failed one and refuse it)
    write_jsonl([{"prompt": f"calc {i}+1", "answer": str(i + 1)} for i in range(8)], tmp_path / "train.jsonl")
    grpo = lambda *args: cli.run_experiment("grpo", ["--run-root", str(root), "--logger", "none", *args])
    with pytest.raises(SystemExit, match=r"^grpo: FileNotFoundError: nope.jsonl is not a local path; nothing is "):
        grpo("--data", "nope.jsonl")
    assert not (root / "grpo").exists()
    with pytest.raises(SystemExit, match=re.escape(
            f"grpo: RunDirError: --resume: no earlier run of 'grpo' with this configuration under {root / 'grpo'}; "
            "start one without --resume (or give --resume RUN_DIR)")):
        grpo("--data", str(tmp_path / "train.jsonl"), "--resume")


def test_a_model_or_data_that_is_no_local_path_says_how_to_fetch_it(tmp_path, monkeypatch):
    """--model / --data / --eval-data naming something to download (a Hub id): one line saying that nothing is
    downloaded and how to fetch it; a folder that is there but lacks files keeps its precise message."""
    monkeypatch.chdir(tmp_path)
    write_jsonl([{"prompt": f"calc {i}+1", "answer": str(i + 1)} for i in range(8)], "train.jsonl")
    (tmp_path / "empty").mkdir()
    data = ("openai/gsm8k is not a local path; nothing is downloaded: fetch the dataset first, e.g. `huggingface-cli "
            "download --repo-type dataset openai/gsm8k --local-dir DIR`, then point --data (or --eval-data) at a JSONL "
            "/ Parquet file (or a folder of them) in DIR")
    cases = [
        (["--model", "Qwen/Qwen2.5-0.5B-Instruct", "--data", "train.jsonl"],
         "Qwen/Qwen2.5-0.5B-Instruct is not a local path or a packaged model (smollm2-135m-instruct); nothing is "
         "downloaded: fetch it first, e.g. `huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct --local-dir DIR`, and "
         "pass --model DIR"),
        (["--data", "openai/gsm8k"], data),
        (["--data", "train.jsonl", "--eval-data", "openai/gsm8k"], data),
        (["--model", "empty", "--data", "train.jsonl"], "no tokenizer.json in empty (only fast tokenizers"),
    ]
    for args, said in cases:
        with pytest.raises(SystemExit) as err:
            cli.run_experiment("grpo", ["--run-root", "runs", "--logger", "none", *args])
        assert str(err.value.code).startswith(f"grpo: FileNotFoundError: {said}"), (args, err.value.code)
        assert not (tmp_path / "runs").exists()


def test_ctrl_c_stops_at_a_step_boundary_and_prints_how_to_resume(tmp_path, monkeypatch, capfd, request):
    """The console of a run (one line per evaluation; what the time before the first step goes to), and Ctrl-C: the
    step finishes and is checkpointed, the CLI prints the command that resumes it and exits 130; that command ends
    with the metrics of an uninterrupted run. A second Ctrl-C aborts at once (nothing kept before a step)."""
    run, exp, root = _tiny(tmp_path, monkeypatch)
    # Python's Ctrl-C handler, as in a terminal (a worker started from a background job inherits SIGINT ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    assert run(root=tmp_path / "full") == {"x": 4.0}
    out = capfd.readouterr()
    assert "[tiny] setting up: loading the model and data, building the trainer" in out.out
    lines = out.err.splitlines()
    said = lambda text: [i for i, line in enumerate(lines) if line.startswith(text)]
    start, compiling = said("[tiny] evaluating the start (step 0) before training"), said("[tiny] the first step")
    assert len(start) == len(compiling) == 1 and start < compiling
    assert [lines[i] for i in said("[tiny] eval step")] == [
        f"[tiny] eval step {s}: eval accuracy {s / 10:.3f} ± 0.010 (n 8), pass@1 {s / 10:.3f}, pass@4 {s / 5:.3f}, "
        f"len 3.0; eval_data accuracy {s / 20:.3f} (n 4)" for s in (0, 2, 4)]
    (full,) = (tmp_path / "full" / "tiny").iterdir()

    monkeypatch.setenv("TINY_CTRL_C_AT", "2")
    with pytest.raises(SystemExit) as stop:
        run()
    assert stop.value.code == 130
    (path,) = (root / "tiny").iterdir()
    err = capfd.readouterr().err
    assert "[tiny] Ctrl-C: stopping after this step and checkpointing it (Ctrl-C again to abort now)" in err
    command = f"jaxrl-reason run {exp} --run-root {root} --logger none --resume {path}"
    assert f"[tiny] interrupted after step 2; resume with: {command}" in err.splitlines()
    assert sorted(p.name for p in (path / "checkpoints").iterdir()) == ["1", "2"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C is Python's again
    monkeypatch.delenv("TINY_CTRL_C_AT")
    argv = shlex.split(command)
    assert cli.run_experiment(argv[2], argv[3:]) == {"x": 4.0}
    assert _no_time(read_metrics(path / "metrics.jsonl")) == _no_time(read_metrics(full / "metrics.jsonl"))

    monkeypatch.setenv("TINY_CTRL_C_AT", "2,2")  # twice in step 2: aborted in it; step 1's checkpoint is kept
    with pytest.raises(SystemExit) as stop:
        run("--lr", "3")
    (aborted,) = set((root / "tiny").iterdir()) - {path}
    assert stop.value.code == 130 and sorted(p.name for p in (aborted / "checkpoints").iterdir()) == ["1"]
    assert (f"[tiny] aborted; resume from its last checkpoint with: jaxrl-reason run {exp} --run-root {root} --logger "
            f"none --lr 3 --resume {aborted}") in capfd.readouterr().err.splitlines()
    monkeypatch.setenv("TINY_CTRL_C_AT", "1,1")  # twice in the first step: nothing to resume, nothing kept
    with pytest.raises(SystemExit) as stop:
        run("--lr", "4")
    assert stop.value.code == 130 and set((root / "tiny").iterdir()) == {path, aborted}
    assert "[tiny] interrupted before the first step; nothing kept" in capfd.readouterr().err.splitlines()


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
def test_kill_or_ctrl_c_and_resume_match_an_uninterrupted_run(tmp_path):
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

    # Ctrl-C (SIGINT) instead: the run stops after the step it is in, checkpoints it, exits 130 without a traceback
    # and prints the command that resumes it, which ends as the uninterrupted run did
    # a shell's background job (CI may start the suite as one) inherits SIGINT ignored, and Python then keeps it
    # ignored: with a handler here the child starts with the default disposition (exec resets handled signals), as
    # a terminal's foreground run does
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, script, "--run-root", str(tmp_path / "c"), *ARGS],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.time() + 240
    while time.time() < deadline and not list((tmp_path / "c").glob("ppo_catch/*/checkpoints/3")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    run_c = next((tmp_path / "c" / "ppo_catch").iterdir())
    (said,) = [line for line in err.splitlines() if "resume with: " in line]
    stopped = int(re.match(r"\[ppo_catch\] interrupted after step (\d+); resume with: ", said)[1])
    assert 3 <= stopped < 12 and Checkpointer(run_c / "checkpoints").latest_step() == stopped  # one step a chunk
    command = shlex.split(said.split("resume with: ")[1])
    assert command == ["jaxrl-reason", "run", "ppo_catch", "--run-root", str(tmp_path / "c"), *ARGS, "--resume",
                       str(run_c)]
    resumed = subprocess.run([sys.executable, "-m", "jaxrl_reason.cli", *command[1:]], capture_output=True, text=True,
                             env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    step_c, params_c = _final_params(run_c)
    assert step_c == 12 and all(np.array_equal(params_c[k], params_b[k]) for k in params_b)
    assert [json.loads(l) for l in (run_c / "metrics.jsonl").read_text().splitlines()] == rows_b
