"""Shared test set-up (before jax is imported): 8 virtual CPU devices, and a cheaper XLA CPU backend.

The suite's small programs spend most of their time in compilation, so the tests (and the notebook
kernels and subprocesses they start) compile with LLVM's optimisation off: about a quarter less
suite time on the 2-core CI machine, with the same test outcomes.
"""

import os

#: XLA flags for fast compilation; subprocess tests add them to their own device count (``testutil``).
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"

if "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count=8 {FAST_COMPILE_FLAGS}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
