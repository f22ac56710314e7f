"""Moved to ``rl.update`` (the learner core and the on-policy trainer share it); this path re-exports it."""

from jaxrl_reason.rl.update import gradient_step, minibatch_epochs

__all__ = ["gradient_step", "minibatch_epochs"]
