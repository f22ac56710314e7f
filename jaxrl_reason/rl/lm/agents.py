"""A user's agent from a file: ``load_agent_factory("path/to/file.py:make_agent")`` -> the function, which the
``agent`` experiment calls as ``make_agent(graphdef, tokenizer) -> agent`` (an object with ``rollout``, or a rollout
function: ``rl.lm.learner``'s docstring). The file is imported as a module of its own (not from the package)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from typing import Callable


def resolve(path: str) -> pathlib.Path:
    """``path`` as given (relative to the working directory), else relative to the checkout the package sits in
    (so ``examples/...`` works from anywhere in a clone)."""
    given = pathlib.Path(path).expanduser()
    if given.exists() or given.is_absolute():
        return given
    beside = pathlib.Path(__file__).resolve().parents[3] / path
    return beside if beside.exists() else given


def load_agent_factory(spec: str) -> Callable:
    """``"FILE.py:NAME"`` -> the callable ``NAME`` of ``FILE.py``; a clear ``ValueError`` for a malformed spec, a
    missing file or name, or a name that is not callable."""
    file, sep, name = spec.rpartition(":")
    if not sep or not file or not name.isidentifier():
        raise ValueError(f"--rollout must be FILE.py:NAME (e.g. examples/copy_letter.py:make_agent), got {spec!r}")
    path = resolve(file)
    if not path.is_file():
        raise ValueError(f"--rollout: no file {file!r} (looked at {path})")
    module_name = f"jaxrl_reason_user_{path.stem}_{abs(hash(str(path.resolve())))}"
    module = sys.modules.get(module_name)
    if module is None:
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module  # dataclasses and pickling look their module up by name
        loader_spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"--rollout: {path} has no function {name!r}"
                         f"{'' if fn is None else f' ({name} is a {type(fn).__name__})'}")
    return fn


__all__ = ["load_agent_factory", "resolve"]
