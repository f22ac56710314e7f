"""Environment registry: ``make(name, **kwargs)`` with clear errors.

The environments of ``jaxrl_reason.envs`` are listed here as ``"module:ClassName"`` strings,
imported on first use, so importing ``jaxrl_reason.envs`` stays cheap and one broken environment
cannot break the rest. An environment defined elsewhere registers itself with ``register`` when
its own package is imported (``jaxrl_reason.solvers`` registers ``fgmres_blocksize``; the two-player
games register through ``envs.games.register_game``, imported with ``jaxrl_reason.envs``), so this
layer names none of its users.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Callable

from jaxrl_reason.envs.core import Environment

#: name -> ``"module:ClassName"`` (imported on first use) or a factory ``(**kwargs) -> Environment``
_REGISTRY: dict[str, str | Callable[..., Environment]] = {
    "catch": "jaxrl_reason.envs.catch:Catch",
    "hanabi": "jaxrl_reason.envs.hanabi:Hanabi",
    "swarm": "jaxrl_reason.envs.swarm:Swarm",
}


def register(name: str, target: str | Callable[..., Environment], *, overwrite: bool = False) -> None:
    """Register ``target`` under ``name``: an ``Environment`` class, ``"module:ClassName"`` (imported
    by the first ``make``), or any factory ``(**kwargs) -> Environment``. Registering the same
    target again is a no-op (a module may be imported twice); another target needs ``overwrite``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"environment name must be a non-empty string, got {name!r}")
    if isinstance(target, type):
        target = f"{target.__module__}:{target.__qualname__}"
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        if not module or not attr or ":" in attr:
            raise ValueError(f"register({name!r}, {target!r}): a string target must be 'module:ClassName'")
    elif not callable(target):
        raise TypeError(f"register({name!r}, ...): target must be a class, 'module:ClassName' or a factory, "
                        f"got {type(target).__name__}")
    if name in _REGISTRY and _REGISTRY[name] != target and not overwrite:
        raise ValueError(f"environment {name!r} is already registered as {_REGISTRY[name]!r}; pass overwrite=True")
    _REGISTRY[name] = target


def registered_names() -> list[str]:
    """Sorted names accepted by ``make`` (those registered so far: see ``register``)."""
    return sorted(_REGISTRY)


def env_class(name: str) -> Callable[..., Environment]:
    """The class (or factory) registered under ``name``."""
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown environment {name!r}; registered environments: {', '.join(registered_names())}. "
            "An environment defined outside jaxrl_reason.envs is registered when its module is imported "
            "(envs.register): import that package first."
        )
    target = _REGISTRY[name]
    if not isinstance(target, str):
        return target
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def make(name: str, **kwargs) -> Environment:
    """Build a registered environment, rejecting unknown names and keyword arguments."""
    factory = env_class(name)
    params = inspect.signature(factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return factory(**kwargs)  # checks its own keyword arguments
    accepted = list(params)
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise TypeError(
            f"make({name!r}) got unknown argument(s) {unknown}; "
            f"accepted: {', '.join(accepted) or '(none)'}"
        )
    return factory(**kwargs)
