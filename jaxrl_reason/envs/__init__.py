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
