"""Experiments on JAX's distributed runtime (two local CPU processes, gloo): one run directory, the
same metrics and checkpoint as one process with the same global batch and devices, kill-and-resume
of both processes, and the clear errors of a bad launch."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from testutil import subprocess_xla_flags

from jaxrl_reason import cli
from jaxrl_reason.utils.checkpoint import Checkpointer

#: ppo_catch in 6 chunks of one update each (8 environments: 4 per process, 2 per device)
PPO = ["--ppo.num-envs", "8", "--ppo.num-steps", "8", "--ppo.total-timesteps", str(8 * 8 * 6),
       "--ppo.updates-per-chunk", "1", "--ppo.update-epochs", "1", "--ppo.num-minibatches", "2",
       "--eval-episodes", "8"]
#: grpo (the main job) in 2 steps of 4 prompts x 2 samples (8 rows: 2 per device), from a 5-step SFT start
#: built by process 0 alone
GRPO = ["--steps", "2", "--eval-every", "1", "--heldout", "16", "--train-rows", "64", "--start.sft-steps", "5",
        "--start.sft-problems", "64", "--start.tokenizer-corpus", "200", "--grpo.prompts-per-step", "4",
        "--grpo.group-size", "2", "--grpo.max-new-tokens", "8"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp_path: pathlib.Path, devices: int) -> dict:
    """Subprocess environment: ``devices`` CPU devices per process, a compilation cache the runs share."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAXRL_", "JAX_COORDINATOR", "SLURM_"))}
    return {**env, "XLA_FLAGS": subprocess_xla_flags(devices), "JAX_PLATFORMS": "cpu",
            "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def _start(tmp_path, experiment: str, args: list[str], processes: int = 2, per_process: list | None = None,
           devices: int = 2) -> list[subprocess.Popen]:
    """``processes`` processes of ``jaxrl-reason run experiment args`` (``per_process[i]``: extra args of process i)."""
    port = _free_port()
    multi = lambda i: ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(processes),
                       "--process-id", str(i)] if processes > 1 else []
    return [subprocess.Popen([sys.executable, "-m", "jaxrl_reason.cli", "run", experiment, *args, *multi(i),
                              *(per_process[i] if per_process else [])],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path, devices))
            for i in range(processes)]


def _finish(procs, timeout: float = 240) -> list[tuple[int, str]]:
    """(return code, stdout + stderr) of each process."""
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        out.append((p.returncode, stdout + stderr))
    return out


def _run_dirs(root: pathlib.Path, experiment: str) -> list[pathlib.Path]:
    return sorted((root / experiment).iterdir()) if (root / experiment).exists() else []


def _rows(run_dir: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _final_state(run_dir: pathlib.Path) -> tuple[int, dict]:
    import orbax.checkpoint as ocp

    step = Checkpointer(run_dir / "checkpoints").latest_step()
    with ocp.CheckpointManager(run_dir / "checkpoints") as m:
        return step, m.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore())).state


def _assert_same_run(a: pathlib.Path, b: pathlib.Path, rtol: float = 0.0, atol: float = 0.0,
                     state_atol: float = 0.0) -> None:
    """Two runs' metrics rows (but wall times), summaries (but the path) and final checkpoints agree
    (exactly by default)."""
    rows_a, rows_b = _rows(a), _rows(b)
    keys = lambda r: sorted(k for k in r if not k.startswith("time_"))
    assert [keys(r) for r in rows_a] == [keys(r) for r in rows_b]
    flat = lambda rows: np.array([r[k] for r in rows for k in keys(r)], np.float64)
    np.testing.assert_allclose(flat(rows_a), flat(rows_b), rtol=rtol, atol=atol)
    summary = lambda d: {k: v for k, v in json.loads((d / "summary.json").read_text()).items()
                         if not str(v).startswith(str(d))}  # but the paths into the run directory
    assert summary(a) == summary(b)
    (step_a, state_a), (step_b, state_b) = _final_state(a), _final_state(b)
    assert step_a == step_b and sorted(state_a) == sorted(state_b)
    for k in state_a:
        np.testing.assert_allclose(state_a[k], state_b[k], rtol=0, atol=state_atol, err_msg=k)


def _one_and_two_processes(tmp_path, experiment: str, args: list[str], mesh: list[str]) -> tuple:
    """Run dirs of ``experiment`` in one process holding 4 devices (``mesh``: the args that split the batch
    over them) and in two processes x 2 devices (the default mesh: data over every device), checking
    that the two processes made one run directory, written by process 0 alone."""
    (rc, log), = _finish(_start(tmp_path, experiment, [*args, *mesh, "--run-root", str(tmp_path / "one")],
                                processes=1, devices=4))
    assert rc == 0, log[-3000:]
    one, = _run_dirs(tmp_path / "one", experiment)
    results = _finish(_start(tmp_path, experiment, [*args, "--run-root", str(tmp_path / "two")]))
    two, = _run_dirs(tmp_path / "two", experiment)
    for rc, log in results:
        assert rc == 0 and f"run dir: {two}" in log, log[-3000:]
    assert json.loads((two / "run.json").read_text()) == {"processes": 2}
    listing = lambda d: sorted(p.name for p in d.iterdir() if p.name not in (".lock", "run.json"))
    assert listing(two) == listing(one)
    return one, two


@pytest.mark.slow
def test_ppo_two_processes_match_one_process_and_resume_after_kill(tmp_path):
    one, full = _one_and_two_processes(tmp_path, "ppo_catch", PPO, ["--ppo.mesh", "data=4"])
    # the gradient all-reduce sums in another order across processes than in one: equal up to rounding
    _assert_same_run(full, one, rtol=1e-5, atol=1e-6, state_atol=1e-6)

    # both processes SIGKILLed after the first checkpoint, then both resumed: exactly the uninterrupted run
    root = tmp_path / "killed"
    procs = _start(tmp_path, "ppo_catch", [*PPO, "--run-root", str(root)])
    deadline = time.time() + 240
    while time.time() < deadline and not list(root.glob("ppo_catch/*/checkpoints/1")):
        assert all(p.poll() is None for p in procs), _finish(procs)
        time.sleep(0.05)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    _finish(procs)
    run, = _run_dirs(root, "ppo_catch")
    killed_at = Checkpointer(run / "checkpoints").latest_step()
    assert killed_at is not None and killed_at < 6, "the run was not interrupted"
    results = _finish(_start(tmp_path, "ppo_catch", [*PPO, "--run-root", str(root), "--resume"]))
    for rc, log in results:
        assert rc == 0 and f"run dir: {run}" in log, log[-3000:]
    assert f"resumed {run} at chunk {killed_at}/6" in results[0][1]
    assert _run_dirs(root, "ppo_catch") == [run]
    _assert_same_run(run, full)

    # a resume with another process count is refused before any training
    with pytest.raises(SystemExit, match=r"was run by 2 process\(es\) but this run has 1; resume it with "
                                         r"--num-processes 2"):
        cli.run_experiment("ppo_catch", [*PPO, "--run-root", str(root), "--resume"])


@pytest.mark.slow
def test_grpo_two_processes_match_one_process(tmp_path):
    from safetensors.numpy import load_file

    one, two = _one_and_two_processes(tmp_path, "grpo", GRPO, ["--grpo.mesh", "data=4"])
    # the same start (built by process 0 alone), data files, prompts, samples and rewards; the gradient sums
    # differ in order, and Adam turns the rounding of near-zero gradient entries into parameter differences
    # of up to ~1% of a step (lr 3e-4)
    _assert_same_run(two, one, rtol=1e-5, atol=1e-6, state_atol=1e-5)
    for part in ("data/train.jsonl", "data/heldout.jsonl", "start/tokenizer.json"):
        assert (one / part).read_bytes() == (two / part).read_bytes(), part
    for part in ("start", "hf"):  # the start's SFT ran on 2 local devices here, 4 there: equal up to rounding
        ours, theirs = (load_file(d / part / "model.safetensors") for d in (two, one))
        assert sorted(ours) == sorted(theirs)
        for name in ours:
            np.testing.assert_allclose(ours[name], theirs[name], rtol=0, atol=1e-5, err_msg=f"{part}: {name}")


@pytest.mark.slow
def test_mismatched_configs_fail_on_every_process(tmp_path):
    results = _finish(_start(tmp_path, "ppo_catch", [*PPO, "--run-root", str(tmp_path)],
                             per_process=[[], ["--seed", "1"]]), timeout=120)
    for i, (rc, log) in enumerate(results):
        assert rc != 0
        assert ("config differs between processes: process(es) [1] do not match process 0 "
                f"(this is process {i})") in log, log[-3000:]
    assert not (tmp_path / "ppo_catch").exists()


def test_bad_launch_flags_are_clear_errors(tmp_path, monkeypatch):
    for var in ("JAXRL_COORDINATOR", "JAX_COORDINATOR_ADDRESS", "JAXRL_NUM_PROCESSES", "JAX_NUM_PROCESSES",
                "JAXRL_PROCESS_ID", "JAX_PROCESS_ID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    run = lambda *flags: cli.run_experiment("ppo_catch", [*PPO, "--run-root", str(tmp_path), *flags])
    with pytest.raises(SystemExit, match=r"process id 5 must be in \[0, 2\) for 2 processes"):
        run("--coordinator", "127.0.0.1:1", "--num-processes", "2", "--process-id", "5")
    with pytest.raises(SystemExit, match="needs the coordinator address.*got coordinator=None"):
        run("--num-processes", "2", "--process-id", "1")
    with pytest.raises(SystemExit, match="coordinator timeout must be > 0"):
        run("--coordinator", "127.0.0.1:1", "--num-processes", "2", "--process-id", "1", "--coordinator-timeout", "0")
    # nobody listens at the coordinator: a clear error after the timeout, not a hang
    port, start = _free_port(), time.monotonic()
    with pytest.raises(SystemExit, match=f"DistributedError: the coordinator 127.0.0.1:{port} did not answer within 2 s"):
        run("--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", "1",
            "--coordinator-timeout", "2")
    assert time.monotonic() - start < 10
    assert not (tmp_path / "ppo_catch").exists()


def test_process_0_whose_peers_never_join_stops_with_a_clear_error(tmp_path):
    start = time.monotonic()
    (rc, log), = _finish(_start(tmp_path, "ppo_catch", [*PPO, "--run-root", str(tmp_path)], processes=1,
                                per_process=[["--coordinator", f"127.0.0.1:{_free_port()}", "--num-processes", "2",
                                              "--process-id", "0", "--coordinator-timeout", "3"]]), timeout=60)
    assert rc == 1, log[-3000:]
    assert log.strip().splitlines()[-1].startswith("DistributedError: not all 2 processes joined 127.0.0.1:")
    assert "within 3 s" in log and time.monotonic() - start < 40
    assert not (tmp_path / "ppo_catch").exists()


def test_ppo_batch_must_divide_the_data_devices():
    from jaxrl_reason import envs
    from jaxrl_reason.rl import ppo

    cfg = ppo.PPOConfig(num_envs=12, num_steps=4, total_timesteps=48, num_minibatches=1, mesh="data=8")
    with pytest.raises(ValueError, match=r"num_envs = 12 is not divisible by the 8 devices of the 'data' mesh axis "
                                         r"\(1 process\(es\) x 8 device\(s\)\); use a multiple of 8"):
        ppo.make_chunked(cfg, envs.make("catch"))
    cfg = ppo.PPOConfig(num_envs=16, num_steps=4, total_timesteps=64, num_minibatches=4, mesh="data=8")
    with pytest.raises(ValueError, match="num_envs / num_minibatches = 4 is not divisible by the 8 devices"):
        ppo.make_chunked(cfg, envs.make("catch"))
