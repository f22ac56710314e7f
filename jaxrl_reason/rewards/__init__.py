"""Reward functions on decoded text for GRPO on your own data (TRL / Tunix style), and a suite that runs them.

Reward function protocol: any callable, sync or ``async def``,

    fn(prompts: list[str], completions: list[str], *, completion_ids, step, **row_fields)
        -> Sequence[float | None]   # length B

``prompts`` [B] and ``completions`` [B] are decoded text (special tags such as ``<think>`` kept as text);
``row_fields`` are the dataset's per-row columns, each a list of length B (e.g. ``answer``), ``completion_ids``
(list[list[int]], the sampled token ids) and ``step`` (int, the RL step) are added by the trainer. Every keyword
is optional to declare: a function gets only those it names, or all of them with ``**kwargs``. ``None`` for a
sample excludes it from the loss (logged as ``reward/<name>/excluded``); a multi-turn sample may get a list of
per-turn rewards (summed for the episode). A wrong length, a non-number or NaN is a one-line ``RewardError``
naming the function (``rewards.suite``). Its name (per-function logging, ``RewardSuite.names``) is ``fn.name``
if present, else ``fn.__name__``, else its type name. Sync rewards run on host threads (thread-safe, no
``signal``); async ones run concurrently on one event loop.

    from jaxrl_reason.rewards import RewardSuite, make_reward
    with RewardSuite([make_reward("math_verify"), (make_reward("r1_format"), 0.1)], max_workers=4) as suite:
        fut = suite.submit(prompts, completions, fields, step=step)   # concurrent.futures.Future, at once
        total, per_fn = fut.result()   # total [B] float32 = sum_i w_i r_i; per_fn {name: [B] float32} unweighted
        scores = suite.score(prompts, completions, fields, step=step).result()   # + valid [B], excluded, per_turn

Answer rewards score the completion's final answer only (``final_answer``: ``require="any" | "tag" |
"boxed"``; thinking spans, restatements of the prompt and hedges between several answers score 0).
Built-ins (``REWARDS`` / ``make_reward``): exact_match, math_verify, r1_format, overlong, random,
wrong_label; in code: ``TaskCorrect`` (the synthetic tasks of ``jaxrl_reason.tasks``), ``Inverted`` and
``WithMalformedPenalty`` (spurious-reward variants; the synthetic tasks' presets, ``tasks.rewards.task_rewards``,
are lists of these). Your own by reference (the CLI's ``--reward-fn``): ``load_reward_fn("my_rewards.py:brevity")``,
signature-checked (``rewards.user``). Evaluation with reward functions, of your data and of the synthetic tasks:
``rewards.evaluation``. Not reward functions: the in-jit verifiers of token ids for search (``tasks.verify``).
"""

from jaxrl_reason.rewards.answers import MAX_ANSWER_CHARS, REQUIRE, answers_match, final_answer, normalize_answer
from jaxrl_reason.rewards.builtin import (
    REWARDS,
    ExactMatch,
    Inverted,
    MathVerify,
    Overlong,
    R1Format,
    RandomReward,
    TaskCorrect,
    WithMalformedPenalty,
    WrongLabel,
    extract_answer,
    extract_boxed,
    make_reward,
    r1_formatted,
)
from jaxrl_reason.rewards.suite import (RewardCall, RewardError, RewardFn, RewardScores, RewardSuite, check_rewards,
                                       reward_call, reward_name)
from jaxrl_reason.rewards.user import check_reward_signature, load_reward_fn

__all__ = [
    "MAX_ANSWER_CHARS", "REQUIRE", "answers_match", "final_answer", "normalize_answer",
    "REWARDS", "ExactMatch", "Inverted", "MathVerify", "Overlong", "R1Format", "RandomReward", "TaskCorrect",
    "WithMalformedPenalty", "WrongLabel", "extract_answer", "extract_boxed", "make_reward", "r1_formatted",
    "RewardCall", "RewardError", "RewardFn", "RewardScores", "RewardSuite", "check_rewards", "reward_call",
    "reward_name", "check_reward_signature", "load_reward_fn",
]
