"""Shared test set-up (before jax is imported): 8 virtual CPU devices, and a cheaper XLA CPU backend.

The suite's small programs spend most of their time in compilation, so the tests (and the notebook
kernels and subprocesses they start) compile with LLVM's optimisation off (about a quarter less suite
time on the 2-core CI machine) and, where this jaxlib's XLA has them, with its legacy CPU loop emitters
in one codegen module (``--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1``:
XLA backend compile time of the PPO and sampler tests 21.6 s -> 7.5 s, suite 19 -> 11 minutes), with the same
test outcomes. The price is slower elementwise code (silu's gradient over [2048, 256] 2.9 vs 0.23 ms: the tool-use
test's 300 SFT steps take 52 s instead of ~25 s); still, on 57 of the most run-heavy tests (2026-12-07), these
flags take 148 s, legacy emitters at LLVM -O1 173 s, at the default -O2 210 s, the new fusion emitters at -O0
222 s. Many of them compile the same programs (the same tiny models in tests, notebooks and
subprocess runs), so the whole run shares one persistent JAX compilation cache in a fresh temporary folder
(inherited by the xdist workers, notebook kernels and subprocesses; removed at the end; set
``JAX_COMPILATION_CACHE_DIR`` to choose another); files that tests of several workers make once (``testutil.shared_file``)
go to one more such folder. Python's cyclic garbage collector runs about 70x less often than its default
(``GC_THRESHOLDS``): with the default, its ~6,000 young and ~25 full collections took 9-11 s of 140-160 s of tests
(80-87 LM tests, 2026-12-07), 2.5 s after, at the same peak memory (4.0 GB); the whole suite (``-n 2``, alone,
the same boot, with zstandard for the cache's entries) 1,335 -> 1,266 s, CPU 2,371 -> 2,243 s. A test that runs
an env step, a rendering or a gradient eagerly compiles each of its ops as a program of its own (100-400 a test):
jit the block (``jax.jit`` of a local function), as the spiral, rally, swarm and env-core tests do. Under CI
(CI=true) a skip for a missing reference package (pgx, JaxMARL, transformers, ...) is a failure (the report hooks at
the end, ``testutil.fail_if_required``).
"""

import gc
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

_LLVM_FAST = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
_LEGACY_EMITTERS = "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"


def _xla_accepts(flags: str) -> bool:
    """Whether this jaxlib's XLA knows every flag in ``flags`` (it aborts on an unknown one): one probe process."""
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env, capture_output=True).returncode == 0


#: XLA flags for fast compilation; subprocess tests add them to their own device count (``testutil``). Probed once
#: per session (the xdist workers inherit the controller's choice through the environment).
FAST_COMPILE_FLAGS = os.environ.get("JAXRL_REASON_TEST_XLA_FLAGS") or (
    f"{_LLVM_FAST} {_LEGACY_EMITTERS}" if _xla_accepts(f"{_LLVM_FAST} {_LEGACY_EMITTERS}") else _LLVM_FAST)
os.environ["JAXRL_REASON_TEST_XLA_FLAGS"] = FAST_COMPILE_FLAGS

if "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count=8 {FAST_COMPILE_FLAGS}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

#: (young, middle, old) collection thresholds: the suite's heap (compiled programs, traced functions) is large
#: and long-lived, and the default (700, 10, 10) re-walks it thousands of times (module docstring)
GC_THRESHOLDS = (50_000, 20, 10)
gc.set_threshold(*GC_THRESHOLDS)

#: the suite's compilation cache, when this process made it (removed at the end of the session)
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _OWN_CACHE = tempfile.mkdtemp(prefix="jaxrl_reason_tests_jax_cache_")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # the fast-compile programs take < 0.5 s


#: files made once per session and read by every worker (``testutil.shared_file``; removed at the end)
_OWN_SHARED = None
if "JAXRL_REASON_TEST_SHARED" not in os.environ:
    _OWN_SHARED = tempfile.mkdtemp(prefix="jaxrl_reason_tests_shared_")
    os.environ["JAXRL_REASON_TEST_SHARED"] = _OWN_SHARED


def pytest_sessionfinish(session, exitstatus):
    if not hasattr(session.config, "workerinput"):  # the controller (or a plain run)
        for own in (_OWN_CACHE, _OWN_SHARED):
            if own is not None:
                shutil.rmtree(own, ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if report.skipped:
        from testutil import fail_if_required

        fail_if_required(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped:
        from testutil import fail_if_required

        fail_if_required(report)
    return report
