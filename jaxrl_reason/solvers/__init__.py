"""Krylov solvers (GMRES / flexible GMRES), preconditioners, finance linear systems,
the RL block-size environment and learned preconditioners. See ``krylov.py`` for precision
(float64 needs ``jax_enable_x64``) and the result/status conventions.

Importing this package registers the block-size environment as ``envs.make("fgmres_blocksize")``
(imported on first use)."""

from jaxrl_reason import envs
from jaxrl_reason.solvers.krylov import STATUS_MESSAGES, KrylovResult, fgmres, gmres, status_message

envs.register("fgmres_blocksize", "jaxrl_reason.solvers.blocksize_env:BlockSizeEnv")

__all__ = ["STATUS_MESSAGES", "KrylovResult", "fgmres", "gmres", "status_message"]
