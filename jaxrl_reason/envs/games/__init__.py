"""Two-player zero-sum games (SPIRAL's self-play games) on the Environment protocol, and their registry.

A game is one package, ``envs.games.<name>/``: ``rules`` (the environment), ``text`` (its ``GameText``:
LM prompts and answers), ``expert`` (its fixed players, warm-start expert and exact evaluations) and
``SPEC`` (its ``GameSpec``) in its ``__init__``. ``GAMES``: name -> ``GameSpec``; a game registers once,
with one ``register_game`` line below, which also registers its environment for ``envs.make(name)``.
``game_text(env, style)`` is the text interface of any registered game's environment. Generic parts:
``spec`` (``GameSpec``), ``text`` (byte-level prompts rendered inside jit, ``\\boxed{...}`` answers
parsed), ``opponents`` (the random player, batching), ``arena`` (matches).
"""

from jaxrl_reason.envs.games import kuhn_poker, liars_dice, negotiation, tictactoe
from jaxrl_reason.envs.games.spec import GameSpec
from jaxrl_reason.envs.games.text import GameText
from jaxrl_reason.envs.registry import register

#: name -> spec, in registration order
GAMES: dict[str, GameSpec] = {}


def register_game(spec: GameSpec, *, overwrite: bool = False) -> GameSpec:
    """Add ``spec`` to ``GAMES`` and its environment class to ``envs.make`` under ``spec.name``."""
    if spec.name in GAMES and GAMES[spec.name] is not spec and not overwrite:
        raise ValueError(f"game {spec.name!r} is already registered; pass overwrite=True")
    register(spec.name, spec.env, overwrite=overwrite)
    GAMES[spec.name] = spec
    return spec


def game_spec(name: str) -> GameSpec:
    """The registered spec of ``name`` (ValueError listing the games)."""
    if name not in GAMES:
        raise ValueError(f"unknown game {name!r}; registered games: {', '.join(GAMES)}")
    return GAMES[name]


def game_text(env, style: str = "verbose") -> GameText:
    """The text interface of a registered game's environment (wrappers unwrapped) in prompt ``style``
    (``text.STYLES``): its ``GameSpec.text``."""
    base = env
    while True:
        for spec in GAMES.values():
            if isinstance(base, spec.env):
                return spec.make_text(base, style)
        if not hasattr(base, "env"):
            raise ValueError(f"no text interface for {env!r}; registered games: {', '.join(GAMES)}")
        base = base.env


register_game(tictactoe.SPEC)
register_game(kuhn_poker.SPEC)
register_game(negotiation.SPEC)
register_game(liars_dice.SPEC)

__all__ = ["GAMES", "GameSpec", "game_spec", "game_text", "register_game"]
