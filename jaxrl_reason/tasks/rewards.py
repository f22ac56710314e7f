"""The synthetic tasks' rewards: reward functions of the one reward protocol (``jaxrl_reason.rewards``),

    fn(prompts: list[str], completions: list[str], **row_fields) -> [B] numbers

run on decoded text by a ``rewards.RewardSuite``, like your own. A task row (``tasks.TaskDataset``) carries the
fields ``problem`` (the ``tasks.Problem``), ``task``, ``answer``, ``wrong`` (a fixed wrong label), ``difficulty``.

    fns = task_rewards(tasks, RewardConfig("correct", format_weight=0.1), seed)  # [(fn, weight)]: the
    fns.append((my_reward, 0.5))       # GRPO presets' rewards (rl.grpo.agent.grpo_for_tasks); yours go in the same list
    grpo_learner(cfg, model, tok, TaskDataset(tasks, tok, prompt_len), fns)      # -> (learner, agent)
    fn = VARIANT_REWARDS["inverted"](TaskCorrect(tasks), RewardConfig("inverted"), seed)   # one variant's function

The variants (``VARIANTS``, the spurious-rewards study), each a registered reward function
(``VARIANT_REWARDS``: name -> ``make(correct, config, seed) -> fn``): correct (``rewards.TaskCorrect``: the
task's own check of the ``<answer>`` span), random (Bernoulli(random_p), output-independent), inverted (a parsable,
incorrect answer scores 1), wrong_label (1 iff the answer equals the problem's fixed wrong label), format_only (1
iff R1-formatted, ``rewards.R1Format``). Verifiers of token ids inside jit (search) are ``tasks.verify``: not
reward functions.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from jaxrl_reason.rewards.builtin import (Inverted, R1Format, RandomReward, TaskCorrect, WithMalformedPenalty,
                                          WrongLabel)
from jaxrl_reason.utils.validation import check_hyperparameters, one_of

#: variant name -> ``make(correct, config, seed)``: the variant's reward function (``correct``: a ``TaskCorrect``)
VARIANT_REWARDS: dict[str, Callable] = {
    "correct": lambda correct, cfg, seed: WithMalformedPenalty(correct, cfg.malformed_penalty),
    "random": lambda correct, cfg, seed: RandomReward(cfg.random_p, seed),
    "inverted": lambda correct, cfg, seed: WithMalformedPenalty(Inverted(correct), cfg.malformed_penalty),
    "wrong_label": lambda correct, cfg, seed: WithMalformedPenalty(WrongLabel(), cfg.malformed_penalty),
    "format_only": lambda correct, cfg, seed: R1Format(),
}
VARIANTS = tuple(VARIANT_REWARDS)


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """variant: correct | random (Bernoulli(random_p), output-independent) | inverted (a parsable,
    incorrect answer scores 1) | wrong_label (1 iff the answer equals the problem's fixed wrong
    label) | format_only (1 iff well formatted). ``format_weight`` adds w * formatted (R1's format
    reward; not added to format_only). Responses without a parsable answer get ``malformed_penalty`` instead of the variant's
    reward for correct / inverted / wrong_label."""

    variant: str = "correct"
    format_weight: float = 0.0
    random_p: float = 0.5
    malformed_penalty: float = 0.0

    CHECKS = (("variant", one_of(VARIANTS)),)  # utils.validation; the floats: their names' ranges

    def __post_init__(self):
        check_hyperparameters(self)


def task_rewards(tasks: Sequence, cfg: RewardConfig, seed: int = 0) -> list:
    """The reward functions of ``cfg`` for rows of ``tasks.TaskDataset``, as ``(fn, weight)`` pairs (the list
    ``rl.grpo.agent.grpo_learner`` takes; add your own to it): [(variant, 1.0)] + [(r1_format, format_weight)] when
    format_weight != 0, + [(correct, 0.0)] for variants other than correct (logged as ``reward/correct``, the
    training accuracy, not rewarded)."""
    correct = TaskCorrect(tuple(tasks))
    fns = [(VARIANT_REWARDS[cfg.variant](correct, cfg, seed), 1.0)]
    if cfg.format_weight and cfg.variant != "format_only":
        fns.append((R1Format(), cfg.format_weight))
    if cfg.variant != "correct":
        fns.append((correct, 0.0))  # logged (reward/correct, the trainer's accuracy), not rewarded
    return fns
