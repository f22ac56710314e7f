"""Shared test set-up (before jax is imported): 8 virtual CPU devices, and a cheaper XLA CPU backend.

The suite's small programs spend most of their time in compilation, so the tests (and the notebook
kernels and subprocesses they start) compile with LLVM's optimisation off: about a quarter less
suite time on the 2-core CI machine, with the same test outcomes. Many of them compile the same
programs (the same tiny models in tests, notebooks and subprocess runs), so the whole run shares one
persistent JAX compilation cache in a fresh temporary folder (inherited by the xdist workers, notebook
kernels and subprocesses; removed at the end; set ``JAX_COMPILATION_CACHE_DIR`` to choose another).
"""

import os
import shutil
import tempfile

#: XLA flags for fast compilation; subprocess tests add them to their own device count (``testutil``).
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"

if "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count=8 {FAST_COMPILE_FLAGS}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

#: the suite's compilation cache, when this process made it (removed at the end of the session)
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _OWN_CACHE = tempfile.mkdtemp(prefix="jaxrl_reason_tests_jax_cache_")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # the fast-compile programs take < 0.5 s


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE is not None and not hasattr(session.config, "workerinput"):  # the controller (or a plain run)
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)
