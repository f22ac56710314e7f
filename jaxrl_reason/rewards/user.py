"""Your own reward functions by reference, checked before a run loads anything.

    fn = load_reward_fn("my_rewards.py:brevity")       # a file (relative to the working directory) : a name in it
    fn = load_reward_fn("my_package.rewards:brevity")  # an importable module : a name in it

The object named must follow the reward protocol (``rewards`` package docstring): a function or callable
instance ``fn(prompts, completions, *, completion_ids, step, **row_fields) -> B rewards``, sync or ``async``,
declaring only the keywords it uses (``**kwargs`` takes them all). Keyword parameters without a default that are
not ``step`` / ``completion_ids`` name row fields (``required_fields``: an experiment checks its data has them).
Anything else is a ``RewardError`` naming the reference and what is wrong; the file's
folder is put on ``sys.path`` so it can import its neighbours.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import pathlib
import sys

from jaxrl_reason.rewards.suite import RewardError, reward_call


def _module(where: str, ref: str):
    """The module of a reference: a ``.py`` file path, else an importable module name."""
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = pathlib.Path(where).expanduser().resolve()
        if not path.is_file():
            raise RewardError(f"reward function {ref!r}: no file {path}")
        return _load_file(str(path), ref)
    try:
        return importlib.import_module(where)
    except ImportError as e:
        raise RewardError(f"reward function {ref!r}: cannot import module {where!r} ({e}); give a .py file "
                          "path or a module on PYTHONPATH") from e


@functools.lru_cache(maxsize=None)
def _load_file(path: str, ref: str):
    folder = str(pathlib.Path(path).parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = "jaxrl_reason_user_reward_" + pathlib.Path(path).stem
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise RewardError(f"reward function {ref!r}: importing {path} raised {type(e).__name__}: {e}") from e
    sys.modules[name] = module
    return module


def required_fields(fn) -> tuple[str, ...]:
    """The keyword parameters ``fn`` needs besides (prompts, completions): those it declares without a default
    (e.g. ``answer`` in ``def f(prompts, completions, *, answer, step)``; ``step`` and ``completion_ids`` are the
    trainer's, the rest row fields an experiment checks its data for)."""
    try:
        return reward_call(fn).required
    except RewardError:
        return ()


def check_reward_signature(fn, ref: str) -> None:
    """``RewardError`` unless ``fn`` can be called as a reward (``rewards.suite.reward_call``): a function or
    callable instance taking (prompts, completions) first, or a ``completions`` keyword."""
    if isinstance(fn, type):
        raise RewardError(f"reward function {ref!r} is a class: name an instance of it, or a function")
    if not callable(fn):
        raise RewardError(f"reward function {ref!r} is a {type(fn).__name__}, not callable")
    reward_call(fn, ref)


def load_reward_fn(ref: str):
    """The reward function a ``"path/file.py:name"`` or ``"module:name"`` reference names, signature-checked."""
    where, sep, name = ref.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise RewardError(f"reward function {ref!r}: write it as path/to/file.py:function or module:function")
    module = _module(where, ref)
    if not hasattr(module, name):
        found = [k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                 and getattr(v, "__module__", None) == module.__name__]
        raise RewardError(f"reward function {ref!r}: {where} defines no {name!r} (it defines: "
                          f"{', '.join(found) or 'no functions'})")
    fn = getattr(module, name)
    check_reward_signature(fn, ref)
    return fn
