"""The container engine as the image tests use it: which engine, its flags, and how an image is
built (docker/build.sh, exactly as `make image-SERVICE` does, on the local base image).

Engine and flags: $CONTAINER_ENGINE, $CONTAINER_BUILD_FLAGS, $CONTAINER_RUN_FLAGS, as the Makefile
sets them; without them, podman with the flags this machine needs."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The service images, as the Makefile declares them (IMAGE_SERVICES).
SERVICES = tuple(re.search(r"^IMAGE_SERVICES := (.+)$", (REPO / "Makefile").read_text(), re.M).group(1).split())
ENGINE = os.environ.get("CONTAINER_ENGINE") or "podman"
_PODMAN = ("--runtime /usr/sbin/runc " if Path("/usr/sbin/runc").exists() else "") + \
    "--ulimit nofile=1024:1024 --ulimit nproc=1024:1024"
IS_PODMAN = Path(ENGINE).name == "podman"
BUILD_FLAGS = shlex.split(os.environ.get("CONTAINER_BUILD_FLAGS", "--network none " + (_PODMAN if IS_PODMAN else "")))
RUN_FLAGS = shlex.split(os.environ.get("CONTAINER_RUN_FLAGS", _PODMAN if IS_PODMAN else ""))
BASE_IMAGE = os.environ.get("LOCAL_BASE_IMAGE") or "localhost/lmforge-base:bookworm"
TAG = "test"  # the image tests build lmforge/SERVICE:test
UID = "10001"


def engine(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([ENGINE, *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{ENGINE} {shlex.join(args)} exited {result.returncode}:\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def run(image: str, *args: str, entrypoint: str | None = None, timeout: float = 120,
        check: bool = True) -> subprocess.CompletedProcess:
    """`ENGINE run --rm --network none IMAGE ARGS`, the engine's output captured."""
    flags = [*RUN_FLAGS, "--rm", "--network", "none"]
    if entrypoint:
        flags += ["--entrypoint", entrypoint]
    return engine("run", *flags, image, *args, timeout=timeout, check=check)


def build_image(service: str, tag: str, base_image: str, **env: str) -> subprocess.CompletedProcess:
    """docker/build.sh SERVICE TAG on `base_image`; `env` adds to (or overrides) its environment."""
    # TORCH_SOURCE left to `auto` unless given: the local base has no torch, so torch comes from
    # the wheelhouse, and `make images BASE_IMAGE=<the local base>` shares this build's cache.
    environ = {**{k: v for k, v in os.environ.items() if k != "TORCH_SOURCE"}, "CONTAINER_ENGINE": ENGINE,
               "CONTAINER_BUILD_FLAGS": shlex.join(BUILD_FLAGS), "BASE_IMAGE": base_image,
               "PYTHON": os.environ.get("PYTHON", str(REPO / ".venv" / "bin" / "python")), **env}
    return subprocess.run([str(REPO / "docker" / "build.sh"), service, tag], capture_output=True, text=True,
                          env=environ, timeout=1800)
