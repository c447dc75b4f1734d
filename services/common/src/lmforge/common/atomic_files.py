"""Atomic local writes, and files with the mode a plain write gives them.

- atomic_path / atomic_open / atomic_write_bytes: the new content is written to a temp file
  beside the target, synced and renamed over it only if the block succeeds; a failure leaves
  the target as it was and no temp file behind.
- atomic_dir: the same for a whole directory.
- New files get 0666 (directories 0777) less the umask, or the folder's default ACL, as open()
  and mkdir() give them, so pods running as another user can read shared volumes.
- A write that fails for lack of room (ENOSPC, EDQUOT, ...) names the file it was writing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

# write() and flush() fail with these without naming the file (a full disk, a quota, a size limit)
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})


def name_write_error(exc: OSError, local: str | Path, remote: str) -> None:
    """Make a full temp dir's write error name the local file and the object it stands for:
    `No space left on device (ENOSPC): /tmp/lmforge-spool-x -> s3://b/k`."""
    if exc.filename is None and exc.errno in WRITE_ERRNOS:
        exc.filename, exc.filename2 = str(local), remote


def current_umask() -> int:
    """The process's umask, read without changing it (os.umask can only set it: setting and
    restoring it would briefly leave other threads' new files world-writable)."""
    with contextlib.suppress(OSError, StopIteration, ValueError), open("/proc/self/status") as fh:
        return int(next(line for line in fh if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)  # no /proc (not Linux)
    os.umask(mask)
    return mask


def chmod_as_plain_write(path: str | Path) -> None:
    """Give `path` the mode open() or mkdir() would have: 0666 (0777) less the umask. For files
    a library wrote with its own private mode (safetensors writes 0600)."""
    os.chmod(path, (0o777 if os.path.isdir(path) else 0o666) & ~current_umask())


def _new_beside(path: Path, *, directory: bool = False) -> Path:
    """A new empty file (or directory) with a fresh `.tmp-` name beside `path`, created as a plain
    open() or mkdir() would create `path`: 0666 (0777) less the umask, or the folder's default ACL.
    (mkstemp/mkdtemp make 0600/0700, which another user - a trainer pod, a notebook - cannot read.)"""
    for _ in range(100):
        tmp = path.with_name(f".tmp-{path.name}.{secrets.token_hex(4)}")
        try:
            if directory:
                os.mkdir(tmp, 0o777)
            else:
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temp path beside `path` for the block to fill; it is synced and renamed over `path`
    only if the block succeeds, and removed otherwise. The result has the mode a plain write
    would give it: an existing file's own mode, else 0666 less the umask."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_beside(path)
    try:
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None and exc.errno in WRITE_ERRNOS:
            exc.filename = str(path)  # the error says which file could not be written
        raise


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """A new directory beside `path` (mode 0777 less the umask) for the block to fill; it replaces
    `path` (an existing directory is removed first) only if the block succeeds, and is removed otherwise."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = _new_beside(path, directory=True)
    try:
        yield staging
        if path.exists():
            shutil.rmtree(path)
        os.replace(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "wb") -> Iterator[BinaryIO]:
    """Open a temp file beside `path`; rename it over `path` only if the block succeeds."""
    with atomic_path(path) as tmp, open(tmp, mode) as fh:
        yield fh


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_open(path) as fh:
        fh.write(data)
