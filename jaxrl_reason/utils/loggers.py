"""Where a run's metrics rows go besides ``metrics.jsonl``: TensorBoard (the default) and Weights & Biases.

``RunDir(..., loggers=("tensorboard", "wandb"))`` (the CLI's ``--logger tensorboard wandb``; ``--logger none``
for neither) makes one of these per name. Each takes the rows ``{"step": s, name: value, ...}`` RunDir
writes (finite numbers only are sent), tables of text rows (``write_table(name, step, rows)``: TensorBoard
text as a markdown table, a W&B table), and ``rewrite(rows, tables)`` when a resumed run drops the rows
logged after its checkpoint.

W&B: the run's id is derived from the run directory's absolute path, so ``--resume`` continues the same
W&B run; rows logged again after the checkpoint are plotted against their ``step`` (W&B keeps what it was
sent, so those steps show twice). Mode, project and entity come from W&B's own variables: ``WANDB_MODE``
(``offline`` writes ``<run>/wandb/`` for ``wandb sync`` later), ``WANDB_PROJECT`` (default
``jaxrl_reason``), ``WANDB_ENTITY``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib
import shutil

#: The names ``RunDir`` and the CLI accept.
LOGGERS = ("tensorboard", "wandb")


class LoggerError(ValueError):
    """An unknown logger, or one whose package is not installed."""


def check_loggers(names) -> tuple[str, ...]:
    """``names`` as a tuple, each one of ``LOGGERS`` (else ``LoggerError``); W&B's package is imported here so a
    missing one is an error before any training."""
    names = tuple(names)
    bad = [n for n in names if n not in LOGGERS]
    if bad:
        raise LoggerError(f"unknown logger(s) {bad}; choose from {LOGGERS} (metrics.jsonl is always written)")
    if "wandb" in names:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise LoggerError("the wandb logger needs the wandb package: pip install wandb") from None
    return names


def _numbers(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}


def _columns(rows: list[dict]) -> list[str]:
    return [k for k in dict.fromkeys(k for r in rows for k in r) if k != "step"]


def markdown_table(rows: list[dict], width: int = 400) -> str:
    """Rows (dicts) as a markdown table, each cell on one line and at most ``width`` characters."""
    cols = _columns(rows)
    cell = lambda v: (f"{v:.4g}" if isinstance(v, float) else str(v)).replace("|", "\\|").replace("\n", "⏎")[:width]
    return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
                     + ["| " + " | ".join(cell(r.get(c, "")) for c in cols) + " |" for r in rows])


class TensorBoardLogger:
    """Event files under ``<run>/tb/``."""

    def __init__(self, run_path: pathlib.Path):
        self.dir = run_path / "tb"
        self._writer = None

    def write(self, rows: list[dict]) -> None:
        if self._writer is None:
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(str(self.dir))
        for row in rows:
            for k, v in _numbers(row).items():
                self._writer.add_scalar(k, v, row["step"])

    def write_table(self, name: str, step: int, rows: list[dict]) -> None:
        self.write([])
        self._writer.add_text(name, markdown_table(rows), step)

    def rewrite(self, rows: list[dict], tables: dict[str, list[dict]] | None = None) -> None:
        """The events rebuilt from ``rows`` and ``tables`` ({name: rows with their step}; so TensorBoard and the
        run's JSONL files hold the same steps)."""
        self.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.write(rows)
        for name, table in (tables or {}).items():
            for step in sorted({r["step"] for r in table}):
                self.write_table(name, step, [r for r in table if r["step"] == step])
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class WandbLogger:
    """One W&B run per run directory (see the module docstring); the config is the run's ``config.json``."""

    def __init__(self, run_path: pathlib.Path):
        self.path = run_path
        self._run = None

    def _start(self):
        import wandb

        config_file = self.path / "config.json"
        config = json.loads(config_file.read_text()) if config_file.exists() else {}
        run_id = hashlib.sha256(str(self.path.resolve()).encode()).hexdigest()[:16]
        self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", "jaxrl_reason"), id=run_id, resume="allow",
                               name="/".join(self.path.parts[-2:]), dir=str(self.path), config=config)
        self._run.define_metric("step")
        self._run.define_metric("*", step_metric="step")

    def write(self, rows: list[dict]) -> None:
        if self._run is None:
            self._start()
        for row in rows:
            self._run.log({"step": row["step"], **_numbers(row)})

    def write_table(self, name: str, step: int, rows: list[dict]) -> None:
        import wandb

        if self._run is None:
            self._start()
        cols = _columns(rows)
        self._run.log({"step": step, name: wandb.Table(columns=cols, data=[[r.get(c) for c in cols] for r in rows])})

    def rewrite(self, rows: list[dict], tables: dict[str, list[dict]] | None = None) -> None:
        """Nothing: W&B keeps what it was sent; the rows logged again overlay them by ``step``."""

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


def make_loggers(names, run_path: pathlib.Path) -> list:
    kinds = {"tensorboard": TensorBoardLogger, "wandb": WandbLogger}
    return [kinds[name](run_path) for name in check_loggers(names)]
