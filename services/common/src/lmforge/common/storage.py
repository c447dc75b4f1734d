"""Where bytes live: local paths, http(s) URLs and s3:// URIs.

Two kinds of use:
- `open_input(uri)` streams one input (WET file, listing) from any of the three;
- a `Store` is an output root (a local directory or an s3:// prefix) with atomic writes:
  a reader never sees a half-written file, and a failed write leaves nothing behind.

Every s3:// request goes through lmforge.common.s3 (verified multipart uploads, parallel ranged
downloads, the one retry policy).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fnmatch
import glob
import hashlib
import http.client
import os
import secrets
import shutil
import stat
import tempfile
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlparse

from lmforge.common.errors import InputError, StorageError
from lmforge.common.s3 import S3Bucket

HTTP_TIMEOUT_S = 60
# write() and flush() fail with these without naming the file (a full disk, a quota, a size limit)
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})


# S3Store's own temp directories in this process: release_local_copies removes one, and
# whatever is left goes when the process exits.
_temp_cache_dirs: set[Path] = set()


@atexit.register
def _remove_temp_cache_dirs() -> None:
    for directory in list(_temp_cache_dirs):
        shutil.rmtree(directory, ignore_errors=True)


@dataclass(frozen=True)
class S3Location:
    bucket: str
    key: str

    @classmethod
    def parse(cls, uri: str) -> S3Location:
        parsed = urlparse(uri)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise InputError(f"not an s3:// URI: {uri!r}")
        return cls(parsed.netloc, parsed.path.lstrip("/"))


def scheme_of(uri: str) -> str:
    scheme = urlparse(uri).scheme
    return scheme if scheme in {"s3", "http", "https", "file"} else "file"


def local_path_of(uri: str) -> Path:
    return Path(urlparse(uri).path) if uri.startswith("file://") else Path(uri)


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------- inputs


def expand_inputs(patterns: list[str]) -> list[str]:
    """Expand local globs and s3:// globs into a sorted, de-duplicated list of URIs.
    http(s) URLs are taken as they are. A pattern that matches nothing is an error."""
    return [uri for uri, _ in expand_inputs_with_sizes(patterns)]


def expand_inputs_with_sizes(patterns: list[str]) -> list[tuple[str, int | None]]:
    """expand_inputs, each URI with its size in bytes where the expansion learns it (a local file,
    an object an s3:// glob listed), else None (http(s) URLs, s3:// URIs without a glob)."""
    found: dict[str, int | None] = {}
    for pattern in patterns:
        scheme = scheme_of(pattern)
        if scheme in {"http", "https"}:
            found.setdefault(pattern, None)
        elif scheme == "s3":
            for uri, size in _expand_s3(pattern):
                found[uri] = size if size is not None else found.get(uri)
        else:
            path = str(local_path_of(pattern))
            if not glob.has_magic(path) and not os.path.exists(path):
                raise InputError(f"input not found: {pattern}")
            matches = sorted(glob.glob(path, recursive=True)) if glob.has_magic(path) else [path]
            matches = [m for m in matches if not os.path.isdir(m)]
            if not matches:
                raise InputError(f"input pattern matched no files: {pattern}")
            found.update((m, input_size(m)) for m in matches)
    return sorted(found.items())


def _expand_s3(pattern: str) -> list[tuple[str, int | None]]:
    loc = S3Location.parse(pattern)
    if not glob.has_magic(loc.key):
        return [(pattern, None)]
    prefix = loc.key[: min(loc.key.index(c) for c in "*?[" if c in loc.key)]
    listed = S3Bucket(loc.bucket).listing(prefix)
    matches = [(f"s3://{loc.bucket}/{k}", listed[k].size) for k in sorted(listed) if fnmatch.fnmatchcase(k, loc.key)]
    if not matches:
        raise InputError(f"input pattern matched no objects: {pattern}")
    return matches


def open_input(uri: str) -> BinaryIO:
    """Open an input for streaming reads. Raises InputError when it cannot be opened."""
    scheme = scheme_of(uri)
    try:
        if scheme in {"http", "https"}:
            request = urllib.request.Request(uri, headers={"User-Agent": "lmforge/0.1"})  # noqa: S310
            return urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S)  # noqa: S310 - http(s) only here
        if scheme == "s3":
            loc = S3Location.parse(uri)
            return S3Bucket(loc.bucket).open_stream(loc.key)  # botocore StreamingBody: read(n), close()
        return open(local_path_of(uri), "rb")
    except (OSError, ValueError, http.client.HTTPException) as exc:  # ValueError: a malformed URL or path
        raise InputError(f"cannot open input {uri}: {exc}") from exc
    except Exception as exc:  # botocore ClientError, EndpointConnectionError, ...
        if type(exc).__module__.startswith("botocore"):
            raise InputError(f"cannot open input {uri}: {exc}") from exc
        raise


def input_size(uri: str) -> int | None:
    """Size in bytes when it is cheap to know (local files), else None."""
    if scheme_of(uri) == "file":
        try:
            return local_path_of(uri).stat().st_size
        except OSError:
            return None
    return None


# ---------------------------------------------------------------- output stores


class Store(ABC):
    """An output root with atomic writes. Paths are relative, '/'-separated."""

    uri: str

    @abstractmethod
    def exists(self, rel: str) -> bool: ...

    @abstractmethod
    def read_bytes(self, rel: str) -> bytes: ...

    @abstractmethod
    def read_range(self, rel: str, start: int, length: int) -> bytes:
        """`length` bytes of `rel` from byte `start`: a ranged GET remotely. Asking past the end is
        an error remotely, a short read locally: ask only for bytes that exist."""

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


class LocalStore(Store):
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.uri = str(self.root)

    def _path(self, rel: str) -> Path:
        return self.root / rel

    def exists(self, rel: str) -> bool:
        return self._path(rel).exists()

    def read_bytes(self, rel: str) -> bytes:
        try:
            return self._path(rel).read_bytes()
        except OSError as exc:
            raise StorageError(f"cannot read {self._path(rel)}: {exc}") from exc

    def read_range(self, rel: str, start: int, length: int) -> bytes:
        try:
            with open(self._path(rel), "rb") as fh:
                fh.seek(start)
                return fh.read(length)
        except OSError as exc:
            raise StorageError(f"cannot read {self._path(rel)}: {exc}") from exc

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
        out = []
        for path in base.rglob("*"):
            if path.is_file() and not path.name.startswith(".tmp-"):
                out.append(path.relative_to(self.root).as_posix())
        return sorted(out)

    def local_path(self, rel: str) -> Path:
        return self._path(rel)

    def release_local_copies(self) -> None:
        pass  # local_path is the file itself


class S3Store(Store):
    """An s3:// prefix. Writes are uploaded by lmforge.common.s3 (CRC32C per part, checked by S3).

    Local disk (under TMPDIR, so a pod's emptyDir bounds it): a write is spooled to a temp file
    that is deleted once uploaded; local_path downloads into `cache_dir`, which is the caller's
    to keep when given, else a temp directory made on first use and deleted by
    release_local_copies (or when the process exits)."""

    def __init__(self, uri: str, cache_dir: str | Path | None = None):
        loc = S3Location.parse(uri.rstrip("/") + "/")
        self.bucket, self.prefix = loc.bucket, loc.key
        self.uri = uri.rstrip("/")
        self.objects = S3Bucket(self.bucket)
        self._given_cache_dir = Path(cache_dir) if cache_dir else None
        self._temp_cache_dir: Path | None = None

    @property
    def cache_dir(self) -> Path:
        if self._given_cache_dir is not None:
            return self._given_cache_dir
        if self._temp_cache_dir is None:
            self._temp_cache_dir = Path(tempfile.mkdtemp(prefix="lmforge-s3cache-"))
            _temp_cache_dirs.add(self._temp_cache_dir)
        return self._temp_cache_dir

    def release_local_copies(self) -> None:
        if self._temp_cache_dir is not None:
            shutil.rmtree(self._temp_cache_dir, ignore_errors=True)
            _temp_cache_dirs.discard(self._temp_cache_dir)
            self._temp_cache_dir = None

    def _key(self, rel: str) -> str:
        return self.prefix + rel

    def exists(self, rel: str) -> bool:
        try:
            return self.objects.size_of(self._key(rel)) is not None
        except Exception as exc:
            raise StorageError(f"cannot stat {self.join(rel)}: {exc}") from exc

    def read_bytes(self, rel: str) -> bytes:
        try:
            data = self.objects.get_bytes(self._key(rel))
        except Exception as exc:
            raise StorageError(f"cannot read {self.join(rel)}: {exc}") from exc
        if data is None:
            raise StorageError(f"cannot read {self.join(rel)}: no such object")
        return data

    def read_range(self, rel: str, start: int, length: int) -> bytes:
        try:
            return self.objects.get_range(self._key(rel), start, length)
        except Exception as exc:
            raise StorageError(f"cannot read {self.join(rel)}: {exc}") from exc

    @contextlib.contextmanager
    def open_write(self, rel: str) -> Iterator[BinaryIO]:
        # S3 PUTs are atomic; spool to a local temp file (deleted on leaving the block) so large
        # objects go up in parts.
        with tempfile.NamedTemporaryFile(prefix="lmforge-spool-", delete=True) as tmp:
            try:
                yield tmp
                tmp.flush()
            except OSError as exc:
                _name_write_error(exc, tmp.name, self.join(rel))
                raise
            try:
                self.objects.upload_file(Path(tmp.name), self._key(rel))
            except Exception as exc:
                raise StorageError(f"cannot write {self.join(rel)}: {exc}") from exc

    def open_read(self, rel: str) -> BinaryIO:
        try:
            return self.objects.open_ranged(self._key(rel))
        except Exception as exc:
            raise StorageError(f"cannot read {self.join(rel)}: {exc}") from exc

    def list(self, prefix: str = "") -> list[str]:
        try:
            keys = self.objects.listing(self._key(prefix))
        except Exception as exc:
            raise StorageError(f"cannot list {self.join(prefix)}: {exc}") from exc
        return sorted(key[len(self.prefix) :] for key in keys)

    def local_path(self, rel: str) -> Path:
        target = self.cache_dir / rel
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".tmp-{target.name}")
            try:
                self.objects.download(self._key(rel), tmp)
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                _name_write_error(exc, tmp, self.join(rel))
                raise
            except Exception as exc:
                tmp.unlink(missing_ok=True)
                raise StorageError(f"cannot download {self.join(rel)}: {exc}") from exc
            os.replace(tmp, target)
        return target


def _name_write_error(exc: OSError, local: str | Path, remote: str) -> None:
    """Make a full temp dir's write error name the local file and the object it stands for:
    `No space left on device (ENOSPC): /tmp/lmforge-spool-x -> s3://b/k`."""
    if exc.filename is None and exc.errno in _WRITE_ERRNOS:
        exc.filename, exc.filename2 = str(local), remote


def open_store(uri: str | Path) -> Store:
    uri = str(uri)
    if scheme_of(uri) == "s3":
        return S3Store(uri)
    if scheme_of(uri) in {"http", "https"}:
        raise StorageError(f"cannot write output to an http(s) URL: {uri}")
    return LocalStore(local_path_of(uri))


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
        if isinstance(exc, OSError) and exc.filename is None and exc.errno in _WRITE_ERRNOS:
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
