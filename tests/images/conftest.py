"""Fixtures of the image tests: the local base image and the service images built on it (once
per session; the engine's cache makes a rebuild of unchanged inputs nearly free)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.images.engine import BASE_IMAGE, ENGINE, REPO, TAG, build_image


@pytest.fixture(scope="session")
def base_image() -> str:
    started = time.monotonic()
    result = subprocess.run([str(REPO / "docker" / "make-base-image.sh"), BASE_IMAGE], capture_output=True, text=True,
                            env={**os.environ, "CONTAINER_ENGINE": ENGINE}, timeout=900)
    assert result.returncode == 0, f"make-base-image.sh failed:\n{result.stdout}\n{result.stderr}"
    print(f"\nbase image {BASE_IMAGE}: {time.monotonic() - started:.0f}s ({result.stdout.strip()})")
    return BASE_IMAGE


_built: dict[str, str] = {}


@pytest.fixture(scope="session")
def build(base_image):
    """build(service) → the image lmforge/SERVICE:test, built (once per session) as `make image-SERVICE` does."""

    def _build(service: str) -> str:
        if service not in _built:
            tag = f"lmforge/{service}:{TAG}"
            started = time.monotonic()
            result = build_image(service, tag, base_image)
            assert result.returncode == 0, f"building {tag} failed:\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
            print(f"\n{tag}: built in {time.monotonic() - started:.0f}s")
            _built[service] = tag
        return _built[service]

    return _build
