"""The learner core of the LM RL trainers: ``Rollout`` (rollout.py), ``make_update`` / ``UpdateConfig``
(learner.py), the policy's response log-probs with a remat choice (logp.py), the one optimiser (optim.py),
and the plan of a run's memory and compute before it starts (plan.py)."""

from jaxrl_reason.rl.lm.learner import OLD_LOGP, UpdateConfig, make_update
from jaxrl_reason.rl.lm.logp import REMAT, lm_logp_fn, remat_graphdef, trainable_rows_only
from jaxrl_reason.rl.lm.optim import ADAM_B2, lm_optimizer
from jaxrl_reason.rl.lm.plan import Plan, PlanError, plan_grpo
from jaxrl_reason.rl.lm.rollout import Rollout

__all__ = ["ADAM_B2", "OLD_LOGP", "Plan", "PlanError", "REMAT", "Rollout", "UpdateConfig", "lm_logp_fn",
           "lm_optimizer", "make_update", "plan_grpo", "remat_graphdef",
           "trainable_rows_only"]
