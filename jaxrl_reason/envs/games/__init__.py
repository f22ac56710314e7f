"""Two-player zero-sum games (SPIRAL's self-play games) on the Environment protocol, and their registry.

``GAMES``: name -> ``GameSpec`` (``spec``: rules, text interface, fixed players, warm-start expert and
rationale, exact evaluations). A game registers once, with one ``register_game`` line below, which also
registers its environment for ``envs.make(name)``. ``text`` renders any game as byte-level prompts
inside jit and parses ``\\boxed{...}`` answers; ``opponents`` has random / minimax / heuristic players
and Kuhn Poker exact exploitability; ``arena`` plays matches.
"""

from jaxrl_reason.envs.games import builtin, liars_dice
from jaxrl_reason.envs.games.kuhn_poker import KuhnPoker
from jaxrl_reason.envs.games.negotiation import Negotiation
from jaxrl_reason.envs.games.spec import GameSpec
from jaxrl_reason.envs.games.tictactoe import TicTacToe
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


register_game(builtin.TICTACTOE)
register_game(builtin.KUHN_POKER)
register_game(builtin.NEGOTIATION)
register_game(liars_dice.SPEC)

__all__ = ["GAMES", "GameSpec", "KuhnPoker", "Negotiation", "TicTacToe", "game_spec", "register_game"]
