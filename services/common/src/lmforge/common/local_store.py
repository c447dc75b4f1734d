"""A local directory as a Store (lmforge.common.store): data prep's local output, and a file://
destination standing in for the object store (the uploader's embedded default and tests).

Writes go through atomic_files: a temp file `.tmp-…` beside the target, renamed into place. Those
temp files are the directory's open uploads (what a writer that died left behind): listings and
list() leave them out, open_uploads lists them, abort_upload removes one. Ages are the files'
mtimes against the local clock.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from lmforge.common.atomic_files import atomic_open, atomic_write_bytes
from lmforge.common.errors import StorageError
from lmforge.common.retry import Cancelled
from lmforge.common.store import (
    NOT_CANCELLED,
    AccessDenied,
    HasIsSet,
    ObjectMissing,
    OpenUpload,
    Progress,
    Store,
    StoredObject,
)

TEMP_PREFIX = ".tmp-"
COPY_CHUNK = 8 << 20


class LocalStore(Store):
    """`uri`: how the store is named (a file:// URI as given); the root's path by default."""

    def __init__(self, root: str | Path, uri: str | None = None):
        self.root = Path(root)
        self.uri = uri.rstrip("/") if uri else str(self.root)

    def _path(self, rel: str) -> Path:
        return self.root / rel

    # -- reads and writes by path ----------------------------------------------------------

    def exists(self, rel: str) -> bool:
        return self._path(rel).exists()

    def read_bytes(self, rel: str) -> bytes:
        try:
            return self._path(rel).read_bytes()
        except OSError as exc:
            raise self.failure(exc, "read", rel) from exc

    def read_range(self, rel: str, start: int, length: int) -> bytes:
        return self.read_range_sized(rel, start, length)[0]

    def read_range_sized(self, rel: str, start: int, length: int) -> tuple[bytes, int]:
        try:
            with open(self._path(rel), "rb") as fh:
                fh.seek(start)
                return fh.read(max(length, 0)), os.fstat(fh.fileno()).st_size
        except OSError as exc:
            raise self.failure(exc, "read", rel) from exc

    @contextlib.contextmanager
    def open_write(self, rel: str) -> Iterator[BinaryIO]:
        with atomic_open(self._path(rel)) as fh:
            yield fh

    def list(self, prefix: str = "") -> list[str]:
        base = self._path(prefix)
        if not base.exists():
            return []
        if base.is_file():
            return [prefix]
        return sorted(self.listing(prefix))

    def local_path(self, rel: str) -> Path:
        return self._path(rel)

    def release_local_copies(self) -> None:
        pass  # local_path is the file itself

    # -- object transfers ------------------------------------------------------------------

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"{self.uri}: cannot create the directory ({exc})") from exc

    def get_bytes(self, rel: str) -> bytes | None:
        path = self._path(rel)
        return path.read_bytes() if path.is_file() else None

    def put_bytes(self, rel: str, data: bytes) -> None:
        atomic_write_bytes(self._path(rel), data)

    def upload_file(self, path: Path, rel: str, cancel: HasIsSet = NOT_CANCELLED,
                    progress: Progress | None = None) -> str:
        if cancel.is_set():
            raise Cancelled(rel)
        digest = hashlib.sha256()
        with open(path, "rb") as source, atomic_open(self._path(rel)) as target:
            while block := source.read(COPY_CHUNK):
                digest.update(block)
                target.write(block)
        if progress:
            progress(Path(path).stat().st_size)
        return digest.hexdigest()

    def download(self, rel: str, target: Path, size: int | None = None, progress: Progress | None = None,
                 cancel: HasIsSet = NOT_CANCELLED) -> None:
        if cancel.is_set():
            raise Cancelled(rel)
        if size is None and not self._path(rel).is_file():
            raise ObjectMissing(f"{self.join(rel)}: no such file")
        shutil.copyfile(self._path(rel), target)
        if progress:
            progress(size if size is not None else Path(target).stat().st_size)

    def listing(self, prefix: str = "") -> dict[str, StoredObject]:
        now = time.time()
        return {p.relative_to(self.root).as_posix(): StoredObject(st.st_size, now - st.st_mtime)
                for p, st in self._files(prefix, temp=False)}

    def open_uploads(self, prefix: str = "") -> list[OpenUpload]:
        now = time.time()
        return [OpenUpload(rel := p.relative_to(self.root).as_posix(), rel, now - st.st_mtime)
                for p, st in self._files(prefix, temp=True)]

    def abort_upload(self, upload: OpenUpload) -> None:
        self._path(upload.upload_id).unlink(missing_ok=True)

    def delete(self, rels: list[str], *, cancellable: bool = True) -> None:
        for rel in rels:
            self._path(rel).unlink(missing_ok=True)

    def failure(self, exc: BaseException, doing: str, rel: str) -> StorageError | None:
        if isinstance(exc, StorageError):
            return exc
        if not isinstance(exc, OSError):
            return None
        kind = (ObjectMissing if isinstance(exc, FileNotFoundError)
                else AccessDenied if isinstance(exc, PermissionError) else StorageError)
        return kind(f"cannot {doing} {self._path(rel)}: {exc}")

    def _files(self, prefix: str, *, temp: bool) -> Iterator[tuple[Path, os.stat_result]]:
        """Files under `prefix`: the temp files of writes in progress (temp=True) or the others."""
        base = self._path(prefix)
        if not base.exists():
            return
        for path in base.rglob("*"):
            try:
                if path.is_file() and path.name.startswith(TEMP_PREFIX) == temp:
                    yield path, path.stat()
            except FileNotFoundError:  # renamed or removed by a concurrent writer
                continue
