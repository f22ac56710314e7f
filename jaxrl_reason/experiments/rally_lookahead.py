"""Is the lookahead's gain over the RALLY prior learnable by a role policy? (An analysis for RMIX.)

``prior_lookahead`` (``agents.rally.lookahead``: privileged, exact one-step policy improvement over
single-UAV role changes) beats the scripted prior by about +0.5 return on the 4-UAV swarm, so roles-only
RMIX has room in principle. This script asks whether that gain can be learned from per-decision
observations at all, with the best possible signal: the lookahead's own choices as labels.

1. The lookahead plays ``teacher_episodes`` episodes; every (step, UAV) decision is recorded with its
   features and the lookahead's role (the prior's role, except where the lookahead changed it).
2. A classifier (MLP; ``agents.rally.student``) learns the role from ``local`` features (exactly the RMIX agent net's input:
   the UAV's observation, its id and the prior's proposal) or ``global`` ones (plus the swarm's global
   state), role changes weighted ``change_weight`` x.
3. The student plays: the prior's action, with the role the classifier prefers when its probability
   exceeds a threshold; paired return difference to the prior on ``eval_episodes`` episodes (the
   evaluation key of ``experiments/rally.py``).

    python experiments/rally_lookahead.py --preset cpu    # ~2 min
    python experiments/rally_lookahead.py --preset full   # 4x the decisions, 3x the training (~8 min)
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_reason import envs
from jaxrl_reason.agents.rally import evaluate as rally_eval
from jaxrl_reason.agents.rally import student
from jaxrl_reason.agents.rally.intent import RulePrior, act
from jaxrl_reason.agents.rally.lookahead import lookahead_policy
from jaxrl_reason.agents.rally.student import FEATURES
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    num_agents: int = 4
    num_targets: int = 3
    max_steps: int = 50
    teacher_episodes: int = 1024
    features: tuple[str, ...] = FEATURES
    hidden: int = 128
    train_steps: int = 6000
    batch_size: int = 512
    lr: float = 1e-3
    change_weight: float = 5.0
    thresholds: tuple[float, ...] = (0.5, 0.7, 0.9)
    eval_episodes: int = 512

    def __post_init__(self):
        check_hyperparameters(self)
        if not self.features or any(f not in FEATURES for f in self.features):
            raise ValueError(f"features must be a non-empty subset of {FEATURES}, got {self.features}")
        if min(self.teacher_episodes, self.train_steps, self.batch_size, self.eval_episodes, self.hidden) < 1:
            raise ValueError("teacher_episodes, train_steps, batch_size, eval_episodes and hidden must be >= 1")
        if not all(0.0 < t < 1.0 for t in self.thresholds) or self.change_weight <= 0:
            raise ValueError("thresholds must be in (0, 1) and change_weight > 0")


PRESETS = {"cpu": Config(), "full": Config(teacher_episodes=4096, train_steps=20000)}


def run(config: Config, run_dir: RunDir) -> dict:
    env = envs.make("swarm", num_agents=config.num_agents, num_targets=config.num_targets, max_steps=config.max_steps)
    prior = RulePrior(env)
    k_teacher, k_fit = jax.random.split(jax.random.key(config.seed + 1))
    k_eval = jax.random.split(jax.random.key(config.seed), 3)[1]  # experiments/rally.py's evaluation key
    play = lambda fn, **kw: np.asarray(jax.jit(functools.partial(
        rally_eval.play, env, fn, num_episodes=config.eval_episodes, **kw))(jnp.zeros(()), k_eval)["return"])
    base = play(lambda c, k, ts: (c, act(prior, k, ts)))
    se = lambda d: float(d.std() / np.sqrt(d.size))
    d = play(lookahead_policy(env, prior), with_state=True) - base
    rows = [{"policy": "prior_lookahead (teacher)", "features": "state + simulator", "threshold": "",
             "recall": 1.0, "precision": 1.0, "vs_prior": float(d.mean()), "vs_prior_se": se(d)}]
    data = student.teacher_decisions(env, prior, k_teacher, config.teacher_episodes, config.features)
    changed = data["role"] != data["prior_role"]
    print(f"teacher: {changed.size} decisions, {changed.mean():.4f} role changes", flush=True)
    for kind in config.features:
        weight = np.where(changed, config.change_weight, 1.0).astype(np.float32)
        graphdef, params = student.fit(config, data[f"x/{kind}"], data["role"], weight, k_fit)
        probs = np.asarray(jax.nn.softmax(jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))(params, data[f"x/{kind}"]), -1))
        for t in config.thresholds:  # recall / precision of role changes on the training decisions
            pred = np.where(probs.max(-1) >= t, probs.argmax(-1), data["prior_role"])
            says_change = pred != data["prior_role"]
            d = play(student.student_policy(env, prior, kind, graphdef, params, t)) - base
            rows.append({"policy": "student", "features": kind, "threshold": t,
                         "recall": float(np.mean(pred[changed] == data["role"][changed])),
                         "precision": float(np.mean((pred == data["role"])[says_change])) if says_change.any() else 0.0,
                         "vs_prior": float(d.mean()), "vs_prior_se": se(d)})
            print(rows[-1], flush=True)
    print(run_dir.write_table("results", rows))
    summary = {"teacher_decisions": int(changed.size), "change_rate": float(changed.mean()), "results": rows,
               "prior_return": float(base.mean()), "run_dir": str(run_dir.path)}
    run_dir.save_json("summary.json", summary)
    return summary


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
