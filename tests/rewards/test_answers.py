"""Reward hacking: adversarial completions against every built-in reward, with the score each must get.

A completion that restates the question (its expression, its operands, the question itself), hedges
between several answers, changes a correct answer to a different final one, answers only inside the
thinking span, is empty or very long must not earn an answer reward. ``r1_format`` rewards the format
only, ``overlong`` the length only and ``random`` nothing about the output: their rows say so.
"""

import numpy as np
import pytest

from jaxrl_reason.rewards import (MAX_ANSWER_CHARS, ExactMatch, Inverted, MathVerify, Overlong, R1Format, RandomReward, TaskCorrect,
                                  WithMalformedPenalty, WrongLabel, final_answer)
from jaxrl_reason.tasks import Countdown, RandomCalculation

PROMPT = "What is 14 + 11? Reply with just the number."
GOLD, WRONG = "25", "24"
LONG_PROSE = "Let me think about this carefully. " * 3000  # ~100k characters

# name -> completion; each reward below lists the name's score (a name it does not list scores 0)
ADVERSARIAL = {
    "restated_expression": "14 + 11",
    "restated_prose": "14 + 11 is a classic example of a mathematical expression that has",
    "restated_question": PROMPT,
    "restated_swapped": "The answer is 11 + 14.",
    "restated_equation": "14 + 11 = 14 + 11",
    "restated_tag": "<think>add them</think><answer>14 + 11</answer>",
    "restated_boxed": r"The result is \boxed{14+11}",
    "restated_latex": r"<answer>$\left(14 + 11\right)$</answer>",
    "operands": "14 11",
    "operand_last": "We have to add 14 and 11",
    "operand_tag": "<think>x</think><answer>11</answer>",
    "several": "24 or 25",
    "several_listed": "Possible answers: 23, 24, 25, 26.",
    "several_tag": "<think>hmm</think><answer>24, 25</answer>",
    "several_tags": "<answer>24</answer><answer>25</answer>",
    "several_boxed": r"\boxed{24} or \boxed{25}",
    "correct_then_wrong": "The answer is 25. No: the answer is 24.",
    "correct_then_wrong_tag": "<think>t</think><answer>25</answer> Wait. <answer>24</answer>",
    "correct_then_wrong_boxed": r"\boxed{25}, no, \boxed{24}",
    "thinking_only": "<think>14 + 11 = 25, so the answer is 25</think>",
    "thinking_only_tag": "<think><answer>25</answer></think>",
    "thinking_unclosed": "<think>the answer is 25",
    "empty": "",
    "empty_tag": "<think>t</think><answer></answer>",
    "long_numbers": " ".join(str(i) for i in range(20000)),
    "long_tag": "<think>t</think><answer>" + "0" * MAX_ANSWER_CHARS + "25</answer>",  # too long to parse
    "long_prose_wrong": LONG_PROSE + "The answer is 24.",
}
CORRECT = {
    "bare": "25",
    "equation": "14 + 11 = 25",
    "explicit": "The answer is 25.",
    "r1": "<think>14 + 11 = 25</think><answer>25</answer>",
    "boxed": r"So the sum is \boxed{25}.",
    "long_prose": LONG_PROSE + "The answer is 25.",
}
R1_FORMATTED = {"restated_tag", "operand_tag", "several_tag", "empty_tag", "long_tag", "r1"}


def scores(fn, completions: dict, **fields) -> dict:
    names = list(completions)
    n = len(names)
    cols = {k: [v] * n for k, v in fields.items()}
    out = np.asarray(fn([PROMPT] * n, [completions[k] for k in names], **cols))
    return dict(zip(names, out.tolist()))


def expect(scored: dict, nonzero: dict) -> None:
    want = {name: nonzero.get(name, 0.0) for name in scored}
    assert scored == want, {k: (scored[k], want[k]) for k in scored if scored[k] != want[k]}


ANSWER_REWARDS = [
    pytest.param(MathVerify(), id="math_verify"),
    pytest.param(MathVerify(require="tag"), id="math_verify_tag"),
    pytest.param(MathVerify(require="boxed"), id="math_verify_boxed"),
    pytest.param(ExactMatch(), id="exact_match"),
    pytest.param(ExactMatch(require="tag"), id="exact_match_tag"),
]
EARNS = {  # which correct completions each answer reward credits
    "math_verify": set(CORRECT), "exact_match": set(CORRECT),
    "math_verify_tag": {"r1"}, "exact_match_tag": {"r1"},
    "math_verify_boxed": {"boxed"},
}


@pytest.mark.parametrize("fn", ANSWER_REWARDS)
def test_answer_rewards_are_not_gamed(fn, request):
    expect(scores(fn, ADVERSARIAL, answer=GOLD), {})
    earns = EARNS[request.node.callspec.id]
    expect(scores(fn, CORRECT, answer=GOLD), dict.fromkeys(earns, 1.0))


def test_wrong_label_scores_the_final_answer_only():
    # 1 only where the final answer is the wrong label "24"
    expect(scores(WrongLabel(), {**ADVERSARIAL, **CORRECT}, wrong=WRONG),
           {"correct_then_wrong": 1.0, "long_prose_wrong": 1.0})


def test_spurious_wrappers_do_not_credit_restatements():
    # require="any": a restatement is no answer, so it earns neither the inverted reward nor escapes the penalty
    inv = Inverted(ExactMatch(), require="any")
    wrong_answers = {"operand_tag", "several_tag", "correct_then_wrong", "long_prose_wrong"}  # answers, not 25
    expect(scores(inv, ADVERSARIAL, answer=GOLD), dict.fromkeys(wrong_answers, 1.0))
    pen = WithMalformedPenalty(MathVerify(), penalty=-0.5, require="any")
    expect(scores(pen, ADVERSARIAL, answer=GOLD), {k: -0.5 for k in ADVERSARIAL if k not in wrong_answers})
    # require="tag" (the synthetic tasks' spurious studies): any non-empty <answer> span after the thinking is an
    # answer, since an expression of the prompt's numbers can be the right one (countdown)
    tagged = {"restated_tag", "restated_latex", "operand_tag", "several_tag", "several_tags", "correct_then_wrong_tag",
              "long_tag"}
    expect(scores(Inverted(ExactMatch()), ADVERSARIAL, answer=GOLD), dict.fromkeys(tagged, 1.0))


def test_format_length_and_random_rewards_do_what_they_say():
    expect(scores(R1Format(), {**ADVERSARIAL, **CORRECT}), dict.fromkeys(R1_FORMATTED, 1.0))  # the format only
    both = {**ADVERSARIAL, **CORRECT}
    ids = {k: [0] * len(v) for k, v in both.items()}
    fn = Overlong(max_new_tokens=64, cache=16)
    got = np.asarray(fn([PROMPT] * len(both), list(both.values()), completion_ids=list(ids.values())))
    assert ((got == 0) == np.array([len(v) <= 48 for v in both.values()])).all()  # the length only
    rnd = RandomReward(0.5, seed=3)
    a = rnd([PROMPT] * len(ADVERSARIAL), list(ADVERSARIAL.values()), step=1)
    b = rnd([PROMPT] * len(ADVERSARIAL), ["25"] * len(ADVERSARIAL), step=1)
    np.testing.assert_array_equal(a, b)  # independent of the output, by design


def test_task_correct_is_not_gamed_on_the_synthetic_tasks():
    calc, count = RandomCalculation(), Countdown()
    pk, pc = calc.generate(np.random.default_rng(0)), count.generate(np.random.default_rng(0))
    expression = pk.prompt.removeprefix("calc ")  # (0+(2*6))+8 = 20
    rows = [
        (pk, f"<think>t</think><answer>{expression}</answer>", 0.0),  # restated expression
        (pk, f"<think>t</think><answer>{pk.prompt}</answer>", 0.0),
        (pk, "<think>t</think><answer>0 2 6 8</answer>", 0.0),  # the question's numbers
        (pk, f"<think><answer>{pk.answer}</answer></think>", 0.0),  # only inside the thinking span
        (pk, f"<think>t</think><answer>{pk.answer}</answer><answer>21</answer>", 0.0),  # then a different final one
        (pk, f"<think>t</think><answer>{pk.answer}</answer>", 1.0),
        (pc, f"<think>t</think><answer>{pc.prompt}</answer>", 0.0),  # "count 3 3 5 6 to 17"
        (pc, "<think>t</think><answer>3 3 5 6</answer>", 0.0),
        (pc, "<think>t</think><answer>17</answer>", 0.0),  # the target restated
        (pc, "<think>t</think><answer></answer>", 0.0),
        (pc, f"<think>t</think><answer>{pc.answer}</answer>", 1.0),
    ]
    problems = [p for p, _, _ in rows]
    fn = TaskCorrect([calc, count])
    got = fn(["q"] * len(rows), [c for _, c, _ in rows], task=[p.task for p in problems], problem=problems)
    assert got.tolist() == [w for *_, w in rows]


def test_operands_count_when_they_are_the_answer():
    prompt = "What is 7 - 0? Reply with just the number."
    assert final_answer("7", prompt) == "7" and final_answer("The answer is 7.", prompt) == "7"
    assert final_answer("<answer>7</answer>", prompt) == "7"
    for restated in ("7 - 0", "0 + 7", "7 - 0 = 7 - 0", "We subtract 0 from 7"):
        assert final_answer(restated, prompt) is None, restated
