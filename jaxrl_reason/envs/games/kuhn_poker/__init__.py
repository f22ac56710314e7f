"""Kuhn Poker as one game package: ``rules`` (the environment), ``text`` (LM prompts / answers), ``expert``
(the Nash player, the warm-start expert, and exact evaluation: exploitability, best responses, the
time-averaged policy, the information sets); ``SPEC`` registers it (``envs.games``).

Expert: ``nash`` (alpha = 1/6). Teacher rationale: the own card. ``SPEC.evaluations`` act on action
probabilities ``[12, 4]`` at ``SPEC.infosets``: ``exploitability``, ``value_vs_random`` and
``value_vs_nash_p0``; ``SPEC.policy_metrics`` is the exploitability of an observation-level policy.
"""

from jaxrl_reason.envs.games.kuhn_poker.expert import (
    EVALUATIONS,
    TEACHER_ALPHA,
    average_exploitability_curve,
    average_init,
    average_policy,
    average_update,
    best_response_values,
    exploitability,
    infoset_obs,
    infosets,
    nash_action,
    nash_policy,
    own_reach,
    policy_action,
    policy_metrics,
    policy_table,
    table_from_probs,
    uniform_policy,
    value,
    value_vs_nash_p0,
    value_vs_uniform,
)
from jaxrl_reason.envs.games.kuhn_poker.rules import (
    ACTION_NAMES,
    BET,
    CALL,
    CARD_NAMES,
    CHECK,
    DEALS,
    FOLD,
    HISTORIES,
    NUM_DECISION_HISTORIES,
    KuhnPoker,
    KuhnState,
)
from jaxrl_reason.envs.games.kuhn_poker.text import KuhnPokerText
from jaxrl_reason.envs.games.spec import GameSpec


def _own_card(env, state, player, legal) -> str:
    return f"I hold {CARD_NAMES[int(state.cards[player])]}."


SPEC = GameSpec(name="kuhn_poker", env=KuhnPoker, text=KuhnPokerText, opponents={"nash": nash_action},
                expert="nash", rationale=_own_card, infosets=infosets, evaluations=EVALUATIONS,
                policy_metrics=policy_metrics)

__all__ = ["ACTION_NAMES", "BET", "CALL", "CARD_NAMES", "CHECK", "DEALS", "EVALUATIONS", "FOLD", "HISTORIES",
           "NUM_DECISION_HISTORIES", "SPEC", "TEACHER_ALPHA", "KuhnPoker", "KuhnPokerText", "KuhnState",
           "average_exploitability_curve", "average_init", "average_policy", "average_update",
           "best_response_values", "exploitability", "infoset_obs", "infosets", "nash_action", "nash_policy",
           "own_reach", "policy_action", "policy_metrics", "policy_table", "table_from_probs", "uniform_policy",
           "value", "value_vs_nash_p0", "value_vs_uniform"]
