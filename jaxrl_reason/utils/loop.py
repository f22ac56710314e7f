"""The chunked training driver every experiment uses: jitted chunks, progress bar,
metrics, periodic checkpoints, exact resume and the non-finite guard."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
from tqdm.auto import tqdm

from jaxrl_reason.utils import guard
from jaxrl_reason.utils.experiment import RunDir


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
    bar = tqdm(range(start, num_chunks), initial=start, total=num_chunks, desc=desc, disable=not run_dir.is_writer)
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
        ckpt.save(chunk + 1, state, force=chunk + 1 == num_chunks)
    return state
