"""Tasks (determinism, correct answers, verifiers), verifiers on token ids (``tasks.verify``: malformed outputs) and
the reward variants of the GRPO presets (``task_rewards`` run by a ``RewardSuite`` on decoded text)."""

import re
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from jaxrl_reason.models.tokenizer import CharTokenizer
from jaxrl_reason.rewards import R1Format, RewardSuite, TaskCorrect, check_reward_signature
from jaxrl_reason.tasks import (Countdown, OrderingPuzzle, Parity, RandomCalculation, Sorting, TaskDataset, make_batch,
                                response_text)
from jaxrl_reason.tasks.countdown import evaluate_expression
from jaxrl_reason.tasks.longcontext import LongContextTask
from jaxrl_reason.tasks.rewards import VARIANT_REWARDS, VARIANTS, RewardConfig, task_rewards
from jaxrl_reason.tasks.verify import score

TOK = CharTokenizer()

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
        assert TOK.decode(TOK.encode(p.prompt)) == p.prompt


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
    """Response ids as the sampler emits them: the tags as single tokens (allow_special)."""
    return TOK.pad_batch([TOK.encode(t, allow_special=True)[:n] for t in texts], n)


TWO = [RandomCalculation(max_difficulty=1), Countdown(max_difficulty=2)]


def test_scores_on_token_ids_with_malformed_outputs():
    batch = make_batch(TWO, np.random.default_rng(3), 8, 24, 12, tokenizer=TOK)
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
    assert toks[0, 0] == TOK.tag_ids().think and len(TOK.encode("<think>")) == 7  # data text is never a tag
    toks[2:4] = np.random.default_rng(0).integers(0, TOK.vocab_size, (2, toks.shape[1]))  # raw garbage ids too
    lens[3] = 0
    s = score(TWO, batch, toks, lens, TOK)
    assert s["correct"].tolist() == [True, True, False, False, False, False, True, False]
    assert s["formatted"].tolist() == [True, False, False, False, False, True, False, False]
    assert s["wrong_match"][5] and s["has_answer"].tolist() == [1, 1, 0, 0, 0, 1, 1, 0]
    # the presets' text rewards agree on the decoded completions (rows 2-3 hold random ids; row 6 has two
    # answer spans, which the sampler never emits: it stops at the first </answer>; the text rewards read
    # the last span, the token parser the first)
    rows = [{"problem": q, "task": q.task} for q in p]
    completions = TOK.decode_completions(toks, lens)
    assert completions[0] == texts[0] and completions[3] == ""
    text_correct = TaskCorrect(TWO)([""] * 8, completions, problem=[r["problem"] for r in rows],
                                    task=[r["task"] for r in rows])
    text_formatted = R1Format()([""] * 8, completions)
    keep = [0, 1, 4, 5, 7]
    assert text_correct[keep].tolist() == s["correct"][keep].tolist()
    assert text_formatted[keep].tolist() == s["formatted"][keep].tolist()


def _variant_batch():
    """4 task rows (as the trainer hands them to reward functions) and hand-made completions: correct and
    formatted; the fixed wrong label, unformatted; no answer; correct, unformatted."""
    rows, _, _ = TaskDataset(TWO, TOK, prompt_len=24, seed=3).sample(0, 4)
    fields = {k: [r[k] for r in rows] for k in rows[0]}
    p = fields["problem"]
    completions = [response_text(p[0]), f"<answer>{p[1].wrong}</answer>", "garbage ((( 12",
                   f"<answer>{p[3].answer}</answer>"]
    return fields["prompt"], completions, fields


def test_reward_variants():
    prompts, completions, fields = _variant_batch()

    def r(**kw):
        with RewardSuite(task_rewards(TWO, RewardConfig(**kw), seed=0)) as suite:
            total, per_fn = suite(prompts, completions, fields, step=0)
        return total.tolist(), per_fn

    total, per_fn = r(variant="correct", format_weight=0.5, malformed_penalty=-1)
    assert total == [1.5, 0.0, -1.0, 1.0]
    assert list(per_fn) == ["correct", "r1_format"] and per_fn["r1_format"].tolist() == [1, 0, 0, 0]
    total, per_fn = r(variant="inverted")
    assert total == [0.0, 1.0, 0.0, 0.0]
    assert list(per_fn) == ["inverted_correct", "correct"] and per_fn["correct"].tolist() == [1, 0, 0, 1]  # logged, weight 0
    assert r(variant="inverted", malformed_penalty=-0.5)[0] == [0.0, 1.0, -0.5, 0.0]
    total, per_fn = r(variant="wrong_label")
    assert total == [0.0, 1.0, 0.0, 0.0] and list(per_fn) == ["wrong_label", "correct"]
    assert r(variant="format_only", format_weight=0.5)[0] == [1.0, 0.0, 0.0, 0.0]  # no format bonus on top

    big = {k: v * 1000 for k, v in fields.items()}
    rand_prompts, rand_completions = prompts * 1000, completions * 1000
    with RewardSuite(task_rewards(TWO, RewardConfig("random", random_p=0.3), seed=0)) as suite:
        rand, per_fn = suite(rand_prompts, rand_completions, big, step=0)
        again = suite(rand_prompts, rand_completions, big, step=0)[0]
        other_step = suite(rand_prompts, rand_completions, big, step=1)[0]
    assert abs(rand.mean() - 0.3) < 0.03 and set(np.unique(rand)) == {0.0, 1.0}
    assert np.array_equal(rand, again) and not np.array_equal(rand, other_step)  # seeded by (seed, step)
    assert per_fn["correct"].mean() == 0.5  # 2 of every 4 rows correct, not rewarded
    with pytest.raises(ValueError, match="variant"):
        RewardConfig("noisy")


def test_the_variants_are_reward_functions_of_the_one_protocol():
    """Every variant is a registered reward function ``fn(prompts, completions, **row_fields) -> [B]``, and a user's
    own function goes in the same list as the presets' ones."""
    prompts, completions, fields = _variant_batch()
    assert VARIANTS == ("correct", "random", "inverted", "wrong_label", "format_only") == tuple(VARIANT_REWARDS)
    with pytest.raises(ValueError, match=r"^RewardConfig\.variant must be one of \('correct', 'random', "):
        RewardConfig("noisy")
    for name, make in VARIANT_REWARDS.items():
        fn = make(TaskCorrect(TWO), RewardConfig(name), 0)
        check_reward_signature(fn, name)
        assert np.asarray(fn(prompts, completions, step=0, **fields)).shape == (4,)

    def short(prompts, completions, *, answer):
        return [float(len(c) < 20) for c in completions]

    with RewardSuite(task_rewards(TWO, RewardConfig("correct"), seed=0) + [(short, 0.5)]) as suite:
        total, per_fn = suite(prompts, completions, fields, step=0)
    assert list(per_fn) == ["correct", "short"] and per_fn["correct"].tolist() == [1, 0, 0, 1]
    assert total.tolist() == (per_fn["correct"] + 0.5 * per_fn["short"]).tolist()


@pytest.mark.parametrize("kw, msg", [
    (dict(kind="x"), "LongContextTask.kind must be one of ('needle', 'multihop'), got 'x'"),
    (dict(num_facts=-1), "LongContextTask.num_facts must be >= 0 (0 = empty document), got -1"),
    (dict(key_len=4), "LongContextTask.key_len must be a finite number in [1, 3], got 4"),
    (dict(answer_position=1.5), "LongContextTask.answer_position must be None (uniform) or a finite number in [0, 1], "
                                "got 1.5"),
    (dict(p_no_answer=2.0), "LongContextTask.p_no_answer must be a finite number in [0, 1], got 2.0"),
    (dict(no_answer="n0"), "LongContextTask.no_answer must be non-empty, without digits, got 'n0'"),
    (dict(kind="multihop", num_facts=1), "LongContextTask: a multi-hop document needs >= 2 fact slots (link + value), "
                                         "or 0 (empty)"),
])
def test_longcontext_task_checks_its_fields_with_the_shared_table(kw, msg):
    """LongContextTask states its rules as a ``utils.validation`` table (``require`` between fields): one message
    form."""
    with pytest.raises(ValueError) as e:
        LongContextTask(**kw)
    assert str(e.value) == msg
    assert "need" not in LongContextTask.__post_init__.__code__.co_varnames  # no local copy of the check
