"""Reward functions on decoded text and the threaded ``RewardSuite``."""

import math
import threading

import numpy as np
import pytest

from jaxrl_reason.rewards import (
    REWARDS,
    ExactMatch,
    Inverted,
    MathVerify,
    Overlong,
    RandomReward,
    RewardError,
    RewardSuite,
    TaskCorrect,
    WithMalformedPenalty,
    WrongLabel,
    extract_answer,
    extract_boxed,
    make_reward,
)
from jaxrl_reason.tasks import Countdown, RandomCalculation


def call(fn, completions, prompts=None, **fields):
    return np.asarray(fn(prompts or [""] * len(completions), completions, **fields)).tolist()


def test_extract_answer_and_boxed():
    assert extract_answer("<think>x</think><answer> 12 </answer>") == "12"
    assert extract_answer("<answer>1</answer> then <answer>\n2\n</answer>") == "2"
    assert extract_answer("<answer>1") is None and extract_answer("no tags") is None and extract_answer(None) is None
    assert extract_answer("<answer></answer>") == ""
    assert extract_boxed(r"so \boxed{1} and \boxed{\frac{1}{2}} end") == r"\frac{1}{2}"
    assert extract_boxed(r"\boxed{4} then \boxed{5") == "4"  # the last one is unbalanced (truncated)
    assert extract_boxed("nothing") is None


@pytest.mark.parametrize("completion,gold,want", [
    (r"<answer>\frac{1}{2}</answer>", "0.5", 1.0),
    (r"<answer>0.5</answer>", "1/2", 1.0),
    (r"<answer>\frac12</answer>", r"$\boxed{\frac12}$", 1.0),
    (r"<answer>1/2</answer>", r"\frac{1}{2}", 1.0),
    (r"reasoning ... so the result is \boxed{3}", "3", 1.0),  # no tags: the whole completion
    (r"<answer>2\pi</answer>", r"2\pi", 1.0),
    (r"<answer>x+1</answer>", "1+x", 1.0),
    ("<answer>4</answer>", "3", 0.0),
    (r"<answer>2</answer>", r"2\pi", 0.0),
    ("<answer>1,2</answer>", "1.2", 0.0),
    (r"<answer>\boxed{3}</answer> but \boxed{4}", "4", 0.0),  # the answer span wins over later text
    (r"}}{{ \frac{ $$ \boxed{ ^^^", "3", 0.0),
    ("", "3", 0.0),
    ("<answer>3</answer>", "", 0.0),
])
def test_math_verify(completion, gold, want):
    assert call(make_reward("math_verify"), [completion], answer=[gold]) == [want]


def test_math_verify_never_raises_and_other_field():
    fn = MathVerify(answer_field="solution")
    assert call(fn, ["<answer>7</answer>", "<answer>7</answer>"], solution=[7, object()]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="solution"):
        call(fn, ["x"], answer=["7"])


def test_math_verify_in_worker_thread():
    # math-verify's default timeout uses signal.alarm, which fails outside the main thread
    with RewardSuite([make_reward("math_verify")], max_workers=1) as suite:
        total, _ = suite([""] * 2, [r"<answer>\frac{3}{4}</answer>", "<answer>0.7</answer>"], {"answer": ["0.75"] * 2})
    assert total.tolist() == [1.0, 0.0]


def test_exact_match_and_wrong_label():
    completions = ["<answer> 12 </answer>", "<answer>12.0</answer>", "12", "<answer>13</answer>", "12"]
    # normalised: 12.0 = 12; the untagged "12" is the final answer under require="any", not under "tag"
    assert call(ExactMatch(), completions, answer=[12, "12", "12", " 12 ", 12]) == [1.0, 1.0, 1.0, 0.0, 1.0]
    assert call(ExactMatch(require="tag"), completions, answer=[12] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert call(WrongLabel(), completions, wrong=["13"] * 5) == [0.0, 0.0, 0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="require"):
        ExactMatch(require="xml")
    assert WrongLabel().name == "wrong_label" and ExactMatch().name == "exact_match"


@pytest.mark.parametrize("prompt,completion,want", [
    ("q", "<think>a</think><answer>b</answer>", 1.0),
    ("q", " \n<think>\nsteps\n</think>\n <answer>b</answer>\n", 1.0),
    ("q", "<think></think><answer></answer>", 1.0),
    ("q", "<think>a</think>", 0.0),
    ("q", "<answer>b</answer>", 0.0),
    ("q", "a</think><answer>b</answer>", 0.0),  # the prompt does not open <think>
    ("q", "<think>a</think><answer>b</answer> trailing", 0.0),
    ("q", "lead <think>a</think><answer>b</answer>", 0.0),
    ("q", "<think>a</think>x<answer>b</answer>", 0.0),
    ("q", "<think>a</think><answer>b</answer><answer>c</answer>", 0.0),
    ("q", "<think>a<think>b</think><answer>c</answer>", 0.0),
    ("q", "<think>a</think><answer>b</think></answer>", 0.0),
    ("q", "<answer>b</answer><think>a</think>", 0.0),
    ("User: q\nAssistant: <think>\n", "a</think><answer>b</answer>", 1.0),
    ("User: q\nAssistant: <think>", "<think>a</think><answer>b</answer>", 1.0),
    ("User: q\nAssistant: <think>", "a</think><answer>b</answer>x", 0.0),
])
def test_r1_format(prompt, completion, want):
    assert call(make_reward("r1_format"), [completion], prompts=[prompt]) == [want]


def test_overlong():
    fn = make_reward("overlong", max_new_tokens=10, cache=4)
    lens = [0, 5, 6, 7, 8, 9, 10, 11]
    got = call(fn, [""] * len(lens), completion_ids=[[1] * n for n in lens])
    assert got == pytest.approx([0, 0, 0, -0.25, -0.5, -0.75, -1.0, -1.0])
    assert call(Overlong(4, 4), ["", ""], completion_ids=[[], [1, 2]]) == [0.0, -0.5]
    for cache in [0, 11, 2.5]:
        with pytest.raises(ValueError, match="cache"):
            Overlong(max_new_tokens=10, cache=cache)
    with pytest.raises(TypeError, match="overlong"):
        make_reward("overlong")


def test_random_reward():
    fn = make_reward("random", p=0.3, seed=7)
    n = 4000
    a = np.asarray(fn([""] * n, ["x"] * n, step=5))
    b = np.asarray(fn([""] * n, ["something else"] * n, step=5))  # independent of the outputs
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a[:10], fn([""] * 10, ["y"] * 10, step=5))  # row i does not depend on B
    assert set(np.unique(a)) <= {0.0, 1.0} and abs(a.mean() - 0.3) < 0.03
    assert not np.array_equal(a, fn([""] * n, ["x"] * n, step=6))
    assert not np.array_equal(a, RandomReward(0.3, seed=8)([""] * n, ["x"] * n, step=5))
    with pytest.raises(ValueError):
        RandomReward(p=1.5)


def test_inverted_and_malformed_penalty():
    completions = ["<answer>3</answer>", "<answer>4</answer>", "3", "no answer at all"]
    answer = ["3"] * 4
    inv = Inverted(ExactMatch())
    assert inv.name == "inverted_exact_match"
    assert call(inv, completions, answer=answer) == [0.0, 1.0, 0.0, 0.0]
    assert call(Inverted(ExactMatch(), require="any"), completions, answer=answer) == [0.0, 1.0, 0.0, 0.0]
    # math_verify credits the untagged "3"; the penalty replaces it (no <answer> span: require="tag")
    pen = WithMalformedPenalty(make_reward("math_verify"), penalty=-0.5)
    assert pen.name == "math_verify"
    assert call(pen, completions, answer=answer) == [1.0, 0.0, -0.5, -0.5]
    assert call(WithMalformedPenalty(inv, -1), completions, answer=answer, step=3) == [0.0, 1.0, -1.0, -1.0]
    with pytest.raises(ValueError):
        WithMalformedPenalty(inv, math.nan)


def test_task_correct_countdown_and_calc():
    count, calc = Countdown(), RandomCalculation()
    pc = count.generate(np.random.default_rng(0))  # count 3 3 5 6 to 17, answer 6+5+3+3
    pk = calc.generate(np.random.default_rng(0))  # calc (0+(2*6))+8, answer 20
    assert (pc.prompt, pk.answer) == ("count 3 3 5 6 to 17", "20")
    rows = [
        (pc, f"<think>t</think><answer>{pc.answer}</answer>", 1.0),
        (pc, "<answer>3+3+5+6</answer>", 1.0),  # another valid answer
        (pc, "<answer>(6-3)*5+3-1</answer>", 0.0),  # uses a number not given
        (pc, "<answer>3*3+5+6</answer>", 0.0),  # = 20
        (pc, "3+3+5+6", 0.0),  # no answer span
        (pk, "<answer>20</answer>", 1.0),
        (pk, "<answer>20.0</answer>", 0.0),  # exact-match task
        (pk, f"<answer>{pk.wrong}</answer>", 0.0),
    ]
    fn = TaskCorrect([count, calc])
    problems = [p for p, _, _ in rows]
    assert call(fn, [c for _, c, _ in rows], task=[p.task for p in problems], problem=problems) == [w for *_, w in rows]
    assert call(fn, [rows[1][1]], problem=[pc]) == [1.0]  # task name from the problem
    with pytest.raises(ValueError, match="sort"):
        fn([""], ["<answer>1</answer>"], task=["sort"], problem=[pc])
    with pytest.raises(ValueError):
        TaskCorrect([count, Countdown()])


def test_registry():
    assert set(REWARDS) == {"exact_match", "math_verify", "r1_format", "overlong", "random", "wrong_label"}
    with pytest.raises(ValueError, match="exact_match"):
        make_reward("nope")


def test_suite_weights_and_per_fn():
    def length_bonus(prompts, completions, **kwargs):
        assert kwargs["step"] == 3 and kwargs["completion_ids"] == [[1], [1, 2], [1, 2, 3]]
        return [len(c) / 10 for c in completions]

    completions = ["<think>a</think><answer>1</answer>", "<answer>2</answer>", "x"]
    fields = {"answer": ["1", "1", "1"], "completion_ids": [[1], [1, 2], [1, 2, 3]]}
    suite = RewardSuite([make_reward("exact_match"), (make_reward("r1_format"), 0.5), (length_bonus, -2),
                         (make_reward("exact_match"), 2.0)], max_workers=2)
    assert suite.names == ("exact_match", "r1_format", "length_bonus", "exact_match_2")
    total, per_fn = suite([""] * 3, completions, fields, step=3)
    assert list(per_fn) == list(suite.names) and all(r.dtype == np.float32 and r.shape == (3,) for r in per_fn.values())
    np.testing.assert_array_equal(per_fn["exact_match"], [1, 0, 0])
    np.testing.assert_array_equal(per_fn["r1_format"], [1, 0, 0])
    np.testing.assert_allclose(per_fn["length_bonus"], [3.4, 1.8, 0.1], rtol=1e-6)
    assert total.dtype == np.float32
    np.testing.assert_allclose(total, [1 + 0.5 - 6.8 + 2, -3.6, -0.2], rtol=1e-6)
    m = suite.metrics(per_fn)
    assert m["reward/exact_match"] == pytest.approx(1 / 3) and m["reward/length_bonus_std"] == pytest.approx(
        np.std([3.4, 1.8, 0.1]), rel=1e-6)
    suite.close()
    with pytest.raises(RuntimeError):
        suite.submit([""], ["x"], {"answer": ["1"], "completion_ids": [[1]]})


def test_suite_construction_and_input_errors():
    em = make_reward("exact_match")
    for bad in [[], [(em, math.inf)], [(em, "1")], [(em, math.nan)], ["not callable"]]:
        with pytest.raises(ValueError):
            RewardSuite(bad)
    with RewardSuite([em]) as suite:
        with pytest.raises(ValueError, match="2 prompts but 1 completions"):
            suite.submit(["a", "b"], ["c"], {"answer": ["1"]})
        with pytest.raises(ValueError, match="answer"):
            suite.submit(["a"], ["c"], {"answer": ["1", "2"]})
        with pytest.raises(ValueError, match="reserved"):
            suite.submit(["a"], ["c"], {"answer": ["1"], "step": [0]})


def test_suite_errors_name_the_function():
    def boom(prompts, completions, **kwargs):
        raise KeyError("no such column")

    def short(prompts, completions, **kwargs):
        return [1.0] * (len(completions) - 1)

    def nan_rows(prompts, completions, **kwargs):
        return [0.0, math.nan, 1.0, math.inf]

    def texty(prompts, completions, **kwargs):
        return ["1"] * len(completions)

    args = ([""] * 4, ["c"] * 4, {"answer": ["1"] * 4})
    with pytest.raises(RewardError, match=r"'boom' raised KeyError at step 9 on a batch of 4") as err:
        RewardSuite([make_reward("r1_format"), boom])(*args, step=9)
    assert isinstance(err.value.__cause__, KeyError)
    with pytest.raises(RewardError, match=r"'short' returned length 3 .*length 4"):
        RewardSuite([short])(*args)
    with pytest.raises(RewardError, match=r"'nan_rows' returned 2 non-finite .*rows \[1, 3\]"):
        RewardSuite([nan_rows], max_workers=1).submit(*args).result()
    with pytest.raises(RewardError, match="'texty' returned non-numeric"):
        RewardSuite([texty])(*args)
    assert issubclass(RewardError, ValueError)


@pytest.mark.parametrize("max_workers", [1, 2])
def test_submit_returns_at_once_and_runs_concurrently(max_workers):
    barrier, release = threading.Barrier(2), threading.Event()

    def waiter(prompts, completions, **kwargs):
        release.wait(timeout=5)
        if max_workers > 1:
            barrier.wait(timeout=5)  # both functions must be running at the same time
        return [1.0] * len(completions)

    with RewardSuite([waiter, (waiter, 2.0)], max_workers=max_workers) as suite:
        fut = suite.submit(["p"], ["c"], step=1)
        assert not fut.done() and not fut.cancel()
        release.set()
        total, per_fn = fut.result(timeout=10)
    assert total.tolist() == [3.0] and list(per_fn) == ["waiter", "waiter_2"]


# ---- the calling convention: optional keywords, async, None, per-turn rewards (issue 42) ----------------------
from jaxrl_reason.rewards import RewardScores, check_reward_signature, reward_call  # noqa: E402


def test_each_function_gets_only_the_keywords_it_declares():
    seen = {}

    def bare(prompts, completions):
        seen["bare"] = (prompts, completions)
        return [0.0] * len(completions)

    def some(prompts, completions, *, step, answer):
        seen["some"] = (step, answer)
        return [1.0] * len(completions)

    def every(prompts, completions, completion_ids, step, answer, other="default"):
        seen["every"] = (completion_ids, step, answer, other)
        return [2.0] * len(completions)

    def rest(prompts, completions, answer, **kwargs):
        seen["rest"] = (answer, sorted(kwargs))
        return [3.0] * len(completions)

    def trl_style(completions, **kwargs):  # TRL's spelling: completions by keyword, prompts among the kwargs
        seen["trl_style"] = (completions, kwargs["prompts"], kwargs["step"])
        return [4.0] * len(completions)

    fields = {"answer": ["1", "2"], "other": ["x", "y"], "completion_ids": [[5], [6, 7]]}
    with RewardSuite([bare, some, every, rest, trl_style]) as suite:
        total, per_fn = suite(["p", "q"], ["a", "b"], fields, step=7)
    assert seen == {"bare": (["p", "q"], ["a", "b"]), "some": (7, ["1", "2"]),
                    "every": ([[5], [6, 7]], 7, ["1", "2"], ["x", "y"]),
                    "rest": (["1", "2"], ["completion_ids", "other", "step"]),
                    "trl_style": (["a", "b"], ["p", "q"], 7)}
    assert total.tolist() == [10.0, 10.0]
    assert reward_call(some).required == ("step", "answer") and reward_call(rest).takes is None
    assert reward_call(every).required == ("completion_ids", "step", "answer")
    check_reward_signature(bare, "f.py:bare")  # no **kwargs needed any more
    with pytest.raises(RewardError, match=r"'f.py:one'\(x\): must take \(prompts, completions\) first"):
        check_reward_signature(lambda x: x, "f.py:one")


def test_async_rewards_are_awaited_concurrently_beside_sync_ones():
    import asyncio

    class Pair:  # two async functions that each wait for the other: they finish only if run concurrently
        def __init__(self):
            self.events = None

        def make(self, me, other):
            async def fn(prompts, completions, *, step):
                if self.events is None:
                    self.events = {k: asyncio.Event() for k in "ab"}
                self.events[me].set()
                await asyncio.wait_for(self.events[other].wait(), timeout=10)
                return [float(step)] * len(completions)
            fn.__name__ = f"waits_{me}"
            return fn

    class AsyncCallable:
        async def __call__(self, prompts, completions, answer):
            await asyncio.sleep(0)
            return [float(c == a) for c, a in zip(completions, answer)]

    pair = Pair()
    fns = [pair.make("a", "b"), (pair.make("b", "a"), 2.0), AsyncCallable(), make_reward("r1_format")]
    with RewardSuite(fns, max_workers=1) as suite:
        assert [c.is_async for c in suite.calls] == [True, True, True, False]
        total, per_fn = suite(["p", "p"], ["1", "2"], {"answer": ["1", "1"]}, step=3)
    assert per_fn["waits_a"].tolist() == [3.0, 3.0] and per_fn["AsyncCallable"].tolist() == [1.0, 0.0]
    assert total.tolist() == [10.0, 9.0]

    async def broken(prompts, completions):
        raise RuntimeError("line one\nline two")

    with pytest.raises(RewardError, match=r"^reward function 'broken' raised RuntimeError at step 0 on a batch of 1 "
                                          r"completions: line one line two$"):
        RewardSuite([broken, pair.make("a", "b")])(["p"], ["c"])


def test_none_excludes_a_sample_and_is_counted():
    def picky(prompts, completions, *, answer):
        return [None if a is None else float(c == a) for c, a in zip(completions, answer)]

    with RewardSuite([picky, (make_reward("r1_format"), 0.5)]) as suite:
        scores = suite.score(["p"] * 3, ["1", "2", "3"], {"answer": ["1", None, "2"]}).result()
        total, per_fn = suite(["p"] * 3, ["1", "2", "3"], {"answer": ["1", None, "2"]})
    assert isinstance(scores, RewardScores)
    assert scores.valid.tolist() == [True, False, True] and scores.total.tolist() == [1.0, 0.0, 0.0]
    assert scores.excluded == {"picky": 1, "r1_format": 0}
    assert np.isnan(total[1]) and total[[0, 2]].tolist() == [1.0, 0.0]  # the legacy tuple marks it NaN
    m = suite.metrics(per_fn)
    assert m["reward/picky"] == 0.5 and m["reward/picky/excluded"] == 1 and m["reward/r1_format/excluded"] == 0
    assert suite.metrics({"x": np.full(2, np.nan, np.float32)})["reward/x"] == 0.0  # none scored: finite


def test_per_turn_rewards_of_multi_turn_episodes():
    def per_turn(prompts, completions):
        return [[0.5, 1.0], 2.0, None]  # two turns rewarded each, an episode reward, an excluded episode

    with RewardSuite([per_turn, (lambda p, c: [1.0, 1.0, 1.0], 0.5)]) as suite:
        s = suite.score(["p"] * 3, ["a", "b", "c"], turns=[2, 3, 1]).result()
        assert s.total.tolist() == [2.0, 2.5, 0.0] and s.valid.tolist() == [True, True, False]
        assert [t.tolist() for t in s.per_turn[:2]] == [[0.5, 1.5], [0.0, 0.0, 2.5]]  # episode numbers at the end
        assert np.isnan(s.per_turn[2]).all()
        with pytest.raises(RewardError, match=r"'per_turn' returned per-turn rewards \[0.5, 1.0\] for row 0 at step "
                                              r"0, expected 3 numbers"):
            suite.score(["p"] * 3, ["a", "b", "c"], turns=[3, 3, 1]).result()
        with pytest.raises(RewardError, match=r"'per_turn' returned non-numeric values .* list \[0.5, 1.0\] for row 0"):
            suite(["p"] * 3, ["a", "b", "c"])  # no turns: a list is not a reward


@pytest.mark.parametrize("out, error", [
    ([1.0], r"'bad' returned length 1 at step 4, expected a 1-D sequence of length 2"),
    (["1", 0.0], r"'bad' returned non-numeric values at step 4: str '1' for row 0"),
    ("11", r"'bad' returned a str at step 4, expected a sequence of 2 rewards"),
    (1.0, r"'bad' returned a float at step 4"),
    ([0.0, math.nan], r"'bad' returned 1 non-finite value\(s\) at step 4: rows \[1\]"),
    ([None, math.inf], r"'bad' returned 1 non-finite value\(s\) at step 4: rows \[1\]"),
    (np.zeros((2, 2)), r"'bad' returned shape \(2, 2\) at step 4"),
])
@pytest.mark.parametrize("is_async", [False, True])
def test_every_bad_return_is_one_line_naming_the_function(out, error, is_async):
    def bad(prompts, completions):
        return out

    async def bad_async(prompts, completions):
        return out

    fn = bad_async if is_async else bad
    fn.__name__ = "bad"
    with RewardSuite([make_reward("r1_format"), fn]) as suite:
        with pytest.raises(RewardError, match=error) as err:
            suite(["p", "q"], ["a", "b"], step=4)
    assert "\n" not in str(err.value)
