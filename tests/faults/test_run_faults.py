"""Fault injection on the run platform: damaged checkpoints, non-finite training, torn and
concurrent run directories, kills mid-rewrite, unwritable roots. Each case must end in a clear
error or a documented behaviour: never a silent wrong result, never lost history."""

import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_reason import cli
from jaxrl_reason.utils import guard
from jaxrl_reason.utils.checkpoint import CheckpointError, Checkpointer
from jaxrl_reason.utils.experiment import RunDir, RunDirError
from jaxrl_reason.utils.loop import run_chunks
from testutil import subprocess_xla_flags

REPO = pathlib.Path(__file__).resolve().parents[2]


def _state(seed=0):
    rng = np.random.default_rng(seed)
    return {"w": jnp.asarray(rng.normal(size=(64, 32)), jnp.float32), "b": jnp.asarray(rng.normal(size=32)),
            "key": jax.random.key(seed), "n": jnp.int32(seed)}


def _arrays(tree) -> list[np.ndarray]:
    is_key = lambda v: jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key)
    return [np.asarray(jax.random.key_data(v) if is_key(v) else v) for v in jax.tree.leaves(tree)]


def _same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(_arrays(a), _arrays(b), strict=True))


# -- checkpoint integrity -----------------------------------------------------------------------
def test_random_bit_flips_never_restore_changed_values(tmp_path):
    """40 seeded single-bit flips anywhere in a step's files: restore raises CheckpointError or
    returns exactly the saved state (a flip in unused bytes), never changed values."""
    good = tmp_path / "good"
    with Checkpointer(good / "ck") as ck:
        ck.save(1, _state(1), force=True)
    files = sorted(f.relative_to(good) for f in (good / "ck" / "1").rglob("*") if f.is_file() and f.stat().st_size)
    rng = np.random.default_rng(0)
    outcomes = {"error": 0, "exact": 0}
    for trial in range(40):
        case = tmp_path / f"flip{trial}"
        shutil.copytree(good, case)
        target = case / files[rng.integers(len(files))]
        data = bytearray(target.read_bytes())
        pos = int(rng.integers(len(data)))
        data[pos] ^= 1 << int(rng.integers(8))
        target.write_bytes(bytes(data))
        ck = Checkpointer(case / "ck")
        try:
            _, restored = ck.restore(_state())
        except CheckpointError as err:
            assert "corrupt" in str(err) or "changed" in str(err), err
            outcomes["error"] += 1
        else:
            assert _same(restored, _state(1)), f"flip {trial} in {target.name}@{pos} restored changed values"
            outcomes["exact"] += 1
        ck.close()
        shutil.rmtree(case)
    assert outcomes["error"] > 0, outcomes


def test_flipped_data_byte_and_removed_files_are_corrupt(tmp_path):
    ck = Checkpointer(tmp_path / "ck")
    ck.save(1, _state(1), force=True)
    ck.save(2, _state(2), force=True)
    step_dir = tmp_path / "ck" / "2"
    # the largest file holds the arrays' bytes: flip one in the middle
    data_file = max((f for f in step_dir.rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
    raw = bytearray(data_file.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    data_file.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"step 2 .* corrupt.*resume from step 1"):
        ck.restore(_state())
    step, restored = ck.restore(_state(), step=1)
    assert step == 1 and _same(restored, _state(1))
    # a step without its checksums (older format / interrupted save) is refused, not trusted
    shutil.rmtree(tmp_path / "ck" / "1" / "integrity")
    with pytest.raises(CheckpointError, match="no checksums"):
        ck.restore(_state(), step=1)
    # truncated data file
    ck2 = Checkpointer(tmp_path / "ck2")
    ck2.save(1, _state(3), force=True)
    big = max((f for f in (tmp_path / "ck2" / "1").rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
    big.write_bytes(big.read_bytes()[: big.stat().st_size // 3])
    with pytest.raises(CheckpointError, match="corrupt"):
        ck2.restore(_state())


def test_checkpoints_refuse_non_finite_states(tmp_path):
    ck = Checkpointer(tmp_path / "ck")
    bad = {**_state(), "w": _state()["w"].at[3, 4].set(jnp.nan)}
    with pytest.raises(CheckpointError, match="NaN or inf"):
        ck.save(1, bad, force=True)
    assert ck.all_steps() == []


# -- non-finite guard -------------------------------------------------------------------------
def _quadratic_trainer(nan_at: set[int]):
    """A guarded Adam on a quadratic; the gradient is NaN at the (1-based) steps in ``nan_at``.
    One step per chunk; metrics {"loss", "grad_norm"} [1]."""
    tx = guard.guard_optimizer(optax.adam(0.1))
    params = jnp.ones(4)
    init = {"params": params, "opt": tx.init(params), "t": jnp.int32(0)}

    @jax.jit
    def chunk(state):
        t = state["t"] + 1
        bad = jnp.isin(t, jnp.asarray(sorted(nan_at) or [-1]))
        loss, g = jax.value_and_grad(lambda p: jnp.sum(p ** 2))(state["params"])
        g = jnp.where(bad, jnp.nan, g)
        loss = jnp.where(bad, jnp.nan, loss)
        updates, opt = tx.update(g, state["opt"], state["params"])
        new = {"params": optax.apply_updates(state["params"], updates), "opt": opt, "t": t}
        return new, {"loss": loss[None], "grad_norm": optax.tree.norm(g)[None]}

    return init, chunk


def test_nan_loss_stops_the_run_naming_step_and_keeps_last_good_checkpoint(tmp_path):
    run = RunDir.create("nan", {"a": 1}, root=tmp_path)
    init, chunk = _quadratic_trainer({4})
    with pytest.raises(guard.NonFiniteError, match=r"at step 4 metric 'grad_norm' is nan, 'loss' is nan"):
        run_chunks(run, init, chunk, 8)
    ck = run.checkpointer()
    assert ck.all_steps()[-1] == 3  # nothing after the failure is saved
    _, restored = ck.restore(init)
    assert np.isfinite(np.asarray(restored["params"])).all()
    run.close()


def test_skip_policy_skips_and_counts_non_finite_updates(tmp_path):
    run = RunDir.create("skip", {"a": 1}, root=tmp_path, on_nonfinite="skip")
    init, chunk = _quadratic_trainer({2, 5})
    state = run_chunks(run, init, chunk, 8)
    assert np.isfinite(np.asarray(state["params"])).all()
    clean_init, clean_chunk = _quadratic_trainer(set())
    clean = clean_init
    for _ in range(6):  # 8 steps with 2 skipped = 6 applied updates
        clean, _ = clean_chunk(clean)
    np.testing.assert_allclose(state["params"], clean["params"], rtol=1e-6)
    rows = run.read_metrics()
    assert [r[guard.SKIPPED_METRIC] for r in rows] == [0, 1, 1, 1, 2, 2, 2, 2]
    run.close()


def test_non_finite_state_is_never_checkpointed(tmp_path):
    run = RunDir.create("state", {"a": 1}, root=tmp_path, on_nonfinite="skip")

    def chunk(state):
        state = state + 1.0
        return jnp.where(state > 2, jnp.inf, state), {"reward": jnp.zeros(1)}

    with pytest.raises(guard.NonFiniteError, match="state holds NaN or inf at step 3"):
        run_chunks(run, jnp.zeros(3), chunk, 5)
    assert run.checkpointer().all_steps() == [1, 2]
    run.close()


def test_sft_warm_start_raises_on_non_finite_loss():
    from flax import nnx

    from jaxrl_reason.models.tokenizer import CharTokenizer
    from jaxrl_reason.rl.grpo.recipes import TinyLM, build_model, sft_problems
    from jaxrl_reason.rl.grpo.sft import sft_warm_start
    from jaxrl_reason.tasks import RandomCalculation

    tok = CharTokenizer()
    model = build_model(TinyLM(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=64), 0, tok)
    before = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
    problems = sft_problems([RandomCalculation()], 8, 0)
    with pytest.raises(guard.NonFiniteError, match=r"sft_train: the loss is NaN or inf at step \d of 3"):
        sft_warm_start(model, problems, steps=3, batch_size=4, seq_len=64, lr=1e38, tokenizer=tok)
    after = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
    assert jax.tree.all(jax.tree.map(np.array_equal, before, after))  # the model is left untouched


def test_cli_stops_a_diverging_run_with_a_clear_error(tmp_path):
    """A learning rate that is valid but makes PPO diverge: exit code 1, one line naming the
    metric, no summary, no checkpoint of the diverged state."""
    env = {**os.environ, "XLA_FLAGS": subprocess_xla_flags(1)}
    args = [sys.executable, str(REPO / "experiments" / "ppo_catch.py"), "--run-root", str(tmp_path),
            "--ppo.lr", "1e30", "--ppo.total-timesteps", str(16 * 8 * 8), "--ppo.num-envs", "16",
            "--ppo.num-steps", "8", "--ppo.updates-per-chunk", "1", "--eval-episodes", "10"]
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "NonFiniteError" in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
    run_dir = next((tmp_path / "ppo_catch").iterdir())
    assert not (run_dir / "summary.json").exists()
    ck = Checkpointer(run_dir / "checkpoints")
    for step in ck.all_steps():  # whatever was saved before the failure is finite and restorable
        assert (run_dir / "checkpoints" / str(step) / "integrity").is_dir()


# -- run directories ---------------------------------------------------------------------------
def test_second_writer_on_a_run_dir_is_refused(tmp_path):
    first = RunDir.create("exp", {"a": 1}, root=tmp_path)
    first.log(1, {"loss": 1.0})  # a step done: --resume takes it
    with pytest.raises(RunDirError, match=f"in use by another process \\(pid {os.getpid()}\\)"):
        RunDir.create("exp", {"a": 1}, root=tmp_path, resume=True)
    # another process too (the lock is an flock, released when its holder exits or closes)
    code = ("from jaxrl_reason.utils.experiment import RunDir, RunDirError\n"
            f"try:\n    RunDir.create('exp', {{'a': 1}}, root={str(tmp_path)!r}, resume=True)\n"
            "except RunDirError as e:\n    print('refused', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("refused"), out.stdout + out.stderr[-1000:]
    first.close()
    RunDir.create("exp", {"a": 1}, root=tmp_path, resume=True).close()


def test_torn_last_row_is_dropped_with_a_warning_and_a_torn_middle_row_is_an_error(tmp_path):
    run = RunDir.create("exp", {"a": 1}, root=tmp_path)
    run.log_many(1, {"loss": np.array([3.0, 2.0, 1.0])})
    run.close()
    with run.metrics_path.open("a") as f:
        f.write('{"step": 4, "lo')  # killed mid-write
    with pytest.warns(UserWarning, match="torn last row"):
        resumed = RunDir.create("exp", {"a": 1}, root=tmp_path, resume=True)
    assert [r["step"] for r in resumed.read_metrics()] == [1, 2, 3]
    resumed.log(4, {"loss": 0.5})
    assert [json.loads(line)["step"] for line in resumed.metrics_path.read_text().splitlines()] == [1, 2, 3, 4]
    resumed.close()
    lines = run.metrics_path.read_text().splitlines()
    run.metrics_path.write_text("\n".join([lines[0], '{"step": 2, "lo', *lines[2:]]) + "\n")
    with pytest.raises(RunDirError, match="metrics.jsonl line 2 is not a JSON row"):
        run.read_metrics()


def test_a_kill_during_the_metrics_rewrite_keeps_the_history(tmp_path, monkeypatch):
    run = RunDir.create("exp", {"a": 1}, root=tmp_path)
    run.log_many(1, {"loss": np.arange(5.0)})
    before = run.metrics_path.read_text()

    def killed(*args):
        raise KeyboardInterrupt  # stands in for a kill between writing the temp file and the rename

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        run.truncate_metrics(2)
    assert run.metrics_path.read_text() == before  # untouched, never empty
    monkeypatch.undo()
    run.truncate_metrics(2)
    assert [r["step"] for r in run.read_metrics()] == [1, 2]
    run.close()


def _tensorboard_steps(tb_dir: pathlib.Path, tag: str) -> list[int]:
    """Steps logged for ``tag`` in every event file under ``tb_dir`` (TFRecord framing, no TF)."""
    from tensorboardX.proto.event_pb2 import Event

    steps = []
    for f in sorted(tb_dir.rglob("events.out.tfevents.*")):
        data, pos = f.read_bytes(), 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            steps += [event.step for v in event.summary.value if v.tag == tag]
    return sorted(steps)


def test_tensorboard_matches_metrics_after_a_resume(tmp_path):
    run = RunDir.create("exp", {"a": 1}, root=tmp_path)
    run.log_many(1, {"loss": np.arange(6.0)})
    run.close()
    resumed = RunDir.create("exp", {"a": 1}, root=tmp_path, resume=True)
    resumed.truncate_metrics(3)  # the checkpoint it resumes from is at step 3
    resumed.log_many(4, {"loss": np.arange(3.0)})
    resumed.close()
    assert [r["step"] for r in resumed.read_metrics()] == [1, 2, 3, 4, 5, 6]
    assert _tensorboard_steps(resumed.path / "tb", "loss") == [1, 2, 3, 4, 5, 6]


def test_unwritable_run_root_fails_before_training(tmp_path, capsys):
    root = tmp_path / "a_file"
    root.write_text("not a directory")
    with pytest.raises(RunDirError, match="cannot create a run directory under"):
        RunDir.create("exp", {"a": 1}, root=root)
    with pytest.raises(SystemExit, match="RunDirError: cannot create a run directory"):
        cli.main(["run", "ppo_catch", "--run-root", str(root), "--ppo.total-timesteps", "512",
                  "--ppo.num-envs", "16", "--ppo.num-steps", "8"])


def test_unknown_nonfinite_policy_is_refused(tmp_path):
    with pytest.raises(ValueError, match="on_nonfinite must be one of"):
        RunDir.create("exp", {"a": 1}, root=tmp_path, on_nonfinite="ignore")
    assert not (tmp_path / "exp").exists()
