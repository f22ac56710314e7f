"""SPIRAL's advantages as the learner's registered estimators (``rl.lm.advantages``): one sample per (episode,
seat), its group the (game, seat), every turn of a seat given its sample's advantage (``Rollout.sample``).

    SpiralConfig.advantage   estimator          what
    "rae"                    "rae"              Role-conditioned Advantage Estimation (``rl/rae.py``): an EMA baseline
                                                per (game, role), alpha 0.05, read before the update
    "none"                   "none"             plain self-play REINFORCE, ``A = R`` (SPIRAL's "w/o RAE" ablation); the
                                                baselines are still tracked, as a diagnostic
    "fixed"                  "rae"              the fixed-opponent baseline: the LM plays one seat against a fixed
                                                opponent (the rollout's), ``A = R_seat - b[game, seat]``; the opponent's
                                                turns are not trained
    any other registered     itself             e.g. "grpo" over the (game, seat) groups of a step

The stateful ones keep the baselines [2 * num_games] (group ``game * 2 + seat``) in the learner's state
(``LearnerState.advantage_carry``). A ``SpiralConfig.alpha`` other than 0.05 registers ``"rae"`` / ``"none"`` at
that rate once, as ``"rae@alpha=<alpha>"`` (``spiral_estimator``).

A caveat measured with a tiny LM (README, SPIRAL rows): when self-play settles into a forced line
(one seat always wins), the losing role's baseline converges to -1, so its advantage, and the
pressure to escape the line, vanishes under RAE; with ``"none"`` the loser keeps ``A = -1``. In
200 TicTacToe self-play steps the plain run settled into draws while the RAE run collapsed into one
forced-win line.
"""

from __future__ import annotations

import functools

from jaxrl_reason.rl.lm.advantages import CARRY_INIT, ESTIMATORS, register_estimator
from jaxrl_reason.rl.rae import DEFAULT_ALPHA

#: SpiralConfig.advantage's own name: RAE against a fixed opponent (the opponent is the rollout's)
FIXED = "fixed"


def spiral_estimator(advantage: str, alpha: float = DEFAULT_ALPHA) -> str:
    """``SpiralConfig.advantage`` (and ``alpha``) -> the name of the learner's estimator (module docstring)."""
    name = "rae" if advantage == FIXED else advantage
    if name not in ("rae", "none") or alpha == DEFAULT_ALPHA:
        return name
    rated = f"{name}@alpha={alpha!r}"
    if rated not in ESTIMATORS:
        register_estimator(rated, init=CARRY_INIT[name])(functools.partial(ESTIMATORS[name], alpha=alpha))
    return rated


__all__ = ["FIXED", "spiral_estimator"]
