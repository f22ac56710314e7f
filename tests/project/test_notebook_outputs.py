"""Static checks of the stored notebooks (issue #33 item 3): nothing is executed here.

Every notebook in notebooks/ is stored with its outputs, so its plots show on GitHub: every code cell
has run, in order, in one kernel; a notebook whose code plots with matplotlib (``plt.``) has at least one
``image/png`` output; and each has enough markdown to teach (what it shows, why, what to change).
The notebooks themselves are executed at small settings by their own tests (tests/nbutil.py).
"""

from __future__ import annotations

import json
import pathlib
import re

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
MIN_WORDS = 150
MAX_BYTES = 1_500_000


def _load(path):
    return json.loads(path.read_text())


def _src(cell):
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def test_notebooks_exist():
    assert len(NOTEBOOKS) >= 13, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_stored_with_outputs(path):
    nb = _load(path)
    code = [c for c in nb["cells"] if c["cell_type"] == "code" and _src(c).strip()]
    counts = [c.get("execution_count") for c in code]
    assert all(isinstance(n, int) for n in counts), f"{path.name}: unexecuted code cells (execution_count {counts})"
    assert counts == sorted(counts) and len(set(counts)) == len(counts), f"{path.name}: cells not run in order: {counts}"
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: stored error output {errors[0].get('ename')}"
    if any("plt." in _src(c) for c in code):
        pngs = [o for c in code for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
        assert pngs, f"{path.name}: plots with matplotlib but stores no image/png output"
    assert path.stat().st_size < MAX_BYTES, f"{path.name}: {path.stat().st_size} bytes"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_prose(path):
    nb = _load(path)
    words = sum(len(re.findall(r"\S+", _src(c))) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert words >= MIN_WORDS, f"{path.name}: {words} words of markdown (want >= {MIN_WORDS})"
    first = next(c for c in nb["cells"] if c["cell_type"] == "markdown")
    assert _src(first).lstrip().startswith("#"), f"{path.name}: the first markdown cell should be a title"
