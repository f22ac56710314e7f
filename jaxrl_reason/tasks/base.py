"""Problems, the task protocol and padded problem batches.

A task is a seeded generator with a difficulty knob: ``task.generate(rng, difficulty) -> Problem``
(host-side numpy/fractions; problem text is tiny). ``make_batch`` turns problems into fixed-shape
token arrays for the jitted sampler, trainer and rewards:

    batch = make_batch(task, np.random.default_rng([seed, step]), n=32, prompt_len=24, answer_len=12)
    batch.prompts [n, prompt_len] (<bos> + prompt, right-padded), batch.prompt_lens [n]
    batch.answers [n, answer_len], batch.answer_lens [n]   (exact answer string, for exact-match tasks)
    batch.wrong   [n, answer_len], batch.wrong_lens [n]    (a fixed wrong label, for spurious rewards)
    batch.difficulty [n], batch.task_id [n]
    batch.problems: tuple of the host-side Problem objects (static metadata, host-only rewards)

Every response is ``<think>trace</think><answer>answer</answer>`` (``response_text``).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence

import flax
import jax
import numpy as np

from jaxrl_reason.tasks.vocab import VOCAB


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


def batch_from_problems(problems: Sequence[Problem], task_ids, prompt_len: int, answer_len: int) -> ProblemBatch:
    prompts, plens = VOCAB.pad_batch([[VOCAB.bos] + VOCAB.encode(p.prompt) for p in problems], prompt_len)
    answers, alens = VOCAB.pad_batch([VOCAB.encode(p.answer) for p in problems], answer_len)
    wrong, wlens = VOCAB.pad_batch([VOCAB.encode(p.wrong) for p in problems], answer_len)
    return ProblemBatch(
        prompts=prompts, prompt_lens=plens, answers=answers, answer_lens=alens, wrong=wrong, wrong_lens=wlens,
        difficulty=np.asarray([p.difficulty for p in problems], np.int32), task_id=np.asarray(task_ids, np.int32),
        problems=tuple(problems),
    )


def make_batch(tasks: Task | Sequence[Task], rng: np.random.Generator, n: int, prompt_len: int, answer_len: int,
               weights=None, difficulty: int | None = None) -> ProblemBatch:
    """``n`` fresh problems from one task or a weighted mix (task_id = index in ``tasks``)."""
    tasks = [tasks] if not isinstance(tasks, (list, tuple)) else list(tasks)
    weights = np.ones(len(tasks)) if weights is None else weights
    problems, ids = sample_problems(tasks, weights, rng, n, difficulty)
    return batch_from_problems(problems, ids, prompt_len, answer_len)


def sft_batch(problems: Sequence[Problem], seq_len: int, with_trace: bool = True,
              skip_spans: Sequence[Sequence[tuple[int, int]]] | None = None) -> dict:
    """Supervised warm-start batch: tokens [B, seq_len] = <bos> prompt response <eos>, loss on the response.

    ``loss_mask`` [B, seq_len-1] is 1 where the target token (tokens[:, t+1]) belongs to the response.
    ``skip_spans`` (per problem, ``[start, end)`` character spans of its trace, e.g.
    ``ClonedTrace.failed_spans``): those trace tokens stay in the input but get no loss.
    """
    if skip_spans is not None and (len(skip_spans) != len(problems) or not with_trace):
        raise ValueError("sft_batch: skip_spans needs with_trace=True and one span list per problem "
                         f"(got {len(skip_spans)} for {len(problems)} problems)")
    seqs, starts = [], []
    for p in problems:
        prompt = [VOCAB.bos] + VOCAB.encode(p.prompt)
        seqs.append(prompt + VOCAB.encode(response_text(p, with_trace)))
        starts.append(len(prompt))
    tokens, lens = VOCAB.pad_batch(seqs, seq_len)
    t = np.arange(seq_len - 1)[None]
    mask = (t + 1 >= np.asarray(starts)[:, None]) & (t + 1 < lens[:, None])
    for i, spans in enumerate(skip_spans or ()):
        for a, b in spans:
            # character i of the trace must be its token i (no tag before b)
            if not 0 <= a <= b <= len(problems[i].trace) or len(VOCAB.encode(problems[i].trace[:b])) != b:
                raise ValueError(f"sft_batch: span {(a, b)} is not a character span of trace {problems[i].trace!r}")
            first = starts[i] + 1 + a  # token position of trace character a (after <think>)
            mask[i, max(first - 1, 0): first + b - a - 1] = False  # targets tokens[first : first + b - a]
    return {"tokens": tokens, "loss_mask": mask.astype(np.float32)}
