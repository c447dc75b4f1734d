"""The one storage interface: a Store is a root (a local directory or an s3:// prefix) holding
files by relative, '/'-separated path. LocalStore (local_store.py) and S3Store (s3_store.py)
implement it; lmforge.common.storage.open_store picks one from a URI.

What every Store guarantees:
- Writes are atomic: a reader never sees a half-written file, and a failed write leaves
  nothing behind (a temp file renamed into place locally; one PUT, or a multipart upload that
  is completed or aborted, in S3).
- Uploads are verified: upload_file reads the file once and returns the sha256 of what it
  sent; in S3 each part carries its CRC32C, which the store checks.
- Two kinds of operation, two error contracts:
  * reads and writes by path (exists, read_bytes, read_range, read_range_sized, open_read,
    open_write, write_bytes, list, local_path) raise a StorageError naming the file: ObjectMissing
    when there is none, AccessDenied when the store refuses;
  * object transfers (get_bytes, put_bytes, upload_file, download, listing, open_uploads,
    abort_upload, delete) raise the failure as it is (the backend's error once the store's
    retries are spent, a local file's OSError, Cancelled), for callers that tell failures apart
    and try again later: the uploader counts them by class. `failure()` maps such an error to
    the StorageError a user reads.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol
from urllib.parse import urlparse

from lmforge.common.errors import StorageError

Progress = Callable[[int], None]  # called with the bytes each step of a transfer moved


class ObjectMissing(StorageError):
    """No file or object at the path (or no bucket)."""


class AccessDenied(StorageError):
    """The store refused the request (credentials, permissions)."""


class HasIsSet(Protocol):
    """A cancellation flag: a threading.Event, or anything else with is_set()."""

    def is_set(self) -> bool: ...


class _NeverSet:
    def is_set(self) -> bool:
        return False


NOT_CANCELLED = _NeverSet()


@dataclass(frozen=True)
class StoredObject:
    size: int
    age_seconds: float  # since it was last written, on the store's clock


@dataclass(frozen=True)
class OpenUpload:
    """An upload begun and neither completed nor aborted."""

    key: str  # relative to the store when a Store lists it
    upload_id: str
    age_seconds: float  # since it was begun, on the store's clock


def scheme_of(uri: str) -> str:
    scheme = urlparse(uri).scheme
    return scheme if scheme in {"s3", "http", "https", "file"} else "file"


def local_path_of(uri: str) -> Path:
    return Path(urlparse(uri).path) if uri.startswith("file://") else Path(uri)


class Store(ABC):
    """A root of files by relative path (see the module docstring for the guarantees)."""

    uri: str
    endpoint_url: str | None = None  # an S3-compatible endpoint named explicitly (None: the AWS chain's)

    # -- reads and writes by path: errors are StorageErrors ---------------------------------

    @abstractmethod
    def exists(self, rel: str) -> bool: ...

    @abstractmethod
    def read_bytes(self, rel: str) -> bytes: ...

    @abstractmethod
    def read_range(self, rel: str, start: int, length: int) -> bytes:
        """`length` bytes of `rel` from byte `start`: a ranged GET remotely. Asking past the end is
        an error remotely, a short read locally: ask only for bytes that exist."""

    @abstractmethod
    def read_range_sized(self, rel: str, start: int, length: int) -> tuple[bytes, int]:
        """Up to `length` bytes of `rel` from `start` (fewer, or none, where the file ends) and the
        file's whole size, so a reader can check the file is the one it expects (one ranged GET
        remotely)."""

    @abstractmethod
    def open_write(self, rel: str) -> contextlib.AbstractContextManager[BinaryIO]:
        """Write through a file object; the result appears only if the block succeeds."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Relative paths of files under `prefix`, sorted."""

    @abstractmethod
    def local_path(self, rel: str) -> Path:
        """A local file with the content of `rel` (a download for remote stores, kept until
        release_local_copies)."""

    def open_read(self, rel: str) -> BinaryIO:
        """A seekable file to read `rel` from, without a local copy of a remote file."""
        return open(self.local_path(rel), "rb")

    @abstractmethod
    def release_local_copies(self) -> None:
        """Delete the local copies local_path made. Data prep's executor calls it when each task
        ends, so a process that runs many tasks keeps on disk only what its current task reads."""

    def write_bytes(self, rel: str, data: bytes) -> None:
        with self.open_write(rel) as fh:
            fh.write(data)

    def read_text(self, rel: str) -> str:
        return self.read_bytes(rel).decode("utf-8")

    def write_text(self, rel: str, text: str) -> None:
        self.write_bytes(rel, text.encode("utf-8"))

    def join(self, rel: str) -> str:
        return self.uri.rstrip("/") + "/" + rel

    # -- object transfers: errors as they are (failure() maps them) -------------------------

    @abstractmethod
    def check(self) -> None:
        """Fail fast with a StorageError that says why, when the store cannot be used (a missing
        bucket, denied access, an unreachable endpoint, a directory that cannot be made)."""

    @abstractmethod
    def get_bytes(self, rel: str) -> bytes | None:
        """The file's bytes; None when there is none."""

    @abstractmethod
    def put_bytes(self, rel: str, data: bytes) -> None:
        """Write a small file from memory (one PUT)."""

    @abstractmethod
    def upload_file(self, path: Path, rel: str, cancel: HasIsSet = NOT_CANCELLED,
                    progress: Progress | None = None) -> str:
        """Copy the local file `path` to `rel`, reading it once; returns its sha256. Raises
        Cancelled once `cancel` is set (nothing is left behind)."""

    @abstractmethod
    def download(self, rel: str, target: Path, size: int | None = None, progress: Progress | None = None,
                 cancel: HasIsSet = NOT_CANCELLED) -> None:
        """Write `rel` into the local file `target` (the caller's temp file). `size`: the file's,
        when the caller knows it from a listing; without it, ObjectMissing when there is no such
        file."""

    @abstractmethod
    def listing(self, prefix: str = "") -> dict[str, StoredObject]:
        """Every file under `prefix`: relative path → size and age."""

    @abstractmethod
    def open_uploads(self, prefix: str = "") -> list[OpenUpload]:
        """Uploads begun under `prefix` and neither completed nor aborted, whoever began them."""

    @abstractmethod
    def abort_upload(self, upload: OpenUpload) -> None:
        """Best effort: what is left is found again by open_uploads."""

    @abstractmethod
    def delete(self, rels: list[str], *, cancellable: bool = True) -> None:
        """Remove these files (a missing one is no error). cancellable=False: done even once the
        store's retry policy has been told to stop (cleaning up after oneself)."""

    @abstractmethod
    def failure(self, exc: BaseException, doing: str, rel: str) -> StorageError | None:
        """The StorageError that `exc`, raised while `doing` (read, write, download, ...) `rel`,
        is to a user: `cannot DOING URI: why`, ObjectMissing or AccessDenied when the store said
        so. None when `exc` is not the store's failure (a local file's error, Cancelled, a bug):
        re-raise those as they are."""

    def close(self) -> None:  # noqa: B027 - a local store holds nothing to release
        """Release the store's connections and threads."""
