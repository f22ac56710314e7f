"""Tasks (determinism, correct answers, verifiers) and rewards on token ids (malformed outputs, variants)."""

import re
from fractions import Fraction

import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from jaxrl_reason.tasks import (VOCAB, Countdown, OrderingPuzzle, Parity, RandomCalculation, Sorting, make_batch,
                                response_text)
from jaxrl_reason.tasks.countdown import evaluate_expression
from jaxrl_reason.tasks.rewards import RewardConfig, combine_rewards, score

ALL = [RandomCalculation(), Countdown(), Sorting(), Parity(), OrderingPuzzle()]


@pytest.mark.parametrize("task", ALL, ids=lambda t: t.name)
def test_generators_are_seeded_and_their_answers_check(task):
    a = [task.generate(np.random.default_rng(5)) for _ in range(3)]
    b = [task.generate(np.random.default_rng(5)) for _ in range(3)]
    assert a == b
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = task.generate(rng)
        assert task.min_difficulty <= p.difficulty <= task.max_difficulty
        assert task.check(p.answer, p) and not task.check(p.wrong, p)
        assert VOCAB.decode(VOCAB.encode(p.prompt)) == p.prompt


def test_random_calculation_answers_are_exact_rationals():
    task = RandomCalculation(min_difficulty=1, max_difficulty=6)
    rng = np.random.default_rng(1)
    for _ in range(200):
        p = task.generate(rng)
        value = eval(re.sub(r"(\d+)", r"Fraction(\1)", p.prompt[len("calc "):]), {"Fraction": Fraction})
        assert p.answer == (str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}")
        assert len(p.trace.split(",")) == p.difficulty
    with pytest.raises(ValueError, match="min_difficulty"):
        RandomCalculation(min_difficulty=0)


def test_countdown_verifier():
    p = Countdown().generate(np.random.default_rng(0), 3)
    nums = [int(x) for x in p.prompt.split(" to ")[0].split()[1:]]
    a, b, c = nums
    target = int(p.prompt.split(" to ")[1])
    assert Countdown().check(p.answer, p)
    assert not Countdown().check(f"{a}+{b}", p)  # a number unused
    alt = [f"{x}{o1}{y}{o2}{z}" for x, y, z in ((a, b, c), (c, b, a), (b, a, c))
           for o1 in "+-*" for o2 in "+-*" if evaluate_expression(f"{x}{o1}{y}{o2}{z}")[0] == target]
    assert all(Countdown().check(e, p) for e in alt)
    assert evaluate_expression("(2+3)*4") == (Fraction(20), [2, 3, 4])
    for bad in ["", "(", "2+", "2**3", "((((", "9" * 80, "2)(3"]:
        assert evaluate_expression(bad) is None


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789+-*() x", max_size=40))
def test_countdown_verifier_never_raises(text):
    p = Countdown().generate(np.random.default_rng(0))
    assert Countdown().check(text, p) in (True, False)


def _responses(texts, n=24):
    return VOCAB.pad_batch([VOCAB.encode(t)[:n] for t in texts], n)


def test_scores_on_token_ids_with_malformed_outputs():
    batch = make_batch([RandomCalculation(max_difficulty=1), Countdown(max_difficulty=2)], np.random.default_rng(3),
                       8, 24, 12)
    p = batch.problems
    texts = [response_text(p[0]),                                  # correct, formatted
             f"<answer>{p[1].answer}</answer>",                     # correct, no think: unformatted
             "garbage ((( 12",                                      # no tags
             "",                                                    # empty
             "<think>" + "1" * 40,                                  # overlong: truncated, no answer
             f"<think>x</think><answer>{p[5].wrong}</answer>",      # the wrong label
             f"<think></think><answer>{p[6].answer}</answer><answer>1</answer>",  # duplicated tags
             f"<think>a</think><answer>{p[7].answer}"]              # unclosed answer
    toks, lens = _responses(texts)
    toks[2:4] = np.random.default_rng(0).integers(0, VOCAB.size, (2, toks.shape[1]))  # raw garbage ids too
    lens[3] = 0
    s = score([RandomCalculation(max_difficulty=1), Countdown(max_difficulty=2)], batch, toks, lens)
    assert s["correct"].tolist() == [True, True, False, False, False, False, True, False]
    assert s["formatted"].tolist() == [True, False, False, False, False, True, False, False]
    assert s["wrong_match"][5] and s["has_answer"].tolist() == [1, 1, 0, 0, 0, 1, 1, 0]


def test_reward_variants():
    s = {"correct": np.array([1, 0, 0, 1], bool), "has_answer": np.array([1, 1, 0, 1], bool),
         "formatted": np.array([1, 0, 0, 0], bool), "wrong_match": np.array([0, 1, 0, 0], bool)}
    k = jax.random.key(0)
    r = lambda **kw: np.asarray(combine_rewards(RewardConfig(**kw), k, s)).tolist()
    assert r(variant="correct", format_weight=0.5, malformed_penalty=-1) == [1.5, 0.0, -1.0, 1.0]
    assert r(variant="inverted") == [0.0, 1.0, 0.0, 0.0]
    assert r(variant="wrong_label") == [0.0, 1.0, 0.0, 0.0]
    assert r(variant="format_only", format_weight=0.5) == [1.0, 0.0, 0.0, 0.0]
    big = {k_: np.zeros(4000, bool) for k_ in s}
    rand = np.asarray(combine_rewards(RewardConfig("random", random_p=0.3), k, big))
    assert abs(rand.mean() - 0.3) < 0.03 and set(np.unique(rand)) == {0.0, 1.0}
    with pytest.raises(ValueError, match="variant"):
        RewardConfig("noisy")
