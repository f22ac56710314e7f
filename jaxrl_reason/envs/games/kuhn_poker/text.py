"""Kuhn Poker text interface (``envs.games.text.GameText``): actions answer ``\\boxed{check}``,
``\\boxed{bet}``, ``\\boxed{call}`` or ``\\boxed{fold}``."""

from __future__ import annotations

import jax.numpy as jnp

from jaxrl_reason.envs.games.kuhn_poker.rules import ACTION_NAMES, CARD_NAMES, KuhnPoker
from jaxrl_reason.envs.games.text import GameText, Slot, Template, check_style


def _short_history(text: str) -> str:
    """``"Player 0 checked, Player 1 bet"`` -> ``"P0 check, P1 bet"`` (compact Kuhn history)."""
    for long, short in (("Player ", "P"), ("checked", "check"), ("folded", "fold"), ("called", "call"),
                        ("no actions yet", "none")):
        text = text.replace(long, short)
    return text


class KuhnPokerText(GameText):
    action_strings = ACTION_NAMES
    _HISTORY_TEXT = (
        "no actions yet",
        "Player 0 checked",
        "Player 0 bet",
        "Player 0 checked, Player 1 bet",
        "Player 0 checked, Player 1 checked",
        "Player 0 bet, Player 1 folded",
        "Player 0 bet, Player 1 called",
        "Player 0 checked, Player 1 bet, Player 0 folded",
        "Player 0 checked, Player 1 bet, Player 0 called",
    )

    def __init__(self, env: KuhnPoker, style: str = "verbose"):
        legal = [Slot(f"legal{a}", ("", " " + n)) for a, n in enumerate(ACTION_NAMES)]
        if check_style(style) == "compact":
            self.template = Template([
                "Kuhn Poker. You are P", Slot("player", ("0", "1")), ", card ", Slot("card", CARD_NAMES),
                ".\nHistory: ", Slot("history", tuple(_short_history(h) + "." for h in self._HISTORY_TEXT)),
                "\nLegal:", *legal, "\nAnswer \\boxed{action}.\n",
            ])
        else:
            self.template = Template([
                "Kuhn Poker. Deck: J < Q < K; each player antes 1 chip and holds one card. Player 0 acts "
                "first: check or bet 1; facing a bet: call or fold. Higher card wins at showdown.\n"
                "You are Player ", Slot("player", ("0", "1")), ". Your card: ", Slot("card", CARD_NAMES),
                ".\nHistory: ", Slot("history", tuple(h + "." for h in self._HISTORY_TEXT)), "\nLegal actions:",
                *legal, "\nAnswer with \\boxed{action}.\n",
            ])
        super().__init__(env)

    def slot_values(self, state, player):
        card = jnp.where(player == 0, state.cards[0], state.cards[1])
        facing = (state.hist == 2) | (state.hist == 3)
        live = ~state.terminated & (state.current_player == player)
        legal = [live & ~facing, live & ~facing, live & facing, live & facing]
        vals = {"player": player, "card": card, "history": state.hist}
        vals.update({f"legal{a}": legal[a].astype(jnp.int32) for a in range(4)})
        return vals
