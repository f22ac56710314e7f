"""ASTRO procedure cloning: a step-level search tree -> one linear chain of thought.

The chain follows the tree's successful path (root -> a node whose rollout the verifier accepted,
preferring nodes whose own steps closed ``</think>`` and then the most visited, then that node's
rollout) and, at up to ``num_detours`` places along it, first
visits a *failed* sibling branch (a searched child with no verified answer in its subtree, whose step
differs from the successful one), then a reflection + explicit backtrack segment, then continues on the good step:

    <think>3+4=7,7*2=15,wrong!back to 1,7*2=14</think><answer>14</answer>

The detour is the failed child's step (``detour="step"``) or the whole failed attempt
(``detour="attempt"``: the step and the child's rollout up to ``</think>`` when it closes, so that a wrong end result
is in the text, e.g. countdown's ``count 3 5 7 to 22``: ``3+5=8,8*7=56,wrong!back to 0,3*5=15,15+7=22``).

``back to i`` means: keep the first ``i`` steps, drop everything after them (``back to 0`` restarts).
``ClonedTrace.failed_spans`` locates the failed steps in the trace, so that SFT can leave them out of
the loss (the model still reads them) and learn to recognise and undo a wrong step without learning to
write one (``tasks.base.sft_batch(skip_spans=...)``).
Deterministic given the tree and the seed. ``num_detours=0`` gives the "direct" variant (only the
successful path). Host-side numpy: this builds an SFT dataset, it is not a hot path. The tree's token ids
are decoded with the tokenizer the search ran with (``models.tokenizer``, e.g. ``CharTokenizer``);
``failed_spans`` are character spans, so skipping them in SFT needs text spelled one token per character
(``CharTokenizer``, or a checkpoint's byte-level BPE through ``models.tokenizer.SpelledTokenizer``).

    trace = clone_procedure(result.tree, b, CloningConfig(num_detours=1), seed, tokenizer=tok)   # inner <think> text
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable

import numpy as np

from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.utils.validation import check_hyperparameters

_ANSWER = re.compile(r"<answer>(.*?)</answer>")


@dataclasses.dataclass(frozen=True)
class CloningConfig:
    num_detours: int = 1  # failed branches visited before the successful step (0 = direct)
    reflection: str = "wrong!back to {step},"  # must contain {step}, no tags; ends with the step delimiter
    detour: str = "step"  # "step": the failed child's step; "attempt": the step and its rollout's reasoning

    def __post_init__(self):
        check_hyperparameters(self)
        if self.detour not in ("step", "attempt"):
            raise ValueError(f"CloningConfig.detour must be 'step' or 'attempt', got {self.detour!r}")
        if self.num_detours < 0:
            raise ValueError(f"CloningConfig.num_detours must be >= 0, got {self.num_detours}")
        if "{step}" not in self.reflection or "<" in self.reflection:
            raise ValueError(f"CloningConfig.reflection must contain '{{step}}' and no tags, got {self.reflection!r}")


@dataclasses.dataclass(frozen=True)
class ClonedTrace:
    think: str  # text between <think> and </think>
    answer: str  # the verified answer
    detours: int  # backtracks actually inserted
    direct: str  # the successful path's think text without detours
    failed_spans: tuple[tuple[int, int], ...] = ()  # [start, end) character spans of the failed steps in think


def _node(tree, b: int) -> dict:
    """The arrays of problem ``b`` of a (device) tree, as numpy."""
    e = tree.embeddings
    get = lambda x: np.asarray(x[b])
    return dict(visits=get(tree.node_visits), parents=get(tree.parents),
                children=get(tree.children_index), response=get(e.response), response_len=get(e.response_len),
                rollout=get(e.rollout), rollout_len=get(e.rollout_len), correct=get(e.correct))


def _text(tokenizer: Tokenizer, ids, n) -> str:
    return tokenizer.decode(np.asarray(ids)[: int(n)].tolist())


def _as_step(text: str) -> str:
    """A failed step written mid-chain: its closing ``</think>`` (or nothing) becomes ``,``."""
    text = text.split("</think>")[0]
    return text if text.endswith(",") else text + ","


def clone_procedure(tree, b: int, config: CloningConfig, seed: int,
                    shows_mistake: Callable[[str], bool] | None = None, *, tokenizer: Tokenizer) -> ClonedTrace | None:
    """Linearise problem ``b``'s tree; ``None`` when the search found no verified answer.

    ``tokenizer``: the one whose ids the tree holds (the search's), to decode its responses and rollouts.

    ``shows_mistake`` (optional): a check of a detour's text (steps ending with ``,``), e.g.
    ``lambda t: not tasks.calc_steps.step_is_valid(t)``; when given, a failed sibling is used as a
    detour only if its text shows the mistake, so every reflection follows a visible one (a step whose
    rollouts merely failed is not called wrong).
    """
    t = _node(tree, b)
    good = np.flatnonzero((t["visits"] > 0) & t["correct"])
    if good.size == 0:
        return None
    # a verified node that closed the reasoning inside the tree first, then the most visited one
    _text_of = functools.partial(_text, tokenizer)
    closed = np.array(["</think>" in _text_of(t["response"][n], t["response_len"][n]) for n in good])
    target = int(good[np.lexsort((-t["visits"][good], ~closed))[0]])
    path = [target]
    while t["parents"][path[-1]] >= 0:
        path.append(int(t["parents"][path[-1]]))
    path = path[::-1]  # root ... target
    resp = lambda n: _text_of(t["response"][n], t["response_len"][n])
    edge = lambda p, c: resp(c)[len(resp(p)):]  # the step the edge parent -> child appended
    steps = [edge(p, c) for p, c in zip(path, path[1:])]
    tail = _text_of(t["rollout"][target], t["rollout_len"][target])
    if "</think>" in resp(target):  # the path itself closed the reasoning; the rollout only answers
        think_tail, rest = "", tail
    else:
        think_tail, _, rest = tail.partition("</think>")
    answer = _ANSWER.search(rest)
    answer = answer.group(1) if answer else ""

    # failed siblings at each depth j (children of path[j] other than path[j+1], searched, no verified answer
    # below them: read from the tree, not from node values, which a graded process value makes positive)
    verified_below = np.zeros(t["visits"].shape, bool)
    for n in good:
        while n >= 0 and not verified_below[n]:
            verified_below[n] = True
            n = int(t["parents"][n])
    def detour(p, c) -> str:
        text = _as_step(edge(p, c))
        if config.detour == "attempt" and "</think>" not in edge(p, c):
            rest, closed, _ = _text_of(t["rollout"][c], t["rollout_len"][c]).partition("</think>")
            text += _as_step(rest) if closed and rest else ""  # an unclosed rollout: the step alone
        return text

    options = {}
    for j, (p, nxt) in enumerate(zip(path, path[1:])):
        kids = [int(c) for c in t["children"][p] if c >= 0 and c != nxt]
        failed = [c for c in kids if t["visits"][c] > 0 and not verified_below[c]
                  and edge(p, c) != steps[j] and (shows_mistake is None or shows_mistake(detour(p, c)))]
        if failed:
            options[j] = failed
    rng = np.random.default_rng(seed)
    where = sorted(rng.choice(sorted(options), size=min(config.num_detours, len(options)), replace=False).tolist()) \
        if options and config.num_detours else []

    pieces, failed = [], []
    for j, step in enumerate(steps):
        if j in where:
            c = options[j][int(rng.integers(len(options[j])))]
            failed.append(len(pieces))
            pieces.append(detour(path[j], c))
            pieces.append(config.reflection.format(step=j))
        pieces.append(step)
    strip = lambda s: s.removeprefix("<think>").split("</think>")[0]
    think = strip("<think>" + "".join(pieces) + think_tail)
    starts = np.cumsum([0] + [len(x) for x in pieces])  # the pieces start think (strip drops only the added tag)
    spans = tuple((int(starts[i]), min(int(starts[i + 1]), len(think))) for i in failed if starts[i] < len(think))
    return ClonedTrace(think=think, answer=answer, detours=len(where), direct=strip("<think>" + "".join(steps) + think_tail),
                       failed_spans=spans)


def count_backtracks(text: str, config: CloningConfig = CloningConfig()) -> int:
    """Number of backtrack segments in a generated response (the reflection text before ``{step}``)."""
    return text.count(config.reflection.split("{step}")[0])
