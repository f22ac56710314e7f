"""Simple Negotiation as one game package: ``rules`` (the environment), ``text`` (LM prompts / answers),
``expert`` (the fixed heuristic, the warm-start expert); ``SPEC`` registers it (``envs.games``).

Teacher rationale: the own values."""

import numpy as np

from jaxrl_reason.envs.games.negotiation.expert import heuristic_action, offer_gains
from jaxrl_reason.envs.games.negotiation.rules import (
    ACCEPT,
    DENY,
    FIRST_OFFER,
    HIGH_VALUES,
    LOW_VALUES,
    RESOURCE_NAMES,
    Negotiation,
    NegotiationState,
)
from jaxrl_reason.envs.games.negotiation.text import NegotiationText
from jaxrl_reason.envs.games.spec import GameSpec


def _own_values(env, state, player, legal) -> str:
    v = np.asarray(state.values)[player]
    return f"Wood {int(v[0])} gold {int(v[1])}."


SPEC = GameSpec(name="negotiation", env=Negotiation, text=NegotiationText, opponents={"heuristic": heuristic_action},
                expert="heuristic", rationale=_own_values)

__all__ = ["ACCEPT", "DENY", "FIRST_OFFER", "HIGH_VALUES", "LOW_VALUES", "RESOURCE_NAMES", "SPEC", "Negotiation",
           "NegotiationState", "NegotiationText", "heuristic_action", "offer_gains"]
