"""Fixtures shared by every test folder, and the rule that CI runs every test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "tests" / "fixtures"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI a skipped test fails: on a set-up machine nothing skips, so a skip there means a
    real path went untested (e.g. the image tests, when CONTAINER_ENGINE names no installed engine)."""
    report = yield
    if report.skipped and not hasattr(report, "wasxfail") and in_ci():
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"skipped under CI={os.environ['CI']}, where every test must run: {reason}"
    return report


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """tests/fixtures: real reference data (a Common Crawl WET sample; see its README.md)."""
    return FIXTURES


@pytest.fixture(scope="session")
def s3_endpoint():
    """A moto S3 server on 127.0.0.1, shared by the session's tests."""
    from tests.s3_server import running_s3_server

    with running_s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3(monkeypatch, s3_endpoint):
    """Point boto3 at the loopback S3 server; returns (endpoint, client factory)."""
    from tests.s3_server import make_bucket, s3_env

    s3_env(monkeypatch, s3_endpoint)
    return s3_endpoint, (lambda bucket: make_bucket(s3_endpoint, bucket))
