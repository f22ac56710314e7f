"""The LM learner and its parts: ``Learner`` / ``LearnerConfig`` (learner.py, its jitted programs in programs.py:
every LM agent is a rollout it trains), ``Rollout`` (rollout.py: what a rollout hands it), the registered advantage
estimators (advantages.py) and policy objectives (loss.py), one policy update ``make_update`` / ``UpdateConfig``
(update.py), the policy's response log-probs with a remat choice (logp.py), the one optimiser (optim.py), the
multi-turn engine (multiturn.py; its host-env path in host_rollout.py), user rollouts from a file (agents.py) and the
plan of a run's memory and compute before it starts (plan.py)."""

from jaxrl_reason.rl.lm.advantages import ESTIMATORS, register_estimator
from jaxrl_reason.rl.lm.learner import Learner, LearnerConfig, LearnerState
from jaxrl_reason.rl.lm.logp import REMAT, lm_logp_fn, remat_graphdef, trainable_rows_only
from jaxrl_reason.rl.lm.loss import OBJECTIVES, LossConfig, register_objective
from jaxrl_reason.rl.lm.optim import ADAM_B2, lm_optimizer
from jaxrl_reason.rl.lm.plan import Plan, PlanError
from jaxrl_reason.rl.lm.rollout import Rollout
from jaxrl_reason.rl.lm.update import OLD_LOGP, UpdateConfig, make_update

__all__ = ["ADAM_B2", "ESTIMATORS", "Learner", "LearnerConfig", "LearnerState", "LossConfig", "OBJECTIVES", "OLD_LOGP",
           "Plan", "PlanError", "REMAT", "Rollout", "UpdateConfig", "lm_logp_fn", "lm_optimizer", "make_update",
           "register_estimator", "register_objective", "remat_graphdef", "trainable_rows_only"]
