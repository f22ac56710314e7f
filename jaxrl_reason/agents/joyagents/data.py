"""Scripted traces for the SFT warm start of the JoyAgents system, rendered with the system's templates.

    convs = scripted_conversations(requests, cfg, TraceNoise(), rng)   # [(prompt ids, response ids, agent)]
    data = conversation_arrays([(p, r) for p, r, _ in convs], cfg.seq_len)   # memagent's SFT arrays

Every request gives its four node conversations (route, step 1, step 2 for two-step routes, final) of
the correct solution. ``TraceNoise`` makes the warm start deliberately imperfect so that RL and
memory have room: with probability ``route_noise[type]`` a route target without a hint is the
type's *confusion* route (``CONFUSION``: e.g. a two-step request routed to the QA agent alone).
With probability ``hint_rate`` the route prompt carries the correct strategy as its memory hint
(target always correct), with ``wrong_hint_rate`` a wrong one (target still correct), else "?".
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxrl_reason.agents.joyagents.system import CALL, MASTER, MATH, NO_HINT, QA, ROLE_CHARS, SystemConfig
from jaxrl_reason.agents.memagent.agent import render
from jaxrl_reason.tasks.assistant import ROUTES, TYPES, AssistantRequest
from jaxrl_reason.tasks.vocab import VOCAB
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


def _ids(text: str) -> list[int]:
    return VOCAB.encode(text)


def scripted_conversations(requests: Sequence[AssistantRequest], config: SystemConfig, noise: TraceNoise,
                           rng: np.random.Generator) -> list[tuple[list[int], list[int], int]]:
    """-> [(prompt ids, response ids + <eos>, agent)] for every node of every request."""
    out = []
    eos = [VOCAB.eos]
    for r in requests:
        req = _ids(r.text)
        u = rng.random()
        if u < noise.hint_rate:
            hint, target = r.route, r.route
        elif u < noise.hint_rate + noise.wrong_hint_rate:
            hint, target = str(rng.choice([x for x in ROUTES if x != r.route])), r.route
        else:
            hint = NO_HINT
            target = CONFUSION[r.kind] if rng.random() < noise.route_noise[r.kind] else r.route
        out.append((render(config.route_template, ("hint", "request"), {"hint": _ids(hint), "request": req}),
                    _ids(target) + eos, MASTER))
        prev: list[int] = []
        for agent, step, res in zip(_STEP_AGENTS[r.route], r.steps, r.results):
            prompt = render(config.step_template, ("role", "request", "prev"),
                            {"role": _ids(ROLE_CHARS[agent]), "request": req, "prev": prev})
            out.append((prompt, _ids(step) + eos, agent))
            prev = _ids(res)
        out.append((render(config.final_template, ("request", "prev"), {"request": req, "prev": prev}),
                     _ids(r.answer) + eos, MASTER))
    return out


__all__ = ["CONFUSION", "TraceNoise", "scripted_conversations"]
