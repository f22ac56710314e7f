"""Multi-process runs on JAX's distributed runtime: joining one, and agreeing across its processes.

``initialize`` joins a run; the first source that names one wins:

1. arguments (the CLI's ``--coordinator HOST:PORT --num-processes N --process-id I``);
2. ``JAXRL_COORDINATOR`` / ``JAXRL_NUM_PROCESSES`` / ``JAXRL_PROCESS_ID`` (or JAX's own
   ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``);
3. cluster detection by JAX (``jax.distributed.initialize()`` with no arguments): asked for with
   ``coordinator="auto"`` (any cluster JAX knows: Cloud TPU pods, SLURM, Open MPI, Kubernetes), and
   taken without asking inside ``srun`` with more than one task (``SLURM_NTASKS > 1`` and
   ``SLURM_STEP_NODELIST`` set) or on a multi-host TPU slice (``TPU_WORKER_HOSTNAMES`` lists > 1 host).

With none of these it is a one-process run and nothing is done. On CPU the gloo collectives are
selected so processes can all-reduce. Waiting is bounded by ``timeout`` seconds: a process other
than 0 first waits for the coordinator's port to accept connections and raises ``DistributedError``
if it does not; a process whose peers have not all joined within the timeout (process 0, which serves
the coordinator, waits for all of them) prints a one-line ``DistributedError`` and exits with status 1.

Agreement (every process must call these in the same order; one process: no communication):
``check_same`` (a value's hash is all-gathered; any difference is an error on every process) and
``broadcast_json`` (process 0's value to all), ``on_primary`` (process 0 does a job, e.g. writes files;
the others wait for its result or its error). ``process_index`` / ``process_count`` / ``is_primary``
never start a backend in a one-process run.

Arrays across processes: ``to_global`` builds an array with a sharding that may span processes
from a host value every process holds identically (each process places its own shards);
``host_values`` is the inverse, the full value of each array on every host (one all-gather
program for all the arrays split across processes); ``gathered`` does that to a pytree.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import sys
import threading
import time
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, Sharding

#: The environment variables of the three settings, in the order they are looked up.
COORDINATOR_VARS = ("JAXRL_COORDINATOR", "JAX_COORDINATOR_ADDRESS")
NUM_PROCESSES_VARS = ("JAXRL_NUM_PROCESSES", "JAX_NUM_PROCESSES")
PROCESS_ID_VARS = ("JAXRL_PROCESS_ID", "JAX_PROCESS_ID")


class DistributedError(RuntimeError):
    """The processes of a run could not meet, or do not agree (config, run directory)."""


def _env(names) -> str | None:
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


def cluster_detected() -> bool:
    """A multi-process launch JAX can describe itself: ``srun`` with > 1 task, or a multi-host TPU slice."""
    slurm = int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_STEP_NODELIST" in os.environ
    tpu = len([h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]) > 1
    return slurm or tpu


def wait_for_coordinator(address: str, timeout: float) -> None:
    """Return once ``host:port`` accepts a TCP connection; ``DistributedError`` after ``timeout`` s."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"coordinator address must be host:port, got {address!r}")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=max(0.1, min(2.0, timeout))):
                return
        except OSError as err:
            if time.monotonic() >= deadline:
                raise DistributedError(
                    f"the coordinator {address} did not answer within {timeout:g} s ({err.strerror or err}); start "
                    "process 0 (it serves the coordinator) with the same --coordinator, check the host and port, "
                    "or raise --coordinator-timeout"
                ) from None
            time.sleep(0.2)


def _cpu_collectives(cpu: bool | None) -> None:
    """gloo for cross-process collectives on CPU (default: when JAX_PLATFORMS is unset or "cpu")."""
    if cpu if cpu is not None else os.environ.get("JAX_PLATFORMS", "") in ("", "cpu"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    cpu: bool | None = None,
    timeout: float = 120,
) -> bool:
    """Join a multi-process run (see the module docstring). Returns False (and does nothing) for one process.

    Must run before any other JAX call that touches devices. Bad settings are a ``ValueError``, a
    coordinator that does not answer within ``timeout`` seconds a ``DistributedError``.
    """
    coordinator = coordinator or _env(COORDINATOR_VARS)
    num = num_processes if num_processes is not None else _env(NUM_PROCESSES_VARS)
    pid = process_id if process_id is not None else _env(PROCESS_ID_VARS)
    num = int(num) if num is not None else None
    if timeout <= 0:
        raise ValueError(f"the coordinator timeout must be > 0 seconds, got {timeout}")
    if coordinator == "auto" or (coordinator is None and num is None and cluster_detected()):
        print("[distributed] joining the cluster JAX detects", file=sys.stderr, flush=True)
        _cpu_collectives(cpu)
        with _deadline(timeout, "not every process of the detected cluster joined"):
            jax.distributed.initialize(initialization_timeout=int(timeout) + _JAX_GRACE_S)
        return True
    if num is not None and num <= 1:
        return False
    if coordinator is None and num is None:
        return False
    if coordinator is None or num is None or pid is None:
        raise ValueError(
            "multi-process run needs the coordinator address, the number of processes and this "
            f"process id (got coordinator={coordinator}, num_processes={num}, process_id={pid}); "
            "pass --coordinator, --num-processes and --process-id or "
            "set JAXRL_COORDINATOR, JAXRL_NUM_PROCESSES and JAXRL_PROCESS_ID"
        )
    if not 0 <= int(pid) < num:
        raise ValueError(f"process id {pid} must be in [0, {num}) for {num} processes")
    pid = int(pid)
    if pid:
        wait_for_coordinator(coordinator, timeout)
    print(f"[distributed] process {pid} of {num}: joining {coordinator}, waiting up to {timeout:g} s for all "
          f"{num} processes", file=sys.stderr, flush=True)
    _cpu_collectives(cpu)
    with _deadline(timeout, f"not all {num} processes joined {coordinator} (this is process {pid})"):
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num, process_id=pid,
                                   initialization_timeout=int(max(1, timeout)) + _JAX_GRACE_S)
    return True


#: JAX's own join timeout is this much longer than ours, so ours ends the wait first (JAX's aborts the process).
_JAX_GRACE_S = 10


@contextlib.contextmanager
def _deadline(timeout: float, what: str):
    """End the process with a one-line ``DistributedError`` and exit status 1 if the block (a wait inside
    JAX that no Python exception can interrupt) has not finished within ``timeout`` seconds."""

    def expire():
        print(f"DistributedError: {what} within {timeout:g} s; start every process with the same --coordinator "
              "and --num-processes, or raise --coordinator-timeout", file=sys.stderr, flush=True)
        os._exit(1)

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


# -- who am I (no backend is started in a one-process run) ----------------------------------------
def is_initialized() -> bool:
    return jax.distributed.is_initialized()


def process_count() -> int:
    return jax.process_count() if is_initialized() else 1


def process_index() -> int:
    return jax.process_index() if is_initialized() else 0


def is_primary() -> bool:
    """Process 0 (every one-process run): the one that writes the run's files."""
    return process_index() == 0


# -- agreement -------------------------------------------------------------------------------------
def check_same(what: str, text: str) -> None:
    """Raise ``DistributedError`` on every process unless every process passed the same ``text``."""
    if process_count() == 1:
        return
    from jax.experimental import multihost_utils

    digest = np.frombuffer(hashlib.sha256(text.encode()).digest(), np.int32)  # [8]
    every = np.asarray(multihost_utils.process_allgather(digest))  # [processes, 8]
    differ = [i for i in range(len(every)) if not np.array_equal(every[i], every[0])]
    if differ:
        raise DistributedError(
            f"{what} differs between processes: process(es) {differ} do not match process 0 (this is process "
            f"{process_index()}); start every process with the same experiment, preset and options"
        )


def broadcast_json(obj: Any) -> Any:
    """Process 0's ``obj`` (JSON-able) on every process; other processes' ``obj`` is ignored."""
    if process_count() == 1:
        return obj
    from jax.experimental import multihost_utils

    data = np.frombuffer(json.dumps(obj).encode(), np.uint8) if is_primary() else np.zeros(0, np.uint8)
    n = int(multihost_utils.broadcast_one_to_all(np.int32(data.size)))
    buf = np.zeros(n, np.uint8)
    buf[: data.size] = data[:n]
    return json.loads(np.asarray(multihost_utils.broadcast_one_to_all(buf)).tobytes().decode())


def on_primary(fn: Callable[[], Any], *, errors: tuple[type[Exception], ...] = ()) -> Any:
    """``fn()`` run by process 0 alone (writing files, building a start checkpoint); every process returns
    its JSON-able result once it is done, or raises its error: on process 0 the error itself, on the others
    the same type when it is one of ``errors`` (else ``DistributedError``) with the same message. Every
    process must call this at the same point; with one process it is ``fn()``. ``fn`` must not run
    computations on arrays that span processes (the others are waiting, not computing)."""
    if process_count() == 1:
        return fn()
    message, failure = None, None
    if is_primary():
        try:
            message = {"result": fn()}
        except Exception as err:  # noqa: BLE001 (sent on, so the other processes stop too instead of waiting)
            failure, message = err, {"error": type(err).__name__, "message": str(err)}
    message = broadcast_json(message)
    if "error" in message:
        if failure is not None:
            raise failure
        raise {e.__name__: e for e in errors}.get(message["error"], DistributedError)(message["message"])
    return message["result"]


# -- arrays across processes -----------------------------------------------------------------------
def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def spans_processes(x) -> bool:
    """A jax.Array with shards on another process's devices."""
    return isinstance(x, jax.Array) and not x.is_fully_addressable


def to_global(x, sharding: Sharding) -> jax.Array:
    """``x`` (numpy, a process-local jax array or typed key array; the same value on every process)
    placed with ``sharding``. A sharding of this process's devices alone is a plain ``device_put``."""
    if sharding.is_fully_addressable:
        return jax.device_put(x, sharding)
    if _is_key(x):
        return jax.random.wrap_key_data(to_global(jax.random.key_data(x), sharding), impl=jax.random.key_impl(x))
    value = np.asarray(x)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def _identity(tree):
    return tree


def host_values(leaves: list) -> list[np.ndarray]:
    """Each array's full value as numpy on this host (typed keys as their key data). Arrays split
    across processes are all-gathered by one jitted copy to replicated shardings (they must have
    ``NamedSharding``s); every process must call this with the same arrays."""
    leaves = [jax.random.key_data(x) if _is_key(x) else x for x in leaves]
    split = [i for i, x in enumerate(leaves) if spans_processes(x) and not x.is_fully_replicated]
    if split:
        replicated = [NamedSharding(leaves[i].sharding.mesh, PartitionSpec()) for i in split]
        for i, x in zip(split, jax.jit(_identity, out_shardings=replicated)([leaves[i] for i in split])):
            leaves[i] = x
    return [np.asarray(x.addressable_data(0)) if spans_processes(x) else np.asarray(x) for x in leaves]


def gathered(tree):
    """``tree`` with every array that spans processes replaced by its full value on this host (numpy;
    typed keys stay keys), so process 0 alone can e.g. export it. Every process must call this with the
    same tree; with one process the tree comes back as it is."""
    if process_count() == 1:
        return tree
    leaves, treedef = jax.tree.flatten(tree)
    at = [i for i, x in enumerate(leaves) if spans_processes(x)]
    for i, value in zip(at, host_values([leaves[i] for i in at])):
        x = leaves[i]
        leaves[i] = jax.random.wrap_key_data(value, impl=jax.random.key_impl(x)) if _is_key(x) else value
    return jax.tree.unflatten(treedef, leaves)
