"""Run directories: resolved config, metrics (JSONL + TensorBoard), plots, tables, checkpoints.

Layout of one run::

    runs/<experiment>/<timestamp>/
        config.json      the resolved config (checked again on --resume)
        run.json         how the run was launched: {"processes": N} (checked again on --resume)
        metrics.jsonl    one {"step": s, ...metrics} object per line
        <name>.jsonl     tables of text rows logged at a step (``log_table``: e.g. sample completions), one
                         {"step": s, ...} object per line
        tb/              TensorBoard event files (``utils.loggers``; wandb/ with W&B offline)
        *.png, *.md, *.csv, summary.json
        checkpoints/     orbax checkpoints (see ``Checkpointer``)
        .lock            held (flock) by the one process writing the run

A run that fails before its first step leaves nothing behind (``discard_if_unstarted``: the CLI calls it); one
that fails or is stopped after a step keeps its directory, to resume. ``--resume`` without a path takes the latest
run of the experiment with the same config that holds a checkpoint or metrics (``pick_resume``).

Guarantees: one writer per run directory (a second process, e.g. a concurrent
``--resume``, is refused while the first holds the lock); metrics.jsonl is
appended row by row and rewritten only through a temporary file and a rename,
so a kill never empties it; a torn last row (a kill mid-write) is dropped with a
warning on resume; on resume TensorBoard's events are rebuilt from metrics.jsonl,
so both hold the same steps (tables too: their rows after the checkpoint are dropped and the rest sent to
the loggers again); watched metrics (losses, gradient norms) that turn
NaN or inf stop the run under ``on_nonfinite="raise"`` (see ``utils.guard``).

Multi-process runs (``parallel.distributed``; a filesystem shared by every process is assumed):
process 0 alone is the writer (``is_writer``): it chooses or finds the directory and tells the others
its path, holds the lock, and writes config, run.json, metrics, TensorBoard, plots, tables and JSON.
On the other processes these writes are no-ops; ``log`` keeps their rows in memory, so
``read_metrics`` works on every process (a resumed run starts from the rows on disk). Checkpoints are
joined by every process (see ``Checkpointer``). A run resumes only with the process count it was
started with.
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import json
import os
import pathlib
import shutil
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_reason.parallel import distributed
from jaxrl_reason.utils import guard
from jaxrl_reason.utils.checkpoint import Checkpointer
from jaxrl_reason.utils.loggers import check_loggers, make_loggers


class RunDirError(RuntimeError):
    """A run directory cannot be created, is in use, holds unreadable metrics, or cannot be resumed (none found,
    another config or process count)."""


def config_to_dict(config: Any) -> Any:
    """Frozen dataclass (possibly nested) -> JSON-able dict."""
    if dataclasses.is_dataclass(config):
        return {f.name: config_to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, (list, tuple)):
        return [config_to_dict(v) for v in config]
    if isinstance(config, Mapping):
        return {str(k): config_to_dict(v) for k, v in config.items()}
    return config


def _scalar(v) -> float | int | None:
    v = np.asarray(v)
    if v.size != 1:
        return None
    v = v.item()
    return v if isinstance(v, (int, bool)) else float(v)


def write_atomic(path: pathlib.Path, text: str) -> None:
    """Replace ``path`` with ``text`` through a temporary file and a rename (never half-written)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_metrics(path: str | pathlib.Path) -> list[dict]:
    """Rows of a metrics.jsonl; a torn last row (a kill mid-write) is left out, any other
    unreadable row is a ``RunDirError`` naming its line."""
    path = pathlib.Path(path)
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            if all(not rest.strip() for rest in lines[i + 1:]):
                break  # torn last row: RunDir drops it on resume
            raise RunDirError(f"{path} line {i + 1} is not a JSON row ({err})") from err
    return rows


def _rows_after_zero(path: pathlib.Path) -> bool:
    """Whether a metrics.jsonl holds a row at a step >= 1 (an unreadable row counts as one: never lose it)."""
    for line in path.read_text().splitlines():
        try:
            if line.strip() and json.loads(line).get("step", 1) >= 1:
                return True
        except (json.JSONDecodeError, AttributeError, TypeError):
            return True
    return False


def _checkpointed(path: pathlib.Path) -> bool:
    """Whether a run directory or one of its sub-runs holds a checkpoint."""
    return any(c.is_dir() and any(c.iterdir()) for c in path.rglob("checkpoints"))


def started(path: str | pathlib.Path) -> bool:
    """Whether a run directory (or a sub-run in it) did a step: a checkpoint, or a metrics row after step 0."""
    path = pathlib.Path(path)
    return _checkpointed(path) or any(_rows_after_zero(m) for m in path.rglob("metrics.jsonl"))


def resumable(path: str | pathlib.Path) -> bool:
    """Whether ``--resume`` has anything to continue in a run directory: a checkpoint or a metrics row (its own or a
    sub-run's)."""
    path = pathlib.Path(path)
    return _checkpointed(path) or any(m.stat().st_size for m in path.rglob("metrics.jsonl"))


def _config_diff(saved: dict, wanted: dict) -> list[str]:
    """The dotted config fields that differ, as ``"lr (run: 0.1, now: 0.2)"``."""
    before, now = _flat(saved), _flat(wanted)
    return [f"{k} (run: {before.get(k, '-')}, now: {now.get(k, '-')})" for k in sorted(set(before) | set(now))
            if before.get(k) != now.get(k)]


def _saved_config(path: pathlib.Path) -> Any:
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None  # unreadable: never the same config


def pick_resume(experiment: str, base: pathlib.Path, wanted: Any) -> pathlib.Path:
    """The latest run under ``base`` with the config ``wanted`` (JSON-normalised) that holds a checkpoint or metrics;
    else a ``RunDirError`` saying what is there (runs of other configs and what differs, runs that did nothing)."""
    runs = sorted(p for p in base.glob("*") if (p / "config.json").exists()) if base.exists() else []
    others, empty = [], 0
    for path in reversed(runs):
        if not resumable(path):
            empty += 1
        elif (saved := _saved_config(path)) == wanted:
            return path
        else:
            diff = _config_diff(saved, wanted) if isinstance(saved, dict) else ["config.json unreadable"]
            others.append(f"{path.name}: {', '.join(diff[:3])}{', ...' if len(diff) > 3 else ''}")
    found = []
    if others:
        found.append(f"{len(others)} run(s) with other configs, the latest first: {'; '.join(others[:3])}"
                     f"{'; ...' if len(others) > 3 else ''}")
    if empty:
        found.append(f"{empty} without a checkpoint or metrics")
    there = f" ({'; '.join(found)})" if found else ""
    raise RunDirError(f"--resume: no earlier run of {experiment!r} with this configuration under {base}{there}; start "
                      "one without --resume (or give --resume RUN_DIR)")


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config dict as ``{"grpo.loss.eps_low": value, ...}`` (an empty dict stays a value)."""
    if not isinstance(tree, dict) or not tree:
        return {prefix: tree}
    flat = {}
    for key, sub in tree.items():
        flat.update(_flat(sub, f"{prefix}.{key}" if prefix else str(key)))
    return flat


class RunDir:
    """One run of one experiment; create with ``RunDir.create``.

    ``on_nonfinite`` is the ``utils.guard`` policy of every loop that logs here:
    ``"raise"`` (default) or ``"skip"``. ``is_writer`` (default: this is process 0) says whether
    this process writes the run's files; a non-writer only keeps its metrics rows in memory.
    ``loggers``: where rows go besides metrics.jsonl (``utils.loggers``: "tensorboard", "wandb").
    """

    def __init__(self, path: pathlib.Path, resumed: bool, on_nonfinite: str = "raise",
                 is_writer: bool | None = None, loggers: Sequence[str] = ("tensorboard",)):
        self.path = path
        self.resumed = resumed
        self.on_nonfinite = guard.check_policy(on_nonfinite)
        self.is_writer = distributed.is_primary() if is_writer is None else is_writer
        self.loggers = check_loggers(loggers)
        self._loggers = make_loggers(self.loggers, path) if self.is_writer else []
        self._checkpointer: Checkpointer | None = None
        self._lock = None
        self._rows: list[dict] | None = None  # a non-writer's metrics
        self._made_parents: list[pathlib.Path] = []  # folders created with this run (``discard_if_unstarted``)
        if self.is_writer:
            self._lock = self._acquire_lock()
            if resumed:
                self._repair_metrics()
        else:
            self._rows = read_metrics(self.metrics_path) if resumed else []

    def _acquire_lock(self):
        lock = (self.path / ".lock").open("a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            lock.close()
            raise RunDirError(
                f"run directory {self.path} is in use by another process (pid {holder}); wait for it to "
                "finish (or stop it) before resuming, or start a new run without --resume"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        return lock

    @classmethod
    def create(
        cls,
        experiment: str,
        config: Any,
        root: str | pathlib.Path = "runs",
        resume: bool | str | pathlib.Path = False,
        on_nonfinite: str = "raise",
        loggers: Sequence[str] = ("tensorboard",),
    ) -> RunDir:
        """New ``root/experiment/<timestamp>/``; ``resume=True`` reuses the latest run of
        ``experiment``, ``resume=<path>`` that run directory. The config and the process count must
        match on resume. An unwritable ``root`` is a ``RunDirError`` here, before any training.

        Multi-process: process 0 does all of this and sends the path (or its error, raised again on
        every process) to the others, which get a non-writing ``RunDir`` of the same path."""
        guard.check_policy(on_nonfinite)
        loggers = check_loggers(loggers)
        made: list[RunDir] = []  # process 0's RunDir (the writer)

        def make() -> str:
            made.append(cls._create_here(experiment, config, root, resume, on_nonfinite, loggers))
            return str(made[0].path)

        path = distributed.on_primary(make, errors=(RunDirError,))
        return made[0] if made else cls(pathlib.Path(path), resumed=bool(resume), on_nonfinite=on_nonfinite,
                                        loggers=loggers)

    @classmethod
    def _create_here(cls, experiment: str, config: Any, root, resume, on_nonfinite: str, loggers) -> RunDir:
        """``create`` on the writing process."""
        base = pathlib.Path(root) / experiment
        wanted = config_to_dict(config)
        if resume:
            if resume is True:
                path = pick_resume(experiment, base, json.loads(json.dumps(wanted)))
            else:
                path = pathlib.Path(resume)
                if not (path / "config.json").exists():
                    raise RunDirError(f"--resume: {path} is not a run directory (no config.json)")
            saved = json.loads((path / "config.json").read_text())
            if saved != json.loads(json.dumps(wanted)):
                diff = ", ".join(_config_diff(saved, json.loads(json.dumps(wanted))))
                raise RunDirError(
                    f"--resume: the config differs from the run in {path}: {diff}; resume with the same preset "
                    "and overrides, or start a new run (the same command without --resume)"
                )
            launched = json.loads((path / "run.json").read_text()) if (path / "run.json").exists() else {}
            processes = launched.get("processes", 1)  # runs from before run.json had one process
            if processes != distributed.process_count():
                raise RunDirError(
                    f"--resume: {path} was run by {processes} process(es) but this run has "
                    f"{distributed.process_count()}; resume it with --num-processes {processes}"
                )
            return cls(path, resumed=True, on_nonfinite=on_nonfinite, is_writer=True, loggers=loggers)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        path = base / stamp
        made = [d for d in (base, pathlib.Path(root)) if not d.exists()]  # removed again with a run that did nothing
        try:
            path.mkdir(parents=True, exist_ok=False)
            write_atomic(path / "config.json", json.dumps(wanted, indent=2))
            write_atomic(path / "run.json", json.dumps({"processes": distributed.process_count()}))
        except OSError as err:
            raise RunDirError(
                f"cannot create a run directory under {pathlib.Path(root).absolute()}: {err.strerror or err} "
                f"({err.filename or path}); pass a writable --run-root"
            ) from err
        run = cls(path, resumed=False, on_nonfinite=on_nonfinite, is_writer=True, loggers=loggers)
        run._made_parents = made
        return run

    def discard_if_unstarted(self) -> bool:
        """After a failure: close the run and, when this process created it and it did no step (``started``: no
        checkpoint, no metrics row after step 0, in it or a sub-run), remove it and the folders made for it, so
        that nothing is left to ``--resume``. Returns whether it was removed."""
        self.close()
        if self.resumed or not self.is_writer or not self.path.exists() or started(self.path):
            return False
        shutil.rmtree(self.path, ignore_errors=True)
        for folder in self._made_parents:
            try:
                folder.rmdir()  # only if empty
            except OSError:
                break
        return not self.path.exists()

    def child(self, name: str) -> RunDir:
        """``<path>/<name>/``: a sub-run (own metrics, checkpoints and lock) resumed with this one."""
        path = self.path / name
        if self.is_writer:
            path.mkdir(parents=True, exist_ok=True)
        return RunDir(path, resumed=self.resumed, on_nonfinite=self.on_nonfinite, is_writer=self.is_writer,
                      loggers=self.loggers)

    # -- metrics -----------------------------------------------------------
    @property
    def metrics_path(self) -> pathlib.Path:
        return self.path / "metrics.jsonl"

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append scalar ``metrics`` at ``step`` to metrics.jsonl and the loggers (TensorBoard, W&B)."""
        row = {"step": int(step)}
        for k, v in metrics.items():
            s = _scalar(v)
            if s is not None:
                row[k] = s
        if self.is_writer:
            with self.metrics_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            for logger in self._loggers:
                logger.write([row])
        else:
            self._rows.append(json.loads(json.dumps(row)))  # the values a reader of the file would get
        guard.check_metrics(row["step"], row, self.on_nonfinite, where=str(self.path))

    def log_many(self, first_step: int, metrics: Mapping[str, Any], stride: int = 1,
                 last_row: Mapping[str, Any] | None = None) -> None:
        """Log stacked metrics (each ``[n]``) as n rows at first_step, first_step+stride, ...;
        ``last_row`` scalars join the last of them."""
        n = len(next(iter(metrics.values())))
        for i in range(n):
            row = {k: np.asarray(v)[i] for k, v in metrics.items()}
            self.log(first_step + i * stride, {**row, **(last_row or {})} if i == n - 1 else row)

    def log_table(self, name: str, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """Append ``rows`` (dicts of text / numbers, e.g. sample completions) at ``step`` to ``<name>.jsonl`` and
        the loggers (TensorBoard text, W&B table). Values that are not JSON types are written as strings."""
        if not self.is_writer or not rows:
            return
        rows = [{"step": int(step), **json.loads(json.dumps(dict(r), default=str))} for r in rows]
        with (self.path / f"{name}.jsonl").open("a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        for logger in self._loggers:
            logger.write_table(name, int(step), rows)

    def tables(self) -> dict[str, list[dict]]:
        """{name: rows} of every table ``log_table`` wrote (the writer's files)."""
        return {p.stem: read_metrics(p) for p in sorted(self.path.glob("*.jsonl")) if p != self.metrics_path}

    def read_metrics(self) -> list[dict]:
        """The rows logged so far (the writer reads metrics.jsonl, another process its own copy)."""
        return read_metrics(self.metrics_path) if self.is_writer else [dict(r) for r in self._rows]

    def _repair_metrics(self) -> None:
        """On resume: drop a torn last row (with a warning) so appends start on a fresh line."""
        if not self.metrics_path.exists():
            return
        text = self.metrics_path.read_text()
        rows = self.read_metrics()
        clean = "".join(json.dumps(r) + "\n" for r in rows)
        if clean != text:
            if len(rows) < sum(1 for line in text.splitlines() if line.strip()):
                warnings.warn(f"{self.metrics_path}: dropped a torn last row (the run was killed mid-write)")
            write_atomic(self.metrics_path, clean)

    def truncate_metrics(self, last_step: int) -> None:
        """Drop metrics and table rows after ``last_step`` (logged after the checkpoint a resumed run restarts
        from) and rebuild TensorBoard's events from the rows kept, so both show the same steps."""
        rows = [r for r in self.read_metrics() if r["step"] <= last_step]
        if not self.is_writer:
            self._rows = rows
            return
        write_atomic(self.metrics_path, "".join(json.dumps(r) + "\n" for r in rows))
        tables = {name: [r for r in kept if r.get("step", 0) <= last_step] for name, kept in self.tables().items()}
        for name, kept in tables.items():
            write_atomic(self.path / f"{name}.jsonl", "".join(json.dumps(r) + "\n" for r in kept))
        for logger in self._loggers:
            logger.rewrite(rows, tables)

    # -- outputs -----------------------------------------------------------
    def plot(self, keys: Sequence[str], filename: str = "curves.png", x: str = "step",
             title: str | None = None) -> pathlib.Path:
        """One panel per metric in ``keys`` against ``x``, from metrics.jsonl (drawn by the writer only)."""
        out = self.path / filename
        if not self.is_writer:
            return out
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = self.read_metrics()
        fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3), squeeze=False)
        for ax, key in zip(axes[0], keys):
            pts = [(r[x], r[key]) for r in rows if key in r and x in r]
            if pts:
                ax.plot(*zip(*pts))
            ax.set_xlabel(x)
            ax.set_title(key)
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(out, dpi=100)
        plt.close(fig)
        return out

    def write_table(self, name: str, rows: list[dict]) -> str:
        """Write ``name.md`` and ``name.csv`` (the writer only); returns the markdown."""
        cols = list(dict.fromkeys(k for r in rows for k in r))
        fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
        md = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
        md += "".join("| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |\n" for r in rows)
        if not self.is_writer:
            return md
        (self.path / f"{name}.md").write_text(md)
        csv = ",".join(cols) + "\n" + "".join(",".join(fmt(r.get(c, "")) for c in cols) + "\n" for r in rows)
        (self.path / f"{name}.csv").write_text(csv)
        return md

    def save_json(self, name: str, obj: Any) -> pathlib.Path:
        out = self.path / (name if name.endswith(".json") else f"{name}.json")
        if self.is_writer:
            write_atomic(out, json.dumps(config_to_dict(obj), indent=2, default=float))
        return out

    def checkpointer(self, interval: int = 1, max_to_keep: int = 3) -> Checkpointer:
        if self._checkpointer is None:
            self._checkpointer = Checkpointer(self.path / "checkpoints", interval, max_to_keep)
        return self._checkpointer

    def close(self) -> None:
        for logger in self._loggers:
            logger.close()
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None
