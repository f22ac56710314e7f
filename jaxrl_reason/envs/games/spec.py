"""``GameSpec``: everything a two-player game offers its users, declared once by the game.

A spec names the game's environment class (the rules), its text interface for LM players, its fixed
players (``opponents``: ``name -> (env -> act(key, state, ts) -> action)`` on one unbatched game, as in
``envs.games.opponents``; ``"random"`` always), which of them is the *expert* (SPIRAL's warm-start
teacher imitates it), the teacher's short rationale sentence, and exact evaluation hooks where the
game has them (``evaluations``: e.g. Kuhn Poker's exploitability of a policy table). SPIRAL, self-play,
AlphaZero and the arena read the spec (``envs.games.GAMES[name]``) instead of dispatching on names.

    spec = GAMES["kuhn_poker"]
    env = spec.make_env()                       # envs.make(name) builds the same
    text = spec.make_text(env, "compact")       # envs.games.text.GameText
    act = spec.opponent("nash", env)            # act(key, state, ts) -> int32 action
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax

from jaxrl_reason.envs.core import Environment
from jaxrl_reason.envs.registry import make
from jaxrl_reason.envs.games.opponents import random_action

#: a fixed player on one unbatched game: ``act(key, state, ts) -> int32 action``
Player = Callable[[jax.Array, Any, Any], jax.Array]


def _random(env) -> Player:
    del env
    return random_action


@dataclasses.dataclass(frozen=True)
class GameSpec:
    """A registered game (``envs.games.register_game``).

    ``env``: the environment class (``(**kwargs) -> Environment``); ``text``: ``(env, style) -> GameText``;
    ``opponents``: fixed players built from the env (``"random"`` is added); ``expert``: the name of the
    warm-start teacher's expert among them; ``rationale(env, state, player, legal [A]) -> str``: the
    teacher's sentence before its boxed answer (host side, one game); ``evaluations``: exact evaluation
    functions (name -> function; documented by the game)."""

    name: str
    env: type
    text: Callable[..., Any]
    opponents: Mapping[str, Callable[[Environment], Player]]
    expert: str
    rationale: Callable[..., str]
    evaluations: Mapping[str, Callable] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"GameSpec: name must be a non-empty string, got {self.name!r}")
        object.__setattr__(self, "opponents", {"random": _random, **self.opponents})
        if self.expert not in self.opponents:
            raise ValueError(f"GameSpec {self.name!r}: expert {self.expert!r} is not among its opponents "
                             f"{tuple(self.opponents)}")

    def make_env(self, **kwargs) -> Environment:
        """The game's environment (the same as ``envs.make(name, **kwargs)``)."""
        return make(self.name, **kwargs)

    def make_text(self, env, style: str = "verbose"):
        """The text interface of ``env`` (this game's, wrappers allowed) in prompt ``style``."""
        while not isinstance(env, self.env) and hasattr(env, "env"):
            env = env.env
        if not isinstance(env, self.env):
            raise ValueError(f"{env!r} is not a {self.env.__name__} ({self.name})")
        return self.text(env, style)

    def opponent(self, name: str, env) -> Player:
        """The fixed player ``name`` of ``env`` (ValueError naming the available ones)."""
        if name not in self.opponents:
            raise ValueError(f"opponent {name!r} not available for {self.name}; choose from {tuple(self.opponents)}")
        return self.opponents[name](env)

    def expert_player(self, env) -> Player:
        return self.opponent(self.expert, env)
