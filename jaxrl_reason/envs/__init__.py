"""Environments on one protocol: ``envs.make(name, **kwargs)``; see docs/design.md."""

from jaxrl_reason.envs.core import (
    ILLEGAL_ACTION_RULES,
    Environment,
    Observation,
    SplitEnvironment,
    TimeStep,
    Transition,
    illegal_action_outcome,
    random_legal_action,
)
from jaxrl_reason.envs.registry import env_class, make, register, registered_names
from jaxrl_reason.envs.wrappers import AutoReset, EpisodeStats, Wrapper
from jaxrl_reason.envs import games as _games  # noqa: E402,F401  (registers the two-player games: envs.games.GAMES)

__all__ = [
    "ILLEGAL_ACTION_RULES",
    "AutoReset",
    "Environment",
    "EpisodeStats",
    "Observation",
    "SplitEnvironment",
    "TimeStep",
    "Transition",
    "Wrapper",
    "env_class",
    "illegal_action_outcome",
    "make",
    "random_legal_action",
    "register",
    "registered_names",
]
