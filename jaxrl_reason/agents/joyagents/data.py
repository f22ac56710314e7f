"""Scripted traces for the SFT warm start of the JoyAgents system, rendered with the system's templates.

    convs = scripted_conversations(requests, cfg, TraceNoise(), rng, tokenizer=tok)   # [(prompt, response ids, agent)]
    data = sft_examples([p for p, _, _ in convs], [r for _, r, _ in convs], cfg.seq_len, tok)   # models.lm.sft

Every request gives its four node conversations (route, step 1, step 2 for two-step routes, final) of
the correct solution. ``TraceNoise`` makes the warm start deliberately imperfect so that RL and
memory have room: with probability ``route_noise[type]`` a route target without a hint is the
type's *confusion* route (``CONFUSION``: e.g. a two-step request routed to the QA agent alone).
With probability ``hint_rate`` the route prompt carries the correct strategy as its memory hint
(target always correct), with ``wrong_hint_rate`` a wrong one (target still correct), else "?".

Ids are those of the jitted system for the same tokenizer: request, answer and step texts (calls and
tool results included) are spelled one token per character (``tasks.assistant.spell``: a checkpoint's
byte-level BPE sees valid but non-canonical ids, so the warm start teaches it that spelling), route /
role / hint tokens are the system's single-token ids (``system.SystemIds``); templates as ``system.render``.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxrl_reason.agents.joyagents.system import (
    CALL, FINAL_FIELDS, MASTER, MATH, QA, ROUTE_FIELDS, STEP_FIELDS, SystemConfig, SystemIds, render)
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.tasks.assistant import ROUTES, TYPES, AssistantRequest, spell
from jaxrl_reason.utils.validation import check_hyperparameters

CONFUSION = ("f", "t", "m", "q")  # the wrong route a noisy trace uses, per request type
_STEP_AGENTS = {"m": (MATH,), "q": (QA,), "f": (CALL,), "t": (QA, MATH)}


@dataclasses.dataclass(frozen=True)
class TraceNoise:
    route_noise: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0)  # per request type
    hint_rate: float = 0.5
    wrong_hint_rate: float = 0.1

    def __post_init__(self):
        check_hyperparameters(self)
        if len(self.route_noise) != len(TYPES) or not all(0 <= x <= 1 for x in self.route_noise):
            raise ValueError(f"TraceNoise: route_noise must be {len(TYPES)} probabilities, got {self.route_noise}")
        if not (0 <= self.hint_rate and 0 <= self.wrong_hint_rate and self.hint_rate + self.wrong_hint_rate <= 1):
            raise ValueError(f"TraceNoise: need hint_rate, wrong_hint_rate >= 0 with sum <= 1, got "
                             f"{self.hint_rate}, {self.wrong_hint_rate}")


def scripted_conversations(requests: Sequence[AssistantRequest], config: SystemConfig, noise: TraceNoise,
                           rng: np.random.Generator, *, tokenizer: Tokenizer) -> list[tuple[list[int], list[int], int]]:
    """-> [(prompt ids, response ids + eos, agent)] for every node of every request."""
    ids = SystemIds.from_tokenizer(tokenizer)
    route_t, step_t, final_t = (config.route_template, config.step_template, config.final_template)
    text = lambda s: spell(tokenizer, s)
    out = []
    eos = [ids.eos]
    for r in requests:
        req = text(r.text)
        u = rng.random()
        if u < noise.hint_rate:
            hint, target = ids.route_token(r.route), r.route
        elif u < noise.hint_rate + noise.wrong_hint_rate:
            hint, target = ids.route_token(str(rng.choice([x for x in ROUTES if x != r.route]))), r.route
        else:
            hint = ids.no_hint
            target = CONFUSION[r.kind] if rng.random() < noise.route_noise[r.kind] else r.route
        out.append((render(route_t, ROUTE_FIELDS, {"hint": [hint], "request": req}, tokenizer),
                    [ids.route_token(target)] + eos, MASTER))
        prev: list[int] = []
        for agent, step, res in zip(_STEP_AGENTS[r.route], r.steps, r.results):
            prompt = render(step_t, STEP_FIELDS, {"role": [ids.roles[agent]], "request": req, "prev": prev}, tokenizer)
            out.append((prompt, text(step) + eos, agent))  # a call and the tool's value: as the jitted tool
            prev = text(res)
        out.append((render(final_t, FINAL_FIELDS, {"request": req, "prev": prev}, tokenizer),
                    text(r.answer) + eos, MASTER))
    return out


__all__ = ["CONFUSION", "TraceNoise", "scripted_conversations"]
