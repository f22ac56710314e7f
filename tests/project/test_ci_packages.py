"""The suite's rule for reference packages (tests/conftest.py's report hooks, ``testutil.fail_if_required``):
under CI a skip for a missing one fails; elsewhere it stays a skip."""

import sys

import conftest
import pytest
import testutil

pytest_plugins = ["pytester"]

FAKE = "jaxrl_reason_fake_reference"  # a required package that is never installed

TESTS = {
    "test_module_level": f"""
import pytest
pytest.importorskip("{FAKE}")

def test_never_collected():
    pass
""",
    "test_in_body": f"""
import pytest

def test_needs_the_fake():
    pytest.importorskip("{FAKE}.sub")

def test_needs_an_optional_tool():
    pytest.importorskip("jaxrl_reason_fake_optional")  # not required in CI: skips everywhere

def test_skips_for_another_reason():
    pytest.skip("could not import nothing: a plain skip")
""",
}


def _run(pytester, monkeypatch, ci):
    monkeypatch.setattr(testutil, "REQUIRED_IN_CI", testutil.REQUIRED_IN_CI | {FAKE})
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    pytester.makepyfile(**TESTS)
    # the suite's two report hooks, nothing else of its conftest (whose name the inner run's conftest takes)
    monkeypatch.setitem(sys.modules, "suite_conftest", conftest)
    pytester.makeconftest("from suite_conftest import pytest_make_collect_report, pytest_runtest_makereport")
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "--import-mode=importlib",
                                        "--continue-on-collection-errors", "-rs")


@pytest.mark.parametrize("ci", [None, "false"])
def test_outside_ci_a_missing_package_skips(pytester, monkeypatch, ci):
    result = _run(pytester, monkeypatch, ci)
    result.assert_outcomes(skipped=4)


def test_in_ci_a_missing_required_package_fails(pytester, monkeypatch):
    result = _run(pytester, monkeypatch, "true")
    result.assert_outcomes(failed=1, skipped=2, errors=1)
    result.stdout.fnmatch_lines([f"*{FAKE} is required in CI*"])
    assert result.ret != 0


def test_missing_required_reads_importorskip_messages():
    assert testutil.missing_required("could not import 'pgx': No module named 'pgx'") == "pgx"
    assert testutil.missing_required("Skipped: could not import 'transformers.models': boom") == "transformers"
    assert testutil.missing_required("module 'torch' has __version__ '1.0', required is: '2.0'") == "torch"
    assert testutil.missing_required("could not import 'mkdocs': No module named 'mkdocs'") is None
    assert testutil.missing_required("needs 8 (virtual) devices") is None
