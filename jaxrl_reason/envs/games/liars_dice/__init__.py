"""Liar's Dice as one game package: ``rules`` (the environment), ``text`` (LM prompts / answers),
``expert`` (the heuristic player and warm-start expert); ``SPEC`` registers it (``envs.games``)."""

import numpy as np

from jaxrl_reason.envs.games.liars_dice.expert import bid_probs, heuristic_action
from jaxrl_reason.envs.games.liars_dice.rules import LiarsDice, LiarsDiceState
from jaxrl_reason.envs.games.liars_dice.text import LiarsDiceText
from jaxrl_reason.envs.games.spec import GameSpec


def _own_dice(env, state, player, legal) -> str:
    return "I hold " + " ".join(str(int(d) + 1) for d in np.asarray(state.dice)[player]) + "."


SPEC = GameSpec(name="liars_dice", env=LiarsDice, text=LiarsDiceText, opponents={"heuristic": heuristic_action},
                expert="heuristic", rationale=_own_dice)

__all__ = ["SPEC", "LiarsDice", "LiarsDiceState", "LiarsDiceText", "bid_probs", "heuristic_action"]
