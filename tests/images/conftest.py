"""Fixtures of the image tests: the local base image and the service images built on it, once
per session.

The image tests run last, and their builds start in a background thread as soon as the session
knows it will run them: a build keeps about one core busy for minutes, and on a 2-core machine
the rest of the suite leaves one mostly idle, so by the time the image tests run their images are
built or nearly. The engine's cache makes a rebuild of unchanged inputs nearly free."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.images.engine import BASE_IMAGE, ENGINE, REPO, SERVICES, TAG, build_image

# One build at a time, in the order asked: the base image, then each service image.
_builder = ThreadPoolExecutor(1, thread_name_prefix="image-build")
_builds: dict[str, Future] = {}


def _timed(build) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = build()
    return result, time.monotonic() - started


def _make_base_image() -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "docker" / "make-base-image.sh"), BASE_IMAGE], capture_output=True,
                          text=True, env={**os.environ, "CONTAINER_ENGINE": ENGINE}, timeout=900)


def _submit(name: str, build) -> Future:
    if name not in _builds:
        _builds[name] = _builder.submit(_timed, build)
    return _builds[name]


def _base_build() -> Future:
    return _submit("base", _make_base_image)


def _service_build(service: str) -> Future:
    _base_build()
    return _submit(service, lambda: build_image(service, f"lmforge/{service}:{TAG}", BASE_IMAGE))


def _is_image_test(item: pytest.Item) -> bool:
    return item.get_closest_marker("images") is not None


def pytest_collection_modifyitems(config, items):
    items.sort(key=_is_image_test)  # stable: the image tests last, each group in its own order


def pytest_collection_finish(session):
    if session.config.option.collectonly or not shutil.which(ENGINE):
        return
    if any(_is_image_test(item) for item in session.items):
        for service in SERVICES:
            _service_build(service)


def pytest_sessionfinish(session, exitstatus):
    _builder.shutdown(wait=True, cancel_futures=True)  # no build left running past the session


@pytest.fixture(scope="session")
def base_image() -> str:
    result, seconds = _base_build().result()
    assert result.returncode == 0, f"make-base-image.sh failed:\n{result.stdout}\n{result.stderr}"
    print(f"\nbase image {BASE_IMAGE}: {seconds:.0f}s ({result.stdout.strip()})")
    return BASE_IMAGE


@pytest.fixture(scope="session")
def build(base_image):
    """build(service) → the image lmforge/SERVICE:test, built (once per session) as `make image-SERVICE` does."""

    def _build(service: str) -> str:
        tag = f"lmforge/{service}:{TAG}"
        result, seconds = _service_build(service).result()
        assert result.returncode == 0, f"building {tag} failed:\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
        print(f"\n{tag}: built in {seconds:.0f}s")
        return tag

    return _build
