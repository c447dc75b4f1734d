"""An s3:// prefix as a Store (lmforge.common.store) over one S3Bucket (lmforge.common.s3):
verified multipart uploads, parallel ranged downloads, ranged reads, ages on the store's clock,
every request retried by the bucket's RetryPolicy. This module maps relative paths onto keys
and S3's errors onto what they mean (s3.s3_failure).

Local disk (under TMPDIR, so a pod's emptyDir bounds it): open_write spools to a temp file that
is deleted once uploaded; local_path downloads into `cache_dir`, which is the caller's to keep
when given, else a temp directory made on first use and deleted by release_local_copies (or
when the process exits).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from lmforge.common.atomic_files import name_write_error
from lmforge.common.errors import StorageError
from lmforge.common.s3 import DENIED_CODES, MISSING_BUCKET_CODES, S3Bucket, S3Location, error_code, s3_failure
from lmforge.common.store import NOT_CANCELLED, HasIsSet, ObjectMissing, OpenUpload, Progress, Store, StoredObject

# S3Store's own temp directories in this process: release_local_copies removes one, and
# whatever is left goes when the process exits.
_temp_cache_dirs: set[Path] = set()


@atexit.register
def _remove_temp_cache_dirs() -> None:
    for directory in list(_temp_cache_dirs):
        shutil.rmtree(directory, ignore_errors=True)


class S3Store(Store):
    """`bucket_options`: S3Bucket's (endpoint_url, part_size, concurrency, connect_timeout,
    read_timeout, retry, credentials)."""

    def __init__(self, uri: str, cache_dir: str | Path | None = None, **bucket_options: Any):
        loc = S3Location.parse(uri.rstrip("/") + "/")
        self.bucket, self.prefix = loc.bucket, loc.key
        self.uri = uri.rstrip("/")
        self.endpoint_url = bucket_options.get("endpoint_url")
        self.objects = S3Bucket(self.bucket, **bucket_options)
        self._given_cache_dir = Path(cache_dir) if cache_dir else None
        self._temp_cache_dir: Path | None = None

    def _key(self, rel: str) -> str:
        return self.prefix + rel

    def _rel(self, key: str) -> str:
        return key[len(self.prefix) :]

    def _error(self, exc: BaseException, doing: str, rel: str) -> StorageError:
        """failure(), for any error: what a read or write by path raises."""
        return self.failure(exc, doing, rel) or StorageError(f"cannot {doing} {self.join(rel)}: {exc}")

    # -- reads and writes by path ----------------------------------------------------------

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

    def exists(self, rel: str) -> bool:
        try:
            return self.objects.size_of(self._key(rel)) is not None
        except Exception as exc:
            raise self._error(exc, "stat", rel) from exc

    def read_bytes(self, rel: str) -> bytes:
        try:
            data = self.objects.get_bytes(self._key(rel))
        except Exception as exc:
            raise self._error(exc, "read", rel) from exc
        if data is None:
            raise ObjectMissing(f"cannot read {self.join(rel)}: no such object")
        return data

    def read_range(self, rel: str, start: int, length: int) -> bytes:
        try:
            return self.objects.get_range(self._key(rel), start, length)
        except Exception as exc:
            raise self._error(exc, "read", rel) from exc

    def read_range_sized(self, rel: str, start: int, length: int) -> tuple[bytes, int]:
        key = self._key(rel)
        try:
            try:
                return self.objects.get_range_sized(key, start, length)
            except Exception as exc:
                if error_code(exc) != "InvalidRange":
                    raise
                size = self.objects.size_of(key)  # it starts past the end: nothing there, and its size says why
                if size is None:
                    raise
                return b"", size
        except Exception as exc:
            raise self._error(exc, "read", rel) from exc

    @contextlib.contextmanager
    def open_write(self, rel: str) -> Iterator[BinaryIO]:
        # S3 PUTs are atomic; spool to a local temp file (deleted on leaving the block) so large
        # objects go up in parts.
        with tempfile.NamedTemporaryFile(prefix="lmforge-spool-", delete=True) as tmp:
            try:
                yield tmp
                tmp.flush()
            except OSError as exc:
                name_write_error(exc, tmp.name, self.join(rel))
                raise
            try:
                self.objects.upload_file(Path(tmp.name), self._key(rel))
            except Exception as exc:
                raise self._error(exc, "write", rel) from exc

    def open_read(self, rel: str) -> BinaryIO:
        try:
            return self.objects.open_ranged(self._key(rel))
        except Exception as exc:
            raise self._error(exc, "read", rel) from exc

    def list(self, prefix: str = "") -> list[str]:
        try:
            keys = self.objects.listing(self._key(prefix))
        except Exception as exc:
            raise self._error(exc, "list", prefix) from exc
        return sorted(self._rel(key) for key in keys)

    def local_path(self, rel: str) -> Path:
        target = self.cache_dir / rel
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".tmp-{target.name}")
            try:
                self.objects.download(self._key(rel), tmp)
            except Exception as exc:
                tmp.unlink(missing_ok=True)
                # A local write's OSError stays one (naming the file); botocore's timeouts are OSErrors too.
                if isinstance(exc, OSError) and self.failure(exc, "download", rel) is None:
                    name_write_error(exc, tmp, self.join(rel))
                    raise
                raise self._error(exc, "download", rel) from exc
            os.replace(tmp, target)
        return target

    # -- object transfers ------------------------------------------------------------------

    def check(self) -> None:
        """One HEAD of the bucket (three tries at most)."""
        from botocore.exceptions import ClientError

        try:
            self.objects.head_bucket()
        except ClientError as exc:
            code = error_code(exc)
            if code in MISSING_BUCKET_CODES:
                raise StorageError(f"{self.uri}: bucket {self.bucket!r} does not exist") from exc
            if code in DENIED_CODES:
                raise StorageError(f"{self.uri}: access denied to bucket {self.bucket!r} ({code}); check the "
                                   "credentials (AWS_* env, profile, or the pod's IAM role)") from exc
            raise StorageError(f"{self.uri}: {exc}") from exc
        except Exception as exc:
            raise StorageError(f"{self.uri}: cannot reach the object store ({type(exc).__name__}: {exc})") from exc

    def get_bytes(self, rel: str) -> bytes | None:
        return self.objects.get_bytes(self._key(rel))

    def put_bytes(self, rel: str, data: bytes) -> None:
        self.objects.put_bytes(self._key(rel), data)

    def upload_file(self, path: Path, rel: str, cancel: HasIsSet = NOT_CANCELLED,
                    progress: Progress | None = None) -> str:
        return self.objects.upload_file(path, self._key(rel), cancel, progress)

    def download(self, rel: str, target: Path, size: int | None = None, progress: Progress | None = None,
                 cancel: HasIsSet = NOT_CANCELLED) -> None:
        self.objects.download(self._key(rel), target, size, progress, cancel)

    def listing(self, prefix: str = "") -> dict[str, StoredObject]:
        return {self._rel(key): obj for key, obj in self.objects.listing(self._key(prefix)).items()}

    def open_uploads(self, prefix: str = "") -> list[OpenUpload]:
        return [OpenUpload(self._rel(u.key), u.upload_id, u.age_seconds)
                for u in self.objects.open_uploads(self._key(prefix))]

    def abort_upload(self, upload: OpenUpload) -> None:
        self.objects.abort(self._key(upload.key), upload.upload_id)

    def delete(self, rels: list[str], *, cancellable: bool = True) -> None:
        self.objects.delete([self._key(rel) for rel in rels], cancellable=cancellable)

    def failure(self, exc: BaseException, doing: str, rel: str) -> StorageError | None:
        return s3_failure(exc, f"cannot {doing} {self.join(rel)}")

    def close(self) -> None:
        self.objects.close()
