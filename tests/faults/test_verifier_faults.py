"""Every task verifier honours ``Task.check``'s contract: for any string, on problems the task itself
generates, ``check(answer, problem)`` returns a bool and never raises (hypothesis over arbitrary
text and text biased towards the tasks' syntax: digits, operators, parentheses, tags, odd digits)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxrl_reason.tasks import TASKS, Problem
from jaxrl_reason.tasks.assistant import AssistantTask
from jaxrl_reason.tasks.calc_steps import step_is_valid
from jaxrl_reason.tasks.countdown import Countdown

PIECES = (list("0123456789+-*/()=,<> ") + ["<answer>", "</answer>", "<think>", "</think>", "count ", " to ", "calc ",
          "²", "١", "٢", "፩", "𝟏", "\x00", "\u200b", "e", "j", "_", ".", "**", "//", "1e308", "(" * 40, ")" * 40,
          "9" * 7, "9" * 5000, "-" * 50, "/0"])
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def answers(answer: str = "") -> st.SearchStrategy[str]:
    """Arbitrary text, text made of the tasks' syntax, and the right answer with garbage spliced in."""
    syntax = st.lists(st.sampled_from(PIECES), max_size=30).map("".join)
    spliced = st.tuples(syntax, syntax).map(lambda ab: ab[0] + answer + ab[1])
    return st.one_of(st.text(), st.text(alphabet="0123456789+-*/()", max_size=80), syntax, spliced)


def _holds(check, answer, problem):
    out = check(answer, problem)
    assert type(out) is bool, (answer, type(out))


@pytest.mark.parametrize("name", sorted(TASKS))
@PROPERTY
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_check_never_raises(name, data, seed):
    task = TASKS[name]()
    problem = task.generate(np.random.default_rng(seed))
    assert task.check(problem.answer, problem) is True
    _holds(task.check, data.draw(answers(problem.answer)), problem)


@pytest.mark.parametrize("name", sorted(TASKS))
@PROPERTY
@given(answer=answers(), prompt=answers())
def test_check_never_raises_on_foreign_problems(name, answer, prompt):
    """The in-jit verifier rebuilds the problem from decoded (possibly truncated) prompt tokens."""
    task = TASKS[name]()
    _holds(task.check, answer, Problem(prompt=prompt, answer="", wrong="", trace="", difficulty=0, task=name))


@PROPERTY
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_assistant_check_never_raises(data, seed):
    task = AssistantTask(difficulty=3)
    request = task.generate(np.random.default_rng(seed))
    assert task.check(request.answer, request) is True
    _holds(task.check, data.draw(answers(request.answer)), request)


NUMBERS = st.one_of(st.integers().map(str), st.integers(1, 6000).map(lambda k: "9" * k),
                    st.text(alphabet="0123456789/-²١", min_size=1, max_size=12))
STEPS = st.builds(lambda a, op, b, c, end: f"{a}{op}{b}={c}{end}", NUMBERS, st.sampled_from("+-*/"), NUMBERS, NUMBERS,
                  st.sampled_from(["", ","]))


@PROPERTY
@given(step=st.one_of(answers("7*2=14"), STEPS))
def test_step_is_valid_never_raises(step):
    assert type(step_is_valid(step)) is bool


# the inputs that made countdown's check (or step_is_valid) raise or accept non-ASCII digits before
COUNTDOWN = Problem(prompt="count 3 5 7 to 22", answer="3*5+7", wrong="3+5+7+1", trace="", difficulty=3, task="count")


@pytest.mark.parametrize("answer", ["²", "1+²", "፩", "3*5+٧", None, b"3*5+7", "(" * 40 + "3*5+7" + ")" * 40,
                                    "3*5+7" + "\x00", "9" * 5000])
def test_countdown_regressions(answer):
    assert Countdown().check(answer, COUNTDOWN) is False


@pytest.mark.parametrize("prompt", ["count 3 5 7", "count 3 5 7 to", "count 3 ٥ 7 to 22", "", "count 3 5 7 to 22 to 1"])
def test_countdown_malformed_prompt_is_false(prompt):
    assert Countdown().check("3*5+7", Problem(prompt, "", "", "", 0, "count")) is False


@pytest.mark.parametrize("step", ["9" * 5000 + "+1=1", "9" * 2200 + "*" + "9" * 2200 + "=1", "١+١=2", None])
def test_step_is_valid_regressions(step):
    assert step_is_valid(step) is False


def test_valid_answers_still_pass():
    assert Countdown().check("3*5+7", COUNTDOWN) and Countdown().check("(7+3*5)", COUNTDOWN)
    assert Countdown().check("7+5*3", COUNTDOWN) and not Countdown().check("3*5+7+0", COUNTDOWN)
    assert step_is_valid("7*2=14,") and step_is_valid("3/2+1/2=2") and not step_is_valid("7*2=15")
