"""Run directories: resolved config, metrics (JSONL + TensorBoard), plots, tables, checkpoints.

Layout of one run::

    runs/<experiment>/<timestamp>/
        config.json      the resolved config (checked again on --resume)
        metrics.jsonl    one {"step": s, ...metrics} object per line
        tb/              TensorBoard event files
        *.png, *.md, *.csv, summary.json
        checkpoints/     orbax checkpoints (see ``Checkpointer``)
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_reason.utils.checkpoint import Checkpointer


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


class RunDir:
    """One run of one experiment; create with ``RunDir.create``."""

    def __init__(self, path: pathlib.Path, resumed: bool):
        self.path = path
        self.resumed = resumed
        self._tb = None
        self._checkpointer: Checkpointer | None = None

    @classmethod
    def create(
        cls,
        experiment: str,
        config: Any,
        root: str | pathlib.Path = "runs",
        resume: bool | str | pathlib.Path = False,
    ) -> "RunDir":
        """New ``root/experiment/<timestamp>/``; ``resume=True`` reuses the latest run of
        ``experiment``, ``resume=<path>`` that run directory. The config must match on resume."""
        base = pathlib.Path(root) / experiment
        wanted = config_to_dict(config)
        if resume:
            if resume is True:
                runs = sorted(p for p in base.glob("*") if (p / "config.json").exists()) if base.exists() else []
                if not runs:
                    raise FileNotFoundError(
                        f"--resume: no earlier run of {experiment!r} under {base}; run without --resume first"
                    )
                path = runs[-1]
            else:
                path = pathlib.Path(resume)
                if not (path / "config.json").exists():
                    raise FileNotFoundError(f"--resume: {path} is not a run directory (no config.json)")
            saved = json.loads((path / "config.json").read_text())
            if saved != json.loads(json.dumps(wanted)):
                diff = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
                raise ValueError(
                    f"--resume: the config differs from the run in {path} in field(s) {diff}; "
                    "resume with the same preset and overrides, or start a new run"
                )
            return cls(path, resumed=True)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        path = base / stamp
        path.mkdir(parents=True, exist_ok=False)
        (path / "config.json").write_text(json.dumps(wanted, indent=2))
        return cls(path, resumed=False)

    # -- metrics -----------------------------------------------------------
    @property
    def metrics_path(self) -> pathlib.Path:
        return self.path / "metrics.jsonl"

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append scalar ``metrics`` at ``step`` to metrics.jsonl and TensorBoard."""
        row = {"step": int(step)}
        for k, v in metrics.items():
            s = _scalar(v)
            if s is not None:
                row[k] = s
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is None:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.path / "tb"))
        for k, v in row.items():
            if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                self._tb.add_scalar(k, v, row["step"])

    def log_many(self, first_step: int, metrics: Mapping[str, Any], stride: int = 1) -> None:
        """Log stacked metrics (each ``[n]``) as n rows at first_step, first_step+stride, ..."""
        n = len(next(iter(metrics.values())))
        for i in range(n):
            self.log(first_step + i * stride, {k: np.asarray(v)[i] for k, v in metrics.items()})

    def read_metrics(self) -> list[dict]:
        if not self.metrics_path.exists():
            return []
        return [json.loads(line) for line in self.metrics_path.read_text().splitlines() if line.strip()]

    def truncate_metrics(self, last_step: int) -> None:
        """Drop rows after ``last_step`` (logged after the checkpoint a resumed run restarts from)."""
        rows = [r for r in self.read_metrics() if r["step"] <= last_step]
        self.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    # -- outputs -----------------------------------------------------------
    def plot(self, keys: Sequence[str], filename: str = "curves.png", x: str = "step",
             title: str | None = None) -> pathlib.Path:
        """One panel per metric in ``keys`` against ``x``, from metrics.jsonl."""
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
        out = self.path / filename
        fig.savefig(out, dpi=100)
        plt.close(fig)
        return out

    def write_table(self, name: str, rows: list[dict]) -> str:
        """Write ``name.md`` and ``name.csv``; returns the markdown."""
        cols = list(dict.fromkeys(k for r in rows for k in r))
        fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
        md = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
        md += "".join("| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |\n" for r in rows)
        (self.path / f"{name}.md").write_text(md)
        csv = ",".join(cols) + "\n" + "".join(",".join(fmt(r.get(c, "")) for c in cols) + "\n" for r in rows)
        (self.path / f"{name}.csv").write_text(csv)
        return md

    def save_json(self, name: str, obj: Any) -> pathlib.Path:
        out = self.path / (name if name.endswith(".json") else f"{name}.json")
        out.write_text(json.dumps(config_to_dict(obj), indent=2, default=float))
        return out

    def checkpointer(self, interval: int = 1, max_to_keep: int = 3) -> Checkpointer:
        if self._checkpointer is None:
            self._checkpointer = Checkpointer(self.path / "checkpoints", interval, max_to_keep)
        return self._checkpointer

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
