"""Fixtures shared by every test folder."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"


@pytest.fixture(scope="session")
def shared_fixtures() -> Path:
    path = SHARED / "fixtures"
    if not path.exists():
        pytest.fail(f"../shared/fixtures not found beside the repository ({path})")
    return path
