"""Under CI (CI=true, as .ci/run sets it) a skipped test fails the run: a skip there means a real
path went untested, e.g. the image tests when CONTAINER_ENGINE names no installed engine."""

import pytest

pytest_plugins = ["pytester"]

SUITE = """
import shutil
import pytest

@pytest.mark.skipif(shutil.which("no-such-engine") is None, reason="no-such-engine is not installed")
def test_builds_an_image():
    pass

def test_uses_a_module():
    pytest.importorskip("no_such_module")

def test_runs():
    pass

@pytest.mark.xfail(reason="a known bug", strict=True)
def test_known_bug():
    assert False
"""


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(test_suite=SUITE)
    return lambda: pytester.runpytest("-p", "tests.conftest")


@pytest.mark.parametrize("value", ["true", "1"])
def test_under_ci_a_skipped_test_fails_the_run(suite, monkeypatch, value):
    monkeypatch.setenv("CI", value)
    result = suite()
    result.assert_outcomes(passed=1, errors=1, failed=1, xfailed=1)  # a skip at set-up is an error
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    must_run = f"skipped under CI={value}, where every test must run:"
    result.stdout.fnmatch_lines(["*ERROR at setup of test_builds_an_image*",
                                 f"{must_run} no-such-engine is not installed",
                                 "*test_uses_a_module*",
                                 f"{must_run} could not import 'no_such_module'*"])


@pytest.mark.parametrize("value", [None, "false"])
def test_outside_ci_a_skip_is_only_reported(suite, monkeypatch, value):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    result = suite()
    result.assert_outcomes(passed=1, skipped=2, xfailed=1)
    assert result.ret == pytest.ExitCode.OK
