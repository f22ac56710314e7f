"""TicTacToe as one game package: ``rules`` (the environment), ``text`` (LM prompts / answers), ``expert``
(the perfect minimax player, the warm-start expert); ``SPEC`` registers it (``envs.games``).

Teacher rationale: the free cells."""

import numpy as np

from jaxrl_reason.envs.games.spec import GameSpec
from jaxrl_reason.envs.games.tictactoe.expert import (
    board_index,
    minimax_action,
    minimax_q,
    minimax_table,
)
from jaxrl_reason.envs.games.tictactoe.rules import (
    FULL,
    LINES,
    TicTacToe,
    TicTacToeState,
    bits_to_cells,
    coin_flips,
    has_line,
)
from jaxrl_reason.envs.games.tictactoe.text import TicTacToeText


def _free_cells(env, state, player, legal) -> str:
    return "Free " + "".join(str(i) for i in np.flatnonzero(legal)) + "."


SPEC = GameSpec(name="tictactoe", env=TicTacToe, text=TicTacToeText, opponents={"minimax": lambda env: minimax_action},
                expert="minimax", rationale=_free_cells)

__all__ = ["FULL", "LINES", "SPEC", "TicTacToe", "TicTacToeState", "TicTacToeText", "bits_to_cells", "board_index",
           "coin_flips", "has_line", "minimax_action", "minimax_q", "minimax_table"]
