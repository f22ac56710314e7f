"""Two-player zero-sum games (SPIRAL's self-play games) on the Environment protocol.

``tictactoe``, ``kuhn_poker`` and ``negotiation`` (``envs.make(name)``); ``text`` renders any of
them as byte-level prompts inside jit and parses ``\\boxed{...}`` answers; ``opponents`` has
random / minimax / heuristic players and Kuhn Poker exact exploitability; ``arena`` plays matches.
"""

from jaxrl_reason.envs.games.kuhn_poker import KuhnPoker
from jaxrl_reason.envs.games.negotiation import Negotiation
from jaxrl_reason.envs.games.tictactoe import TicTacToe

__all__ = ["KuhnPoker", "Negotiation", "TicTacToe"]
