"""Reference packages are skips on a developer's machine and failures in CI.

The differential tests and the benchmarks compare with anchors that only the extras install (pgx, JaxMARL,
transformers, torch, ...). A test that needs one calls ``pytest.importorskip(name)`` (in its module or its
body): where the package is missing it skips, but under ``CI`` (CI=true, as CI sets it; the CI command
installs every extra) the skip would hide a broken install, so the two report hooks below, installed by
``tests/conftest.py``, turn a skip of ``importorskip`` for a name of ``REQUIRED_IN_CI`` into a failure (in
a module: a collection error, which stops the run). Skips for any other reason (mkdocs, a device count)
stay skips.
"""

from __future__ import annotations

import os
import re

import pytest

#: the reference packages the CI command installs (the hf, bench and test extras, the core's gguf): a skip
#: for one of them in CI means the environment is broken, not that the test does not apply
REQUIRED_IN_CI = frozenset({"pgx", "jaxmarl", "transformers", "torch", "trl", "peft", "accelerate", "gguf",
                            "tokenizers", "safetensors", "datasets", "wandb", "pyamg", "lineax"})

_IMPORTORSKIP = re.compile(r"could not import '([\w.]+)'|module '([\w.]+)' has __version__")


def in_ci() -> bool:
    """Whether the suite runs under CI (``CI`` set, and not to false / 0)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing_required(message: str) -> str | None:
    """The package of a skip message of ``pytest.importorskip`` when it is in ``REQUIRED_IN_CI``, else None."""
    match = _IMPORTORSKIP.search(message)
    name = match and (match[1] or match[2]).split(".")[0]
    return name if name in REQUIRED_IN_CI else None


def _fail_if_required(report) -> None:
    """Turn a skip ``report`` (collection or test) of a missing required package into a failure, in CI."""
    if not (report.skipped and isinstance(report.longrepr, tuple) and in_ci()):
        return
    message = report.longrepr[2]
    name = missing_required(message)
    if name is not None:
        report.outcome = "failed"
        report.longrepr = (f"{name} is required in CI (pip install -e '.[test,hf,bench]'); "
                           f"outside CI this test skips: {message}")


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    _fail_if_required(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    _fail_if_required(report)
    return report
