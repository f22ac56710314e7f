"""Measured figures as records: one JSON file per claim, the single source of every figure the docs quote.

A record is ``docs/records/<claim>.json``::

    {"claim": "grpo_main_job", "title": "...", "figures": [{"name", "value", "se", "n", "unit"?}, ...],
     "command": "jaxrl-reason run grpo", "commit": "f9f1733", "machine": "...", "date": "2026-12-05",
     "status": "current" | "older", "note": "...", "source"?: "transcribed from docs/results.md at <commit>"}

``status`` is ``"older"`` when the figure was measured before a change that may move it (the note says which).
Commands write records (``jaxrl-reason run X --record PATH``, ``write_record``); pages quote them in generated
blocks between ``<!-- records: claim_a claim_b -->`` and ``<!-- /records -->``, which
``python -m jaxrl_reason.utils.records docs/`` regenerates (``--check``: exit 1 when a page differs).
``python -m jaxrl_reason.utils.records seeds OUT CLAIM FIGURE RUN.json ...`` writes one record of a figure over
several seeds' records (each run's figure and their mean with its SE over seeds: ``over_seeds``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import platform
import re
import subprocess
import sys

STATUSES = ("current", "older")
REQUIRED = ("claim", "title", "figures", "command", "commit", "machine", "date", "status")
BLOCK = re.compile(r"(<!-- records: ([\w\s-]*?) -->\n).*?(<!-- /records -->)", re.DOTALL)


class RecordError(ValueError):
    """A record that does not parse or lacks a field, or a page block naming an unknown claim."""


def git_commit(cwd: str | os.PathLike | None = None) -> str:
    """``git rev-parse --short HEAD``, with ``-dirty`` when the tree has uncommitted changes; ``unknown`` outside
    a git checkout."""
    try:
        run = lambda *a: subprocess.run(["git", *a], cwd=cwd, capture_output=True, text=True, check=True).stdout
        return run("rev-parse", "--short", "HEAD").strip() + ("-dirty" if run("status", "--porcelain").strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def describe_machine() -> str:
    """This machine in one line: platform, CPU count, jax version and devices."""
    import jax

    devices = sorted({f"{d.platform}:{getattr(d, 'device_kind', '')}" for d in jax.devices()})
    return (f"{platform.platform()}, {os.cpu_count()} CPUs, jax {jax.__version__}, "
            f"{jax.device_count()} devices ({', '.join(devices)})")


def check_figure(fig: dict) -> dict:
    """A figure ``{"name", "value", "se", "n", "unit"?}``: name a string, value a number, se a number or None,
    n an int or None."""
    if not isinstance(fig.get("name"), str) or not isinstance(fig.get("value"), (int, float)) \
            or isinstance(fig.get("value"), bool):
        raise RecordError(f"a figure needs a string name and a numeric value, got {fig}")
    if not (fig.get("se") is None or isinstance(fig["se"], (int, float))) or \
            not (fig.get("n") is None or isinstance(fig["n"], int)):
        raise RecordError(f"figure {fig['name']!r}: se must be a number or null, n an int or null")
    return {"name": fig["name"], "value": fig["value"], "se": fig.get("se"), "n": fig.get("n"),
            **({"unit": fig["unit"]} if fig.get("unit") else {})}


def summary_figures(summary: dict, prefix: str = "") -> list[dict]:
    """Every scalar of a run's summary as a figure (nested dicts as ``a/b``; no SE or n): the record of an
    experiment without a ``record(summary)`` hook."""
    out = []
    for key, value in summary.items():
        if isinstance(value, dict):
            out += summary_figures(value, f"{prefix}{key}/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append({"name": f"{prefix}{key}", "value": value, "se": None, "n": None})
    return out


def write_record(path: str | os.PathLike, claim: str, figures: list[dict], *, title: str | None = None,
                 command: str | None = None, commit: str | None = None, machine: str | None = None,
                 date: str | None = None, status: str = "current", note: str = "", **extra) -> dict:
    """Write a record to ``path`` and return it. Unset fields are measured here: command = ``sys.argv`` joined,
    commit = :func:`git_commit`, machine = :func:`describe_machine`, date = today; the title defaults to that of
    the record already at ``path`` (a rerun keeps it), else the claim. ``extra`` keys (e.g. ``source``) are stored
    as given."""
    if status not in STATUSES:
        raise RecordError(f"status must be one of {STATUSES}, got {status!r}")
    path = pathlib.Path(path)
    old = json.loads(path.read_text()) if path.is_file() else {}
    record = {"claim": claim, "title": title or old.get("title") or claim,
              "figures": [check_figure(f) for f in figures],
              "command": command or " ".join(sys.argv), "commit": commit or git_commit(),
              "machine": machine or describe_machine(), "date": date or datetime.date.today().isoformat(),
              "status": status, "note": note, **extra}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    return record


def read_records(folder: str | os.PathLike) -> dict[str, dict]:
    """Every ``*.json`` record of ``folder`` by claim, checked: the required fields, a known status, figures."""
    out = {}
    for path in sorted(pathlib.Path(folder).glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise RecordError(f"{path}: not JSON ({err})") from None
        missing = [k for k in REQUIRED if record.get(k) in (None, "")]
        if missing or record["status"] not in STATUSES or record["claim"] != path.stem:
            raise RecordError(f"{path}: missing {missing}, status {record.get('status')!r} or claim != file name")
        record["figures"] = [check_figure(f) for f in record["figures"]]
        out[record["claim"]] = record
    return out


def fmt(value: float | None, like: float | None = None) -> str:
    """A figure's number as the docs write it: thousands separated from 10,000, else 4 significant digits; an SE
    with as many decimals as its value (``like``): 0.316 ± 0.010."""
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    decimals = len(repr(like).split(".")[1]) if isinstance(like, float) and "e" not in repr(like) else 0
    if decimals and abs(like) < 10_000 and repr(like) != "0.0":
        return f"{value:.{decimals}f}"
    return f"{value:,.0f}" if abs(value) >= 10_000 else f"{value:.4g}"


def render_table(records: list[dict]) -> str:
    """A markdown table, one row per figure (the claim, command and status on its first row), then each note."""
    lines = ["| claim | figure | value ± SE | n | status | command |", "|---|---|---|---|---|---|"]
    for r in records:
        for i, f in enumerate(r["figures"]):
            value = fmt(f["value"]) + (f" ± {fmt(f['se'], like=f['value'])}" if f["se"] is not None else "")
            value += {None: "", "x": "x", "%": "%"}.get(f.get("unit"), f" {f.get('unit')}")
            first = (r["title"], f"{r['status']} ({r['commit']}, {r['date']})", f"`{r['command']}`") if i == 0 \
                else ("", "", "")
            lines.append(f"| {first[0]} | {f['name']} | {value} | {f['n'] if f['n'] is not None else '-'} "
                         f"| {first[1]} | {first[2]} |")
    notes = [f"- {r['title']}: {r['note']}" for r in records if r.get("note")]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def update_page(page_path: str | os.PathLike, records: dict[str, dict], check: bool = False) -> bool:
    """Regenerate every records block of a page from ``records``; True when the page changed (with ``check``,
    True when it would change, and nothing is written)."""
    page = pathlib.Path(page_path)
    text = page.read_text()

    def block(m: re.Match) -> str:
        unknown = [c for c in m.group(2).split() if c not in records]
        if unknown:
            raise RecordError(f"{page}: records block names unknown claims {unknown}")
        return f"{m.group(1)}\n{render_table([records[c] for c in m.group(2).split()])}\n{m.group(3)}"

    new = BLOCK.sub(block, text)
    if new != text and not check:
        page.write_text(new)
    return new != text


def over_seeds(runs: list[dict], figure: str) -> list[dict]:
    """One figure of several runs (records of one command at different seeds) -> that figure per run (its own SE and
    n) and their mean with its SE over runs (sample standard deviation / sqrt(k), n = k runs)."""
    found = [[f for f in r["figures"] if f["name"] == figure] for r in runs]
    if len(runs) < 2 or not all(found):
        raise RecordError(f"over_seeds: needs >= 2 records that all hold the figure {figure!r}")
    values = [f[0]["value"] for f in found]
    k, mean = len(values), sum(values) / len(values)
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (k - 1) / k)
    unit = {"unit": found[0][0]["unit"]} if found[0][0].get("unit") else {}
    return [{**f[0], "name": f"{figure}, run {i}"} for i, f in enumerate(found)] + \
        [{"name": f"mean {figure} over {k} runs", "value": round(mean, 6), "se": round(se, 6), "n": k, **unit}]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["seeds"]:  # python -m jaxrl_reason.utils.records seeds OUT CLAIM FIGURE RUN.json ...
        seeds = argparse.ArgumentParser(prog="python -m jaxrl_reason.utils.records seeds",
                                        description="one record of a figure over several seeds' records")
        seeds.add_argument("out")
        seeds.add_argument("claim")
        seeds.add_argument("figure", help="the figure's name in every run's record (e.g. 'gain')")
        seeds.add_argument("runs", nargs="+", help="the runs' records, in seed order")
        seeds.add_argument("--note", default="")
        a = seeds.parse_args(argv[1:])
        runs = [json.loads(pathlib.Path(p).read_text()) for p in a.runs]
        commits = sorted({r["commit"] for r in runs})
        write_record(a.out, a.claim, over_seeds(runs, a.figure), commit=", ".join(commits), machine=runs[0]["machine"],
                     command=" ; ".join(r["command"] for r in runs), note=a.note)
        return 0
    parser = argparse.ArgumentParser(prog="python -m jaxrl_reason.utils.records",
                                     description="regenerate the records blocks of markdown pages; "
                                     "'seeds OUT CLAIM FIGURE RUN.json ...' combines seeds' records")
    parser.add_argument("paths", nargs="+", help="markdown files or folders (searched recursively)")
    parser.add_argument("--records", default="docs/records", help="the records folder (default docs/records)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page differs")
    args = parser.parse_args(argv)
    records = read_records(args.records)
    pages = [p for a in map(pathlib.Path, args.paths) for p in (sorted(a.rglob("*.md")) if a.is_dir() else [a])]
    changed = [str(p) for p in pages if update_page(p, records, check=args.check)]
    for p in changed:
        print(f"{'differs from its records' if args.check else 'regenerated'}: {p}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
