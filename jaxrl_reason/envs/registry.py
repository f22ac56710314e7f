"""Environment registry: ``make(name, **kwargs)`` with clear errors.

Entries are ``"module:ClassName"`` strings imported on first use, so importing
``jaxrl_reason.envs`` stays cheap and one broken environment cannot break the rest.
"""

from __future__ import annotations

import importlib
import inspect

from jaxrl_reason.envs.core import Environment

_REGISTRY: dict[str, str] = {
    "catch": "jaxrl_reason.envs.catch:Catch",
    "fgmres_blocksize": "jaxrl_reason.solvers.blocksize_env:BlockSizeEnv",
    "hanabi": "jaxrl_reason.envs.hanabi:Hanabi",
    "tictactoe": "jaxrl_reason.envs.games.tictactoe:TicTacToe",
    "kuhn_poker": "jaxrl_reason.envs.games.kuhn_poker:KuhnPoker",
    "negotiation": "jaxrl_reason.envs.games.negotiation:Negotiation",
    "swarm": "jaxrl_reason.envs.swarm:Swarm",
}


def register(name: str, target: str | type[Environment], *, overwrite: bool = False) -> None:
    """Register ``target`` (a class or ``"module:ClassName"``) under ``name``."""
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"environment {name!r} is already registered; pass overwrite=True")
    if isinstance(target, type):
        target = f"{target.__module__}:{target.__qualname__}"
    _REGISTRY[name] = target


def registered_names() -> list[str]:
    """Sorted names accepted by ``make``."""
    return sorted(_REGISTRY)


def env_class(name: str) -> type[Environment]:
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown environment {name!r}; registered environments: {', '.join(registered_names())}"
        )
    module_name, class_name = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def make(name: str, **kwargs) -> Environment:
    """Build a registered environment, rejecting unknown names and keyword arguments."""
    cls = env_class(name)
    params = inspect.signature(cls.__init__).parameters
    accepted = [p for p in params if p != "self"]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise TypeError(
            f"make({name!r}) got unknown argument(s) {unknown}; "
            f"accepted: {', '.join(accepted) or '(none)'}"
        )
    return cls(**kwargs)
