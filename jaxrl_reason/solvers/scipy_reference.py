"""The scipy anchor of the Krylov benchmarks, host-side: ILU with the anchor script's settings
(``experiments/anchors/bench_gmres.py``) and GMRES that reports its inner iterations. Shared by
``experiments/bench_krylov.py`` and ``experiments/fgmres_finance.py``."""

from __future__ import annotations

import numpy as np
import scipy.sparse.linalg as spla


def spilu_preconditioner(A) -> spla.LinearOperator | None:
    """``spilu(A)`` (drop_tol 1e-4, fill_factor 10) as a preconditioner; None when scipy finds the
    factor exactly singular (the anchor fails on that system)."""
    try:
        ilu = spla.spilu(A.tocsc(), drop_tol=1e-4, fill_factor=10)
    except RuntimeError:
        return None
    return spla.LinearOperator(A.shape, ilu.solve)


def gmres(A, b: np.ndarray, M=None, *, rtol: float, restart: int, maxiter: int) -> tuple[np.ndarray, int]:
    """scipy GMRES(``restart``) to ``rtol``; ``maxiter`` inner iterations, rounded down to whole restart
    cycles (at least one), as our solvers count them. Returns ``(x, inner iterations)``."""
    count = [0]
    x, _ = spla.gmres(A, b, M=M, rtol=rtol, restart=restart, maxiter=max(1, maxiter // restart),
                      callback=lambda _: count.__setitem__(0, count[0] + 1), callback_type="pr_norm")
    return x, count[0]
