"""Orbax checkpointing of any training-state pytree, with clear errors.

The state is saved as its flat list of leaves (typed PRNG keys as raw key data)
and restored into the tree structure of a template, so any pytree type works
(nnx.State, flax.struct dataclasses, NamedTuples) and a changed model or config
is reported as a mismatch instead of silently loading garbage. Orbax writes
each step to a temporary directory and renames it when complete, so a save that
is interrupted never replaces a good checkpoint.

Integrity: each step stores, next to its arrays and in the same atomic save, a
SHA-256 checksum of every array's dtype, shape and bytes. ``restore`` recomputes
them and refuses a step whose data changed on disk (a flipped bit, a truncated
or replaced file) or whose floating-point state holds NaN or inf, with the same
"checkpoint N is corrupt; delete it to resume from M" error as an unreadable one.

Multi-process runs (every process calls ``save`` and ``restore`` at the same steps; the checkpoint
directory is on a filesystem every process sees): the leaves sharded across processes are
all-gathered (``parallel.distributed.host_values``), so every process holds the same full arrays
and checksums; orbax's primary host (process 0) writes them, the others wait at its barriers. On
restore every process reads the full arrays, checks them, and builds each leaf with the template
leaf's sharding (each process placing its own shards), so a run resumes with the process count and
shardings it was saved with (``RunDir`` refuses another count).
"""

from __future__ import annotations

import hashlib
import pathlib
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxrl_reason.parallel import distributed


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt or does not match the training state."""


def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _saved_like(x):
    """Shape and dtype of a leaf's saved array, without moving any data."""
    if _is_key(x):
        return jax.eval_shape(jax.random.key_data, x)
    return jax.ShapeDtypeStruct(x.shape, x.dtype) if isinstance(x, jax.Array) else np.asarray(x)


def _name(i: int) -> str:
    return f"{i:05d}"


def _to_saveable(tree) -> dict[str, np.ndarray]:
    """Leaf index -> numpy array; empty arrays are skipped (orbax cannot store them)."""
    leaves = distributed.host_values(jax.tree.leaves(tree))
    return {_name(i): x for i, x in enumerate(leaves) if x.size}


def _placed(value: np.ndarray, leaf):
    """A restored host ``value`` as the template ``leaf``: its key type, and its sharding if it spans processes."""
    if distributed.spans_processes(leaf):  # every process places its own shards of the same full value
        value = distributed.to_global(value, leaf.sharding)
    if _is_key(leaf):
        return jax.random.wrap_key_data(value, impl=jax.random.key_impl(leaf))
    return jax.numpy.asarray(value)


def checksum(x: np.ndarray) -> str:
    """SHA-256 of an array's dtype, shape and bytes (hex)."""
    h = hashlib.sha256(f"{x.dtype.str}{list(x.shape)}".encode())
    h.update(np.ascontiguousarray(x).tobytes())
    return h.hexdigest()


class Checkpointer:
    """Saves every ``interval`` steps (and on ``force``), keeps ``max_to_keep``."""

    def __init__(self, directory: str | pathlib.Path, interval: int = 1, max_to_keep: int = 3):
        if interval < 1:
            raise ValueError(f"checkpoint interval must be >= 1, got {interval}")
        self.directory = pathlib.Path(directory).absolute()
        self.interval = interval
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep, enable_async_checkpointing=False, create=True
            ),
        )

    def latest_step(self) -> int | None:
        self._manager.reload()
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: Any, force: bool = False) -> bool:
        """Save ``state`` at ``step`` if due (or forced). Returns whether it saved."""
        if not force and step % self.interval:
            return False
        if step in self.all_steps():
            return False
        arrays = _to_saveable(state)
        for name, x in arrays.items():
            if np.issubdtype(x.dtype, np.inexact) and not np.isfinite(x).all():
                raise CheckpointError(f"refusing to save step {step}: array {name} holds NaN or inf")
        sums = {name: checksum(x) for name, x in arrays.items()}
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(arrays), integrity=ocp.args.JsonSave(sums)), force=True)
        self._manager.wait_until_finished()
        return True

    def restore(self, template: Any, step: int | None = None) -> tuple[int, Any]:
        """Restore ``(step, state)`` into ``template``'s structure (latest step by default)."""
        steps = self.all_steps()
        if not steps:
            raise CheckpointError(
                f"no checkpoint found in {self.directory}; start without --resume to train from scratch"
            )
        step = steps[-1] if step is None else step
        if step not in steps:
            raise CheckpointError(f"no checkpoint for step {step} in {self.directory}; available: {steps}")
        leaves, treedef = jax.tree.flatten(template)
        expected = {_name(i): like for i, like in enumerate(map(_saved_like, leaves)) if np.prod(like.shape)}
        older = [s for s in steps if s < step]
        fix = (f"delete {self.directory / str(step)} to resume from step {older[-1]}"
               if older else "delete it and start without --resume")

        def corrupt(why: str) -> CheckpointError:
            return CheckpointError(f"checkpoint step {step} in {self.directory} is corrupt: {why}; {fix}")

        if not (self.directory / str(step) / "integrity").is_dir():
            raise corrupt("it has no checksums (written by an older version or by an interrupted save)")
        try:
            both = self._manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(), integrity=ocp.args.JsonRestore()))
            restored, sums = both.state, both.integrity
        except Exception as err:  # orbax raises many types for damaged files
            raise corrupt(f"unreadable ({type(err).__name__}: {str(err)[:200]})") from err
        if not isinstance(sums, dict) or sorted(sums) != sorted(restored):
            raise corrupt("its checksum list does not match its arrays")
        if sorted(restored) != sorted(expected):
            raise CheckpointError(
                f"checkpoint step {step} holds {len(restored)} arrays but the training state has "
                f"{len(expected)}: the model or config changed since it was written; "
                "resume with the original config or start a new run"
            )
        out = []
        for i, leaf in enumerate(leaves):
            name = _name(i)
            if name not in expected:  # empty array: nothing was stored
                out.append(leaf)
                continue
            value, want = np.asarray(restored[name]), expected[name]
            if value.shape != want.shape or value.dtype != want.dtype:
                raise CheckpointError(
                    f"checkpoint step {step} array {name} is {value.dtype}{list(value.shape)} but the "
                    f"training state expects {want.dtype}{list(want.shape)}: the model or config changed"
                )
            if checksum(value) != sums[name]:
                raise corrupt(f"array {name} does not match its checksum (the data changed on disk)")
            if np.issubdtype(value.dtype, np.inexact) and not np.isfinite(value).all():
                raise corrupt(f"array {name} holds NaN or inf")
            out.append(_placed(value, leaf))
        return step, jax.tree.unflatten(treedef, out)

    def close(self):
        self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
