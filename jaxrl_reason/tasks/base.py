"""Problems, the task protocol and padded problem batches.

A task is a seeded generator with a difficulty knob: ``task.generate(rng, difficulty) -> Problem``
(host-side numpy/fractions; problem text is tiny). ``make_batch`` turns problems into fixed-shape
token arrays (ids of the given tokenizer, ``models.tokenizer``) for the jitted sampler and rewards:

    batch = make_batch(task, np.random.default_rng([seed, step]), n=32, prompt_len=24, answer_len=12,
                       tokenizer=CharTokenizer())
    batch.prompts [n, prompt_len] (<bos> + prompt, right-padded), batch.prompt_lens [n]
    batch.answers [n, answer_len], batch.answer_lens [n]   (exact answer string, for exact-match tasks)
    batch.wrong   [n, answer_len], batch.wrong_lens [n]    (a fixed wrong label, for spurious rewards)
    batch.difficulty [n], batch.task_id [n]
    batch.problems: tuple of the host-side Problem objects (static metadata, host-only rewards)

Every response is ``<think>trace</think><answer>answer</answer>`` (``response_text``; the tags are the
template's, encoded as control tokens, the trace and answer are data, encoded as plain text).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence

import flax
import jax
import numpy as np

from jaxrl_reason.data.prompts import render_prompt
from jaxrl_reason.models.lm.sft import sft_examples
from jaxrl_reason.models.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class Problem:
    prompt: str  # the problem text (without <bos>)
    answer: str  # canonical exact answer (for exact-match tasks; one valid answer otherwise)
    wrong: str  # a fixed wrong answer (wrong-label reward variant)
    trace: str  # a worked reasoning trace (SFT warm-start data)
    difficulty: int
    task: str


class Task(Protocol):
    name: str
    exact_match: bool  # True: reward = exact string match of the answer span (jit-able on token ids)
    min_difficulty: int
    max_difficulty: int

    def generate(self, rng: np.random.Generator, difficulty: int | None = None) -> Problem: ...

    def check(self, answer: str, problem: Problem) -> bool:
        """Host-side verifier (used when ``exact_match`` is False); never raises."""
        ...


def response_text(p: Problem, with_trace: bool = True) -> str:
    think = p.trace if with_trace else ""
    return f"<think>{think}</think><answer>{p.answer}</answer>"


def response_ids(tokenizer: Tokenizer, p: Problem, with_trace: bool = True, trace_special: bool = False) -> list[int]:
    """``response_text`` as ids: the four tags as control tokens, trace and answer as plain text (with
    ``trace_special`` the trace's control-token strings stay control tokens: for text the model wrote)."""
    tag = lambda t: tokenizer.encode(t, allow_special=True)
    trace = tokenizer.encode(p.trace, allow_special=trace_special) if with_trace else []
    return (tag("<think>") + trace + tag("</think>") + tag("<answer>")
            + tokenizer.encode(p.answer) + tag("</answer>"))


def prompt_ids(tokenizer: Tokenizer, p: Problem, fmt=None) -> list[int]:
    """``<bos>`` + the problem text (plain text), or with ``fmt`` (a ``data.PromptFormat``, e.g. a
    checkpoint's chat template) the problem text rendered by ``data.render_prompt``."""
    if fmt is None:
        return [tokenizer.bos_id] + tokenizer.encode(p.prompt)
    return render_prompt(tokenizer, {"prompt": p.prompt}, "prompt", fmt)[1]


@flax.struct.dataclass
class ProblemBatch:
    prompts: jax.Array
    prompt_lens: jax.Array
    answers: jax.Array
    answer_lens: jax.Array
    wrong: jax.Array
    wrong_lens: jax.Array
    difficulty: jax.Array
    task_id: jax.Array
    problems: tuple = flax.struct.field(pytree_node=False, default=())

    def __len__(self) -> int:
        return self.prompts.shape[0]

    def take(self, idx) -> "ProblemBatch":
        """Rows ``idx`` (host-side int array)."""
        idx = np.asarray(idx)
        arrays = {f.name: np.asarray(getattr(self, f.name))[idx] for f in dataclasses.fields(self) if f.name != "problems"}
        return ProblemBatch(**arrays, problems=tuple(self.problems[i] for i in idx.tolist()))

    def repeat(self, g: int) -> "ProblemBatch":
        """Each problem ``g`` times in a row ([n] -> [n*g], group-major)."""
        return self.take(np.repeat(np.arange(len(self)), g))


def sample_problems(tasks: Sequence[Task], weights, rng: np.random.Generator, n: int,
                    difficulty: int | None = None) -> tuple[list[Problem], np.ndarray]:
    weights = np.asarray(weights, np.float64)
    ids = rng.choice(len(tasks), size=n, p=weights / weights.sum())
    return [tasks[i].generate(rng, difficulty) for i in ids], ids.astype(np.int32)


def batch_from_problems(problems: Sequence[Problem], task_ids, prompt_len: int, answer_len: int, *,
                        tokenizer: Tokenizer, fmt=None) -> ProblemBatch:
    prompts, plens = tokenizer.pad_batch([prompt_ids(tokenizer, p, fmt) for p in problems], prompt_len)
    answers, alens = tokenizer.pad_batch([tokenizer.encode(p.answer) for p in problems], answer_len)
    wrong, wlens = tokenizer.pad_batch([tokenizer.encode(p.wrong) for p in problems], answer_len)
    return ProblemBatch(
        prompts=prompts, prompt_lens=plens, answers=answers, answer_lens=alens, wrong=wrong, wrong_lens=wlens,
        difficulty=np.asarray([p.difficulty for p in problems], np.int32), task_id=np.asarray(task_ids, np.int32),
        problems=tuple(problems),
    )


def make_batch(tasks: Task | Sequence[Task], rng: np.random.Generator, n: int, prompt_len: int, answer_len: int,
               weights=None, difficulty: int | None = None, *, tokenizer: Tokenizer, fmt=None) -> ProblemBatch:
    """``n`` fresh problems from one task or a weighted mix (task_id = index in ``tasks``)."""
    tasks = [tasks] if not isinstance(tasks, (list, tuple)) else list(tasks)
    weights = np.ones(len(tasks)) if weights is None else weights
    problems, ids = sample_problems(tasks, weights, rng, n, difficulty)
    return batch_from_problems(problems, ids, prompt_len, answer_len, tokenizer=tokenizer, fmt=fmt)


def sft_batch(problems: Sequence[Problem], seq_len: int, with_trace: bool = True,
              skip_spans: Sequence[Sequence[tuple[int, int]]] | None = None, *, tokenizer: Tokenizer,
              trace_special: bool = False) -> dict:
    """Supervised warm-start batch: tokens [B, seq_len] = <bos> prompt response <eos>, loss on the response.

    ``loss_mask`` [B, seq_len-1] is 1 where the target token (tokens[:, t+1]) belongs to the response.
    ``skip_spans`` (per problem, ``[start, end)`` character spans of its trace, e.g.
    ``ClonedTrace.failed_spans``): those trace tokens stay in the input but get no loss.
    ``trace_special``: traces the model wrote (search traces) keep their control tokens (``response_ids``).
    """
    if skip_spans is not None and (len(skip_spans) != len(problems) or not with_trace):
        raise ValueError("sft_batch: skip_spans needs with_trace=True and one span list per problem "
                         f"(got {len(skip_spans)} for {len(problems)} problems)")
    prompts = [prompt_ids(tokenizer, p) for p in problems]
    out = sft_examples(prompts, [response_ids(tokenizer, p, with_trace, trace_special) for p in problems], seq_len,
                       tokenizer)
    starts, mask = [len(q) for q in prompts], out["loss_mask"].astype(bool)
    for i, spans in enumerate(skip_spans or ()):
        for a, b in spans:
            # character i of the trace must be its token i (a character-level tokenizer)
            head = tokenizer.encode(problems[i].trace[:b], allow_special=trace_special)
            if not 0 <= a <= b <= len(problems[i].trace) or len(head) != b:
                raise ValueError(f"sft_batch: span {(a, b)} is not a character span of trace {problems[i].trace!r}")
            first = starts[i] + len(tokenizer.encode("<think>", allow_special=True)) + a  # trace character a
            mask[i, max(first - 1, 0): first + b - a - 1] = False  # targets tokens[first : first + b - a]
    return {"tokens": out["tokens"], "loss_mask": mask.astype(np.float32)}

