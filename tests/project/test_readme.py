"""README.md: at most 1,500 words, its links resolve and its short commands run as written (its ```python
examples run in tests/project/test_examples.py, with every other page's)."""

import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def test_readme_is_short():
    prose = re.sub(r"```.*?```", "", README, flags=re.S)  # code blocks are not words to read
    assert len(prose.split()) <= 1500, len(prose.split())


def test_readme_links_resolve():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if not target.startswith("http"):
            assert (REPO / target).exists(), target


@pytest.mark.parametrize("command", ["jaxrl-reason list", "jaxrl-reason run grpo --help"])
def test_readme_short_commands_run(command):
    assert f"`{command}" in README.replace("`jaxrl-reason run X --help`", "`jaxrl-reason run grpo --help`")
    out = subprocess.run([sys.executable, "-m", "jaxrl_reason.cli", *command.split()[1:]], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and "grpo" in out.stdout, out.stderr[-3000:]
