"""The chunked training driver every experiment uses: jitted chunks, progress bar,
metrics, periodic checkpoints, exact resume, the non-finite guard and Ctrl-C at a chunk boundary."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any, Callable, Mapping

import jax
from tqdm.auto import tqdm

from jaxrl_reason.parallel import distributed
from jaxrl_reason.utils import guard
from jaxrl_reason.utils.experiment import RunDir


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped ``run_chunks`` at a chunk boundary after checkpointing that state: ``step`` is the last step
    done and ``path`` the run directory (resume it to continue exactly)."""

    def __init__(self, step: int, path):
        super().__init__(f"interrupted after step {step} of {path}")
        self.step, self.path = step, path


class StopRequest:
    """``with StopRequest(desc) as stop``: a first SIGINT (Ctrl-C) sets ``stop.requested`` (the loop stops at its
    next chunk boundary), a second raises KeyboardInterrupt at once. Installed only where Ctrl-C has Python's
    default handler, in the main thread of a one-process run; elsewhere (another handler, a thread, several
    processes that must stop at the same step) Ctrl-C raises KeyboardInterrupt as usual."""

    def __init__(self, desc: str):
        self.desc, self.requested, self._previous = desc, False, None

    def __enter__(self) -> StopRequest:
        if (threading.current_thread() is threading.main_thread() and distributed.process_count() == 1
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        # os.write: a handler may run in the middle of another write to stderr
        os.write(sys.stderr.fileno(), f"\n[{self.desc}] Ctrl-C: stopping after this step and checkpointing it "
                 "(Ctrl-C again to abort now)\n".encode())


def run_chunks(
    run_dir: RunDir,
    init_state: Any,
    chunk_fn: Callable[[Any], tuple[Any, dict]],
    num_chunks: int,
    *,
    steps_per_chunk: int = 1,
    checkpoint_every: int = 1,
    desc: str = "train",
    postfix: Callable[[dict], Mapping[str, Any]] | None = None,
) -> Any:
    """Run ``state, metrics = chunk_fn(state)`` ``num_chunks`` times.

    ``metrics`` values are ``[steps_per_chunk]`` arrays, logged as rows
    ``chunk * steps_per_chunk + 1 ...``. The state is checkpointed every
    ``checkpoint_every`` chunks and after the last one. On a resumed run the
    latest checkpoint is restored (``init_state`` is the template) and metrics
    rows written after it are dropped, so the resumed run continues exactly where
    the checkpoint was taken and ends with the same state as an uninterrupted run.

    Non-finite guard (``run_dir.on_nonfinite``, see ``utils.guard``): a NaN or
    inf loss / gradient norm in the metrics, an update skipped by
    ``guard_optimizer`` (under ``"raise"``), or a non-finite state stops the run
    with a ``NonFiniteError`` before that state is checkpointed; under ``"skip"``
    the running count of skipped updates is logged as ``nonfinite_skipped_updates``.

    ``postfix(metrics) -> {label: value}``: shown after the progress bar, from each chunk's (host) metrics.

    Ctrl-C (``StopRequest``): the current chunk finishes, its state is checkpointed and ``Interrupted`` is raised
    (the CLI prints the command that resumes the run); a second Ctrl-C aborts at once (KeyboardInterrupt).

    Multi-process runs: every process runs this loop (the same chunks, checkpoints and checks);
    only the writer (process 0) shows the progress bar and writes metrics (``RunDir.is_writer``).
    """
    ckpt = run_dir.checkpointer(checkpoint_every)
    start, state = 0, init_state
    if run_dir.resumed:
        if ckpt.latest_step() is not None:
            start, state = ckpt.restore(init_state)
        run_dir.truncate_metrics(start * steps_per_chunk)
        if start and run_dir.is_writer:
            tqdm.write(f"resumed {run_dir.path} at chunk {start}/{num_chunks}")
    skipped = guard.skipped_updates(state)
    if start < num_chunks and run_dir.is_writer:
        what = "step" if steps_per_chunk == 1 else f"chunk ({steps_per_chunk} steps)"
        tqdm.write(f"[{desc}] the first {what} compiles the programs; the next ones run them", file=sys.stderr)
    bar = tqdm(range(start, num_chunks), initial=start, total=num_chunks, desc=desc, disable=not run_dir.is_writer)
    with StopRequest(desc) as stop:
        for chunk in bar:
            state, metrics = chunk_fn(state)
            first, last = chunk * steps_per_chunk + 1, (chunk + 1) * steps_per_chunk
            now = guard.skipped_updates(state)
            extra = {guard.SKIPPED_METRIC: now} if run_dir.on_nonfinite == "skip" else {}
            metrics = jax.device_get(metrics)
            run_dir.log_many(first, metrics, last_row=extra)
            if postfix is not None:
                bar.set_postfix(postfix(metrics), refresh=False)
            if run_dir.on_nonfinite == "raise" and now > skipped:
                raise guard.NonFiniteError(
                    f"{run_dir.path}: {now - skipped} update(s) in steps {first}-{last} had NaN or inf gradients; "
                    "the run stops here (the last checkpoint before it is kept); pass --on-nonfinite skip to skip them"
                )
            skipped = now
            guard.check_state(last, state, where=str(run_dir.path))
            stopping = stop.requested and chunk + 1 < num_chunks  # read once: a Ctrl-C may come at any moment
            ckpt.save(chunk + 1, state, force=chunk + 1 == num_chunks or stopping)
            if stopping:
                bar.update()  # this chunk is done
                bar.close()
                raise Interrupted(last, run_dir.path)
    return state
