"""Fixtures shared by every test folder."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "tests" / "fixtures"


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
