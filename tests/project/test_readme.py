"""README.md: at most 1,500 words, and its examples and short commands run as written (the checkpoint and data
paths they name are a tiny checkpoint and a tiny JSONL file made here)."""

import json
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


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A tiny Qwen3 checkpoint (byte-level BPE with the start's ChatML template) at path/to/checkpoint and a
    16-row train.jsonl with question / answer fields, in a fresh directory."""
    pytest.importorskip("transformers")  # the hf extra (installed in CI)
    from testutil import tiny_hf_checkpoint

    from jaxrl_reason.models.tokenizer import HFTokenizer
    from jaxrl_reason.rl.grpo.start import CHATML, SPECIAL

    root = tmp_path_factory.mktemp("readme")
    rows = [{"question": f"What is {a}+{b}?", "answer": str(a + b)} for a in range(4) for b in range(4)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    texts = [r["question"] + " <answer>" + r["answer"] + "</answer>" for r in rows] * 4
    tok = HFTokenizer.train_bpe(texts, 300, SPECIAL, eos="<|im_end|>", pad="<pad>", bos="<bos>", chat_template=CHATML)
    tiny_hf_checkpoint(root / "path" / "to" / "checkpoint", tok, max_positions=128)
    return root


PYTHON = re.findall(r"```python\n(.*?)```", README, flags=re.S)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(PYTHON)))
def test_readme_python_examples_run(workdir, index):
    out = subprocess.run([sys.executable, "-c", PYTHON[index]], cwd=workdir, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.parametrize("command", ["jaxrl-reason list", "jaxrl-reason run grpo --help"])
def test_readme_short_commands_run(command):
    assert f"`{command}" in README.replace("`jaxrl-reason run X --help`", "`jaxrl-reason run grpo --help`")
    out = subprocess.run([sys.executable, "-m", "jaxrl_reason.cli", *command.split()[1:]], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and "grpo" in out.stdout, out.stderr[-3000:]
