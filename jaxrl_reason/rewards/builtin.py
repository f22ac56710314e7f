"""Built-in reward functions on decoded text (host side), and their registry.

Every function is ``fn(prompts, completions, **fields) -> np.ndarray [B] float32`` (see the package
docstring); per-row columns (``answer``, ``wrong``, ``completion_ids``, ``task``, ``problem`` ...) come in
as keyword lists of length B, ``step`` as an int.

    make_reward("math_verify")                       # 1 iff the final answer is mathematically equal to fields["answer"]
    make_reward("math_verify", require="boxed")      # only a \\boxed{} answer counts
    make_reward("overlong", max_new_tokens=1024, cache=256)
    WithMalformedPenalty(Inverted(TaskCorrect([Countdown()])), penalty=-0.5)

The answer rewards (``ExactMatch``, ``MathVerify``, ``WrongLabel``) score the completion's final answer only
(``rewards.answers.final_answer``: the ``<answer>`` span or ``\\boxed{}``, else an explicit "answer is X" /
"= X", else the last number; never a thinking span, never a restatement of the prompt's own expression or
operands), so a policy cannot score by repeating the question.

``MathVerify`` parses with math-verify with its signal-based timeouts off (they only work in the main
thread and the suite runs functions in worker threads), so a pathological expression is not interrupted.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from typing import Any, ClassVar, Sequence

import numpy as np

from jaxrl_reason.rewards.answers import (answers_match, boxed_span, check_require, final_answer, tag_span,
                                        visible_text)
from jaxrl_reason.rewards.suite import reward_name
from jaxrl_reason.utils.validation import UNIT, VALID, check_hyperparameters

TAGS = ("<think>", "</think>", "<answer>", "</answer>")
for _name in ("math_verify.parser", "math_verify.grader"):  # its "timeout is disabled" notice (see above), once per call
    logging.getLogger(_name).setLevel(logging.ERROR)
_R1 = re.compile(r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*", re.DOTALL)


def extract_answer(text) -> str | None:
    """Content of the last ``<answer>...</answer>`` span anywhere in ``text``, stripped; None if there is none
    (or not a str). Rewards read ``answers.final_answer`` instead (thinking spans and restatements excluded)."""
    return tag_span(text) if isinstance(text, str) else None


def extract_boxed(text) -> str | None:
    """Content of the last ``\\boxed{...}`` whose braces balance, stripped; None if there is none."""
    return boxed_span(text) if isinstance(text, str) else None


def _column(fields: dict, key: str, n: int) -> Sequence:
    if key not in fields:
        raise ValueError(f"needs the per-row field {key!r}; got fields {sorted(fields)}")
    col = fields[key]
    if len(col) != n:
        raise ValueError(f"field {key!r} has length {len(col)}, expected {n}")
    return col


def _has_answer(prompts: Sequence[str], completions: Sequence[str], require: str) -> np.ndarray:
    """[B] bool: the row has an answer: with ``require="tag"`` a non-empty ``<answer>`` span after any thinking (the
    synthetic tasks' format, where an expression of the prompt's numbers can be the answer, e.g. countdown); else a
    final answer (``answers.final_answer``: restatements are none)."""
    if require == "tag":
        return np.asarray([isinstance(c, str) and bool(tag_span(visible_text(c))) for c in completions], bool)
    return np.asarray([a is not None for a in final_answers(prompts, completions, require)], bool)


def final_answers(prompts: Sequence[str], completions: Sequence[str], require: str = "any") -> list[str | None]:
    """``answers.final_answer`` of every row: [B] answer strings, None where a row has no answer."""
    return [final_answer(c, p, require) for p, c in zip(prompts, completions)]


@dataclasses.dataclass(frozen=True)
class ExactMatch:
    """1 iff the completion's final answer (``answers.final_answer`` with ``require``) equals
    ``fields[answer_field][i]`` after normalisation (``answers.normalize_answer``: ``25.0`` = ``25``)."""

    answer_field: str = "answer"
    require: str = "any"
    name: ClassVar[str] = "exact_match"

    def __post_init__(self):
        check_require(self.require)

    def __call__(self, prompts, completions, **fields) -> np.ndarray:
        gold = _column(fields, self.answer_field, len(completions))
        return np.asarray([answers_match(a, g) for a, g in zip(final_answers(prompts, completions, self.require), gold)],
                          np.float32)


_DELIMITED = ("$", "\\boxed", "\\(", "\\[")


def _parse_math(text: str) -> tuple:
    """math-verify parse (timeouts off) of a bare answer (a gold label or an extracted final answer), read as
    one LaTeX expression (``$text$``; ``2\\pi`` is 2*pi, ``1,2`` a set), falling back to its free-text
    extraction (``\\boxed``, last number)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    config = [LatexExtractionConfig(), ExprExtractionConfig()]
    read = functools.partial(parse, extraction_config=config, parsing_timeout=None)
    parsed = read(f"${text}$") if not any(d in text for d in _DELIMITED) else []
    return tuple(parsed or read(text))


_parse_gold = functools.lru_cache(maxsize=1024)(_parse_math)  # G rows share one


@dataclasses.dataclass(frozen=True)
class MathVerify:
    """1 iff math-verify finds the completion's final answer (``answers.final_answer`` with ``require``: the
    ``<answer>`` span, a ``\\boxed{}``, an explicit "answer is X" / "= X", else the last number; never a
    restatement of the prompt) equal to ``fields[answer_field][i]`` (``1/2`` = ``0.5`` = ``\\frac12``).
    Never raises: rows without an answer, unparsable or failing rows are 0."""

    answer_field: str = "answer"
    require: str = "any"
    name: ClassVar[str] = "math_verify"

    def __post_init__(self):
        check_require(self.require)

    @staticmethod
    def score(gold, answer: str | None) -> float:
        """1.0 iff the extracted ``answer`` (None: no answer) is mathematically equal to ``gold``."""
        from math_verify import verify

        try:
            if answer is None:
                return 0.0
            gold_parsed, pred = _parse_gold(str(gold).strip()), _parse_math(answer)
            if not gold_parsed or not pred:
                return 0.0
            return float(verify(list(gold_parsed), list(pred), timeout_seconds=None))
        except Exception:
            return 0.0

    def __call__(self, prompts, completions, **fields) -> np.ndarray:
        gold = _column(fields, self.answer_field, len(completions))
        return np.asarray([self.score(g, a) for g, a in zip(gold, final_answers(prompts, completions, self.require))],
                          np.float32)


def r1_formatted(prompt: str, completion: str) -> bool:
    """``completion`` is exactly ``<think>..</think><answer>..</answer>`` (whitespace around the tags
    allowed), each tag once; the leading ``<think>`` may be omitted when ``prompt`` ends with it."""
    if isinstance(prompt, str) and prompt.rstrip().endswith("<think>") and "<think>" not in completion:
        completion = "<think>" + completion
    return all(completion.count(t) == 1 for t in TAGS) and _R1.fullmatch(completion) is not None


@dataclasses.dataclass(frozen=True)
class R1Format:
    """1 iff the completion has DeepSeek-R1's format (``r1_formatted``)."""

    name: ClassVar[str] = "r1_format"

    def __call__(self, prompts, completions, **fields) -> np.ndarray:
        return np.asarray([r1_formatted(p, c) for p, c in zip(prompts, completions)], np.float32)


@dataclasses.dataclass(frozen=True)
class Overlong:
    """DAPO's soft overlong punishment on ``L = len(completion_ids[i])``: 0 up to ``max_new_tokens - cache``,
    then linear down to -1 at ``max_new_tokens``, -1 beyond."""

    max_new_tokens: int
    cache: int
    name: ClassVar[str] = "overlong"

    def __post_init__(self):
        if not (isinstance(self.max_new_tokens, int) and isinstance(self.cache, int)
                and 0 < self.cache <= self.max_new_tokens):
            raise ValueError(f"Overlong: need integers 0 < cache <= max_new_tokens, got cache={self.cache!r}, "
                             f"max_new_tokens={self.max_new_tokens!r}")

    def __call__(self, prompts, completions, **fields) -> np.ndarray:
        lens = np.asarray([len(ids) for ids in _column(fields, "completion_ids", len(completions))], np.float64)
        over = (lens - (self.max_new_tokens - self.cache)) / self.cache
        return (np.clip(-over, -1.0, 0.0) + 0.0).astype(np.float32)  # + 0.0: no -0.0


@dataclasses.dataclass(frozen=True)
class RandomReward:
    """Bernoulli(p) per row, independent of the output (spurious rewards): row i of step s is the i-th draw
    of ``np.random.default_rng([seed, s])``."""

    p: float = dataclasses.field(default=0.5, metadata={VALID: UNIT})
    seed: int = 0
    name: ClassVar[str] = "random"

    def __post_init__(self):
        check_hyperparameters(self)
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"RandomReward: seed must be an int >= 0, got {self.seed!r}")

    def __call__(self, prompts, completions, step: int = 0, **fields) -> np.ndarray:
        rng = np.random.default_rng([self.seed, int(step)])
        return (rng.random(len(completions)) < self.p).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class WrongLabel:
    """1 iff the final answer (``require``) equals the row's fixed wrong label ``fields[field][i]`` (spurious
    rewards; ``ExactMatch`` on that field)."""

    field: str = "wrong"
    require: str = "any"
    name: ClassVar[str] = "wrong_label"

    def __post_init__(self):
        check_require(self.require)

    def __call__(self, prompts, completions, **fields) -> np.ndarray:
        return ExactMatch(self.field, self.require)(prompts, completions, **fields)


def _inner(fn, prompts, completions, fields) -> np.ndarray:
    r = np.asarray(fn(prompts, completions, **fields), np.float32)
    if r.shape != (len(completions),):
        raise ValueError(f"inner reward {reward_name(fn)!r} returned shape {r.shape}, expected ({len(completions)},)")
    return r


@dataclasses.dataclass(frozen=True)
class Inverted:
    """1 iff the completion has an answer (``require``: "tag" any ``<answer>`` span, else a final answer that is
    not a restatement) and ``inner`` gives it 0 (spurious rewards)."""

    inner: Any
    require: str = "tag"

    def __post_init__(self):
        check_require(self.require)

    @property
    def name(self) -> str:
        return f"inverted_{reward_name(self.inner)}"

    def __call__(self, prompts, completions, **fields) -> np.ndarray:
        r = _inner(self.inner, prompts, completions, fields)
        return (_has_answer(prompts, completions, self.require) & (r == 0)).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class WithMalformedPenalty:
    """``inner``'s reward, but ``penalty`` for rows without an answer (``require``: by default a non-empty
    ``<answer>`` span after any thinking; "any" / "boxed": a final answer, never a restatement); same name as inner."""

    inner: Any
    penalty: float = 0.0
    require: str = "tag"

    def __post_init__(self):
        check_hyperparameters(self)
        check_require(self.require)

    @property
    def name(self) -> str:
        return reward_name(self.inner)

    def __call__(self, prompts, completions, **fields) -> np.ndarray:
        r = _inner(self.inner, prompts, completions, fields)
        return np.where(_has_answer(prompts, completions, self.require), r, np.float32(self.penalty)).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class TaskCorrect:
    """Correctness on the project's synthetic tasks (``jaxrl_reason.tasks``). Needs the per-row fields
    ``problem`` (a ``Problem``) and ``task`` (its task name; defaults to ``problem.task``): exact-match
    tasks compare the ``<answer>`` span (after any thinking span: ``answers.visible_text``) with
    ``problem.answer``, others call ``task.check`` on it."""

    tasks: Sequence[Any]
    name: ClassVar[str] = "correct"

    def __post_init__(self):
        tasks = tuple(self.tasks)
        names = [t.name for t in tasks]
        if not tasks or len(set(names)) != len(names):
            raise ValueError(f"TaskCorrect: needs tasks with distinct names, got {names}")
        object.__setattr__(self, "tasks", tasks)

    def __call__(self, prompts, completions, **fields) -> np.ndarray:
        by_name = {t.name: t for t in self.tasks}
        problems = _column(fields, "problem", len(completions))
        task_names = fields["task"] if "task" in fields else [p.task for p in problems]
        out = np.zeros(len(completions), np.float32)
        answers = [tag_span(visible_text(c)) if isinstance(c, str) else None for c in completions]
        for i, (answer, problem, tname) in enumerate(zip(answers, problems, task_names)):
            if tname not in by_name:
                raise ValueError(f"TaskCorrect: row {i} has unknown task {tname!r}; known: {sorted(by_name)}")
            task = by_name[tname]
            if answer is not None:
                out[i] = answer == problem.answer if task.exact_match else bool(task.check(answer, problem))
        return out


REWARDS = {
    "exact_match": ExactMatch,
    "math_verify": MathVerify,
    "r1_format": R1Format,
    "overlong": Overlong,
    "random": RandomReward,
    "wrong_label": WrongLabel,
}


def make_reward(name: str, **kwargs):
    """``REWARDS[name](**kwargs)``; an unknown name is a ValueError listing the known ones."""
    if name not in REWARDS:
        raise ValueError(f"make_reward: unknown reward {name!r}; known: {', '.join(sorted(REWARDS))}")
    try:
        return REWARDS[name](**kwargs)
    except TypeError as e:
        raise TypeError(f"make_reward({name!r}): {e}") from e
