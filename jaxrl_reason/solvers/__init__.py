"""Krylov solvers (GMRES / flexible GMRES), preconditioners, finance linear systems,
the RL block-size environment and learned preconditioners. See ``krylov.py`` for precision
(float64 needs ``jax_enable_x64``) and the result/status conventions."""

from jaxrl_reason.solvers.krylov import STATUS_MESSAGES, KrylovResult, fgmres, gmres, status_message

__all__ = ["STATUS_MESSAGES", "KrylovResult", "fgmres", "gmres", "status_message"]
