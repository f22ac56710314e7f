"""The documentation site (mkdocs.yml, docs/): every public module has an API entry, ``mkdocs build
--strict`` passes (no broken link, no unresolved docstring reference), and nothing in the repository
points at files outside it."""

from __future__ import annotations

import ast
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = REPO / "jaxrl_reason"
API_DIR = REPO / "docs" / "api"
ENTRY = re.compile(r"^:::\s+([\w.]+)\s*$", re.MULTILINE)


def _exports_something(init: pathlib.Path) -> bool:
    """A package ``__init__`` with anything besides its docstring (imports, ``__all__``, definitions)."""
    body = ast.parse(init.read_text()).body
    return any(not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)) for n in body)


def public_modules() -> set[str]:
    """Every ``.py`` under jaxrl_reason/ whose name does not start with ``_``, and every package
    ``__init__`` that exports something, as dotted module names; but the experiment scripts
    (``jaxrl_reason/experiments/``: ``jaxrl-reason list`` and each one's ``--help`` document them)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(REPO)
        if "__pycache__" in rel.parts or any(p.startswith("_") for p in rel.parts[:-1]):
            continue
        if rel.parts[:2] == ("jaxrl_reason", "experiments"):
            continue
        if path.name == "__init__.py":
            if _exports_something(path):
                found.add(".".join(rel.parts[:-1]))
        elif not path.name.startswith("_"):
            found.add(".".join(rel.with_suffix("").parts))
    return found


def api_entries() -> dict[str, str]:
    """``{module: page}`` for every ``::: module`` line of docs/api/*.md."""
    entries = {}
    for page in sorted(API_DIR.glob("*.md")):
        for name in ENTRY.findall(page.read_text()):
            entries[name] = page.name
    return entries


def test_every_public_module_has_an_api_entry():
    modules = public_modules()
    assert "jaxrl_reason.envs.core" in modules and "jaxrl_reason.envs" in modules  # the walk itself works
    entries = api_entries()
    missing = sorted(modules - set(entries))
    assert not missing, f"public modules without a '::: module' entry in docs/api/*.md: {missing}"
    unknown = sorted(name for name in entries if not _module_path(name).exists())
    assert not unknown, f"docs/api entries naming no module of the package: {unknown}"


def _module_path(name: str) -> pathlib.Path:
    base = REPO.joinpath(*name.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    if shutil.which("mkdocs") is None and importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    for plugin in ("material", "mkdocstrings", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(plugin.split(".")[0]) is None:
            pytest.skip(f"{plugin} is not installed (pip install -e '.[docs]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, env=env, timeout=300,
    )
    log = out.stdout + out.stderr
    warnings = [line for line in log.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
    assert out.returncode == 0 and not warnings, "mkdocs build --strict failed:\n" + "\n".join(warnings or [log[-4000:]])
    assert (tmp_path / "site" / "api" / "envs" / "index.html").exists()


#: References to files that live outside the repository: the workspace's shared folder and the
#: design / benchmark notes it held (now docs/design.md and docs/benchmarks.md, anchors in
#: experiments/anchors/). ``mlp/shared/...`` (a parameter path) is not a reference.
OUTSIDE = re.compile(r"(?:\.\./|/work/|(?<![\w/.-]))shared/|\b(?:DESIGN|BENCHMARKS|PAPERS)\.md\b|mission-seed")
SCANNED = ["jaxrl_reason", "experiments", "docs", "notebooks", "README.md", "mkdocs.yml", "pyproject.toml"]
TEXT_SUFFIXES = {".py", ".md", ".ipynb", ".yml", ".yaml", ".toml", ".txt", ".json", ".cfg", ".ini"}


def _scanned_files():
    for name in SCANNED:
        path = REPO / name
        if path.is_file():
            yield path
        elif path.is_dir():
            for f in sorted(path.rglob("*")):
                if f.is_file() and f.suffix in TEXT_SUFFIXES and "__pycache__" not in f.parts:
                    yield f


def test_outside_reference_pattern():
    for bad in ("see DESIGN.md", "``shared/anchors/bench_gmres.py``", "../shared/DESIGN.md", "shared BENCHMARKS.md",
                "/work/shared/anchors"):
        assert OUTSIDE.search(bad), bad
    for fine in ('add(f"mlp/shared/{p}/kernel", ...)', "docs/design.md", "docs/benchmarks.md",
                 "experiments/anchors/bench_gmres.py", "shared weights", "parameter-shared"):
        assert not OUTSIDE.search(fine), fine


def test_nothing_points_outside_the_repository():
    hits = []
    for path in _scanned_files():
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{path.relative_to(REPO)}:{i}: {line.strip()[:160]}")
    assert not hits, "references to files outside the repository (use docs/design.md, docs/benchmarks.md, " \
                     "experiments/anchors/):\n" + "\n".join(hits)
