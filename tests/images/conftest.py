"""Fixtures of the image tests: the local base image and the service images built on it, once
per session.

The image tests run last, and their builds start in a background thread as soon as the session
knows it will run them: a build keeps about one core busy for minutes, and on a 2-core machine
the rest of the suite leaves one mostly idle, so by the time the image tests run their images are
built or nearly. The engine's cache makes a rebuild of unchanged inputs nearly free. When the
torch-base test is selected, its two builds (the stand-in torch base, then the inference image on
it) queue behind the service images in the same way."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.images.engine import BASE_IMAGE, BUILD_FLAGS, ENGINE, REPO, SERVICES, TAG, build_image

# A stand-in for a CUDA PyTorch base: the local base with torch (and what it needs) in the system
# Python's dist-packages, as such images have it; and the inference image built on it (TORCH_SOURCE=auto).
TORCH_BASE = "localhost/lmforge-test-torch-base:bookworm"
INFERENCE_ON_TORCH_BASE = f"lmforge/inference:{TAG}-torch-base"

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


def _make_torch_base() -> subprocess.CompletedProcess:
    """TORCH_BASE (kept when the engine has it), from the inference build context's wheels."""
    exists = subprocess.run([ENGINE, "image", "exists", TORCH_BASE], capture_output=True, text=True, timeout=120)
    if exists.returncode == 0:
        return subprocess.CompletedProcess(exists.args, 0, f"{TORCH_BASE} exists", "")
    with tempfile.TemporaryDirectory(prefix="torch-base-") as directory:
        context = Path(directory)
        shutil.copytree(REPO / "build" / "images" / "inference" / "deps", context / "wheels")
        (context / "Containerfile").write_text(
            f"FROM {BASE_IMAGE}\nCOPY wheels /wheels\n"
            "RUN python3 -m venv /tmp/v && /tmp/v/bin/pip install --no-index --find-links /wheels"
            " --target /usr/local/lib/python3.11/dist-packages torch && rm -rf /tmp/v /wheels\n")
        return subprocess.run([ENGINE, "build", *BUILD_FLAGS, "--tag", TORCH_BASE, str(context)],
                              capture_output=True, text=True, timeout=900)


def _torch_base_build() -> Future:
    _service_build("inference")  # its build context holds the torch wheel and torch's dependencies
    return _submit("torch-base", _make_torch_base)


def _inference_on_torch_base_build() -> Future:
    _torch_base_build()
    return _submit("inference-on-torch-base",
                   lambda: build_image("inference", INFERENCE_ON_TORCH_BASE, TORCH_BASE, TORCH_SOURCE="auto"))


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
    if any("inference_on_torch_base" in getattr(item, "fixturenames", ()) for item in session.items):
        _inference_on_torch_base_build()


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


@pytest.fixture(scope="session")
def torch_base_image(base_image, build) -> str:
    """TORCH_BASE, built (once per session) after the inference image, whose build context it copies."""
    build("inference")
    result, seconds = _torch_base_build().result()
    assert result.returncode == 0, f"building {TORCH_BASE} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    print(f"\n{TORCH_BASE}: {seconds:.0f}s ({result.stdout.strip()[-200:]})")
    return TORCH_BASE


@pytest.fixture(scope="session")
def inference_on_torch_base(torch_base_image) -> tuple[str, subprocess.CompletedProcess]:
    """The inference image built by docker/build.sh on TORCH_BASE with TORCH_SOURCE=auto: its tag, and
    the build's result (the test asserts on it)."""
    result, seconds = _inference_on_torch_base_build().result()
    print(f"\n{INFERENCE_ON_TORCH_BASE}: built in {seconds:.0f}s")
    return INFERENCE_ON_TORCH_BASE, result
