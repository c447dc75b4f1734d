"""Each step writes into WORKDIR/.staging/STEP and its outputs move into WORKDIR only when the
step is complete: an interrupted demo leaves no half-written output where a finished one belongs."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

STAGING = ".staging"


@contextlib.contextmanager
def staged(workdir: Path, step: str) -> Iterator[Path]:
    """Yields an empty directory; on success each entry in it replaces WORKDIR/<entry>, on any
    failure (an interrupt included) the directory is removed."""
    staging = workdir / STAGING / step
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for entry in sorted(staging.iterdir()):
        remove(workdir / entry.name)
        entry.rename(workdir / entry.name)
    staging.rmdir()
    with contextlib.suppress(OSError):  # the last step out: no empty .staging left behind
        staging.parent.rmdir()


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def discard_staging(workdir: Path) -> None:
    shutil.rmtree(workdir / STAGING, ignore_errors=True)
