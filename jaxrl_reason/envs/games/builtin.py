"""The specs of TicTacToe, Kuhn Poker and Negotiation (``GameSpec``; registered in ``envs.games``).

Experts (SPIRAL's warm-start teachers): TicTacToe ``minimax`` (perfect play), Kuhn Poker ``nash``
(alpha = 1/6), Negotiation ``heuristic``. Teacher rationales: the free cells / the own card / the own
values. Kuhn Poker's ``evaluations`` act on a ``[3, 4]`` bet/call table: ``exploitability``,
``value_vs_random`` and ``value_vs_nash_p0`` (``envs.games.opponents``).
"""

from __future__ import annotations

import numpy as np

from jaxrl_reason.envs.games import opponents as O
from jaxrl_reason.envs.games.kuhn_poker import CARD_NAMES, KuhnPoker
from jaxrl_reason.envs.games.negotiation import Negotiation
from jaxrl_reason.envs.games.spec import GameSpec
from jaxrl_reason.envs.games.text import KuhnPokerText, NegotiationText, TicTacToeText
from jaxrl_reason.envs.games.tictactoe import TicTacToe


def _free_cells(env, state, player, legal) -> str:
    return "Free " + "".join(str(i) for i in np.flatnonzero(legal)) + "."


def _own_card(env, state, player, legal) -> str:
    return f"I hold {CARD_NAMES[int(state.cards[player])]}."


def _own_values(env, state, player, legal) -> str:
    v = np.asarray(state.values)[player]
    return f"Wood {int(v[0])} gold {int(v[1])}."


def _value_vs_nash_p0(pi):
    return O.kuhn_value(pi, O.kuhn_nash_policy(O.KUHN_TEACHER_ALPHA))


TICTACTOE = GameSpec(name="tictactoe", env=TicTacToe, text=TicTacToeText,
                     opponents={"minimax": lambda env: O.minimax_action}, expert="minimax", rationale=_free_cells)
KUHN_POKER = GameSpec(name="kuhn_poker", env=KuhnPoker, text=KuhnPokerText, opponents={"nash": O.kuhn_nash_action},
                      expert="nash", rationale=_own_card,
                      evaluations={"exploitability": O.kuhn_exploitability, "value_vs_random": O.kuhn_value_vs_uniform,
                                   "value_vs_nash_p0": _value_vs_nash_p0})
NEGOTIATION = GameSpec(name="negotiation", env=Negotiation, text=NegotiationText,
                       opponents={"heuristic": O.negotiation_heuristic_action}, expert="heuristic",
                       rationale=_own_values)
