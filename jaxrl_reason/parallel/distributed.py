"""Multi-host entry: ``jax.distributed.initialize`` from flags or environment variables.

Variables: ``JAXRL_COORDINATOR`` (host:port), ``JAXRL_NUM_PROCESSES``,
``JAXRL_PROCESS_ID`` (the standard ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``,
``JAX_PROCESS_ID`` work too). On managed clusters (TPU pods, SLURM) call
``initialize()`` with nothing set and JAX detects the cluster itself.
On CPU the gloo collectives are selected so processes can all-reduce.
"""

from __future__ import annotations

import os

import jax


def _env(*names: str) -> str | None:
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    cpu: bool | None = None,
) -> bool:
    """Join a multi-process run. Returns False (and does nothing) for one process.

    Must run before any other JAX call that touches devices.
    """
    coordinator = coordinator or _env("JAXRL_COORDINATOR", "JAX_COORDINATOR_ADDRESS")
    num = num_processes if num_processes is not None else _env("JAXRL_NUM_PROCESSES", "JAX_NUM_PROCESSES")
    pid = process_id if process_id is not None else _env("JAXRL_PROCESS_ID", "JAX_PROCESS_ID")
    num = int(num) if num is not None else None
    if num is not None and num <= 1:
        return False
    if coordinator is None and num is None:
        return False
    if coordinator is None or num is None or pid is None:
        raise ValueError(
            "multi-process run needs the coordinator address, the number of processes and this "
            f"process id (got coordinator={coordinator}, num_processes={num}, process_id={pid}); "
            "set JAXRL_COORDINATOR, JAXRL_NUM_PROCESSES and JAXRL_PROCESS_ID"
        )
    if not 0 <= int(pid) < num:
        raise ValueError(f"process id {pid} must be in [0, {num})")
    if cpu if cpu is not None else os.environ.get("JAX_PLATFORMS", "") in ("", "cpu"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num, process_id=int(pid))
    return True
