"""The destination of checkpoints: an s3:// prefix or a file:// directory, with the few
operations the uploader and restore need, by path relative to the destination.

S3 is lmforge.common.s3's S3Bucket (verified multipart uploads, parallel ranged downloads,
ages on the store's clock, every request retried by the uploader's RetryPolicy with botocore's
own retries off); this module maps relative paths onto its keys and says why a bucket is
unusable.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

from botocore.exceptions import ClientError

from lmforge.common.errors import ConfigError, StorageError
from lmforge.common.retry import Cancelled, RetryPolicy
from lmforge.common.s3 import HasIsSet, OpenUpload, Progress, S3Bucket, StoredObject, error_code
from lmforge.common.storage import atomic_write_bytes
from lmforge.uploader.config import TransferSection


class S3Destination:
    def __init__(self, uri: str, transfer: TransferSection, retry: RetryPolicy, endpoint_url: str | None = None):
        parsed = urlparse(uri)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ConfigError(f"destination {uri!r}: expected s3://BUCKET/PREFIX or file:///PATH")
        self.uri = uri.rstrip("/")
        self.endpoint_url = endpoint_url  # None: the AWS chain's (AWS_ENDPOINT_URL); UPLOADED markers record it
        self.bucket, self.prefix = parsed.netloc, parsed.path.strip("/")
        self.store = S3Bucket(self.bucket, endpoint_url, part_size=transfer.part_size,
                              concurrency=transfer.concurrency, connect_timeout=transfer.connect_timeout_seconds,
                              read_timeout=transfer.read_timeout_seconds, retry=retry)

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def _rel(self, key: str) -> str:
        return key[len(self.key("")) :]

    def check(self) -> None:
        """Fail fast, with the reason, when the bucket is missing or not ours to write."""
        try:
            self.store.head_bucket()
        except ClientError as exc:
            code = error_code(exc)
            if code in ("404", "NoSuchBucket"):
                raise StorageError(f"{self.uri}: bucket {self.bucket!r} does not exist") from exc
            if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise StorageError(f"{self.uri}: access denied to bucket {self.bucket!r} ({code}); check the "
                                   "credentials (AWS_* env, profile, or the pod's IAM role)") from exc
            raise StorageError(f"{self.uri}: {exc}") from exc
        except Exception as exc:
            raise StorageError(f"{self.uri}: cannot reach the object store ({type(exc).__name__}: {exc})") from exc

    def get_bytes(self, rel: str) -> bytes | None:
        return self.store.get_bytes(self.key(rel))

    def list(self, rel_prefix: str) -> dict[str, int]:
        """Every object under rel_prefix: relative key → size."""
        return {rel: obj.size for rel, obj in self.listing(rel_prefix).items()}

    def listing(self, rel_prefix: str) -> dict[str, StoredObject]:
        """Every object under rel_prefix: relative key → size and age."""
        return {self._rel(key): obj for key, obj in self.store.listing(self.key(rel_prefix)).items()}

    def download(self, rel: str, target: Path, size: int, progress: Progress | None = None) -> None:
        self.store.download(self.key(rel), target, size, progress)

    def put_bytes(self, rel: str, data: bytes) -> None:
        self.store.put_bytes(self.key(rel), data)

    def upload_file(self, path: Path, rel: str, cancel: HasIsSet, progress: Progress | None = None) -> str:
        """Upload one file; returns its sha256."""
        return self.store.upload_file(path, self.key(rel), cancel, progress)

    def open_uploads(self, rel_prefix: str) -> list[OpenUpload]:
        """Multipart uploads open under rel_prefix, whoever began them (keys relative)."""
        return [OpenUpload(self._rel(u.key), u.upload_id, u.age_seconds)
                for u in self.store.open_uploads(self.key(rel_prefix))]

    def abort_upload(self, upload: OpenUpload) -> None:
        self.store.abort(self.key(upload.key), upload.upload_id)

    def delete(self, rels: list[str], *, cancellable: bool = True) -> None:
        """cancellable=False: done even after the grace period is over (cleaning up after oneself)."""
        self.store.delete([self.key(rel) for rel in rels], cancellable=cancellable)

    def close(self) -> None:
        self.store.close()


class FileDestination:
    """A directory standing in for the object store (the embedded default and tests)."""

    endpoint_url = None

    def __init__(self, uri: str):
        self.uri = uri.rstrip("/")
        self.root = Path(urlparse(uri).path)

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"{self.uri}: cannot create the destination directory ({exc})") from exc

    def get_bytes(self, rel: str) -> bytes | None:
        path = self.root / rel
        return path.read_bytes() if path.is_file() else None

    def list(self, rel_prefix: str) -> dict[str, int]:
        return {rel: obj.size for rel, obj in self.listing(rel_prefix).items()}

    def listing(self, rel_prefix: str) -> dict[str, StoredObject]:
        now = time.time()
        return {p.relative_to(self.root).as_posix(): StoredObject(st.st_size, now - st.st_mtime)
                for p, st in self._files(rel_prefix, temp=False)}

    def _files(self, rel_prefix: str, *, temp: bool):
        base = self.root / rel_prefix
        if not base.exists():
            return
        for path in base.rglob("*"):
            try:
                if path.is_file() and path.name.startswith(".tmp-") == temp:
                    yield path, path.stat()
            except FileNotFoundError:  # renamed or removed by a concurrent writer
                continue

    def download(self, rel: str, target: Path, size: int, progress: Progress | None = None) -> None:
        shutil.copyfile(self.root / rel, target)
        if progress:
            progress(size)

    def put_bytes(self, rel: str, data: bytes) -> None:
        (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.root / rel, data)

    def upload_file(self, path: Path, rel: str, cancel: HasIsSet, progress: Progress | None = None) -> str:
        if cancel.is_set():
            raise Cancelled(rel)
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f".tmp-{uuid.uuid4().hex[:12]}-{target.name}")  # one per writer
        digest = hashlib.sha256()
        try:
            with open(path, "rb") as src, open(temp, "wb") as dst:
                while block := src.read(8 << 20):
                    digest.update(block)
                    dst.write(block)
            os.replace(temp, target)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        if progress:
            progress(path.stat().st_size)
        return digest.hexdigest()

    def open_uploads(self, rel_prefix: str) -> list[OpenUpload]:
        now = time.time()
        return [OpenUpload(rel := p.relative_to(self.root).as_posix(), rel, now - st.st_mtime)
                for p, st in self._files(rel_prefix, temp=True)]

    def abort_upload(self, upload: OpenUpload) -> None:
        (self.root / upload.upload_id).unlink(missing_ok=True)

    def delete(self, rels: list[str], *, cancellable: bool = True) -> None:
        for rel in rels:
            (self.root / rel).unlink(missing_ok=True)

    def close(self) -> None:
        pass


def open_destination(uri: str, transfer: TransferSection, retry: RetryPolicy, endpoint_url: str | None = None):
    scheme = urlparse(uri).scheme
    if scheme == "s3":
        return S3Destination(uri, transfer, retry, endpoint_url)
    if scheme == "file" and urlparse(uri).path:
        return FileDestination(uri)
    raise ConfigError(f"destination {uri!r}: expected s3://BUCKET/PREFIX or file:///PATH")
