"""The destination of checkpoints: an s3:// prefix (boto3, any S3-compatible endpoint) or a
file:// directory, with the few operations the uploader and restore need.

S3 uploads are multipart above one part size: parts go in parallel, each with a CRC32C
checksum that S3 verifies; a failed or cancelled upload is aborted, so no parts are left
behind. Downloads of large objects are parallel ranged GETs. Every request goes through
the RetryPolicy (botocore's own retries are off so that policy is the only one).

Ages (of objects, of open uploads) are measured on the store's clock (the response's Date
header against LastModified/Initiated), so a skewed local clock cannot make a live upload
look stale.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

import crc32c
from botocore.exceptions import ClientError

from lmforge.common.errors import ConfigError, StorageError
from lmforge.common.storage import atomic_write_bytes, s3_client
from lmforge.uploader.config import TransferSection
from lmforge.uploader.retry import Cancelled, RetryPolicy

Progress = Callable[[int], None]
MAX_PARTS = 10_000  # S3's limit per multipart upload; larger files get larger parts


class HasIsSet(Protocol):
    """A cancellation flag: a threading.Event, or anything else with is_set()."""

    def is_set(self) -> bool: ...


def _crc32c_b64(data) -> str:
    """S3's CRC32C checksum of `data` (hardware-accelerated: about 6x cheaper than zlib's CRC32)."""
    return base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode()


def _error_code(exc: ClientError) -> str:
    return exc.response.get("Error", {}).get("Code", "")


@dataclass(frozen=True)
class StoredObject:
    size: int
    age_seconds: float  # since LastModified, on the store's clock


@dataclass(frozen=True)
class OpenUpload:
    """An upload begun and neither completed nor aborted (S3: a multipart upload; file://
    a temp file)."""

    rel: str
    upload_id: str
    age_seconds: float  # since it was initiated, on the store's clock


def _server_now(response: dict) -> datetime:
    """The store's clock at `response` (its Date header); the local clock if it has none."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    try:
        return parsedate_to_datetime(date)
    except (TypeError, ValueError):
        return datetime.now(UTC)


class S3Destination:
    def __init__(self, uri: str, transfer: TransferSection, retry: RetryPolicy, endpoint_url: str | None = None):
        parsed = urlparse(uri)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ConfigError(f"destination {uri!r}: expected s3://BUCKET/PREFIX or file:///PATH")
        self.uri = uri.rstrip("/")
        self.bucket, self.prefix = parsed.netloc, parsed.path.strip("/")
        self.transfer, self.retry = transfer, retry
        # RetryPolicy is the only retry layer. Integrity comes from the CRC32C of each part
        # (checked by S3) and the manifest's sha256 (checked by restore): hashing every byte
        # again to sign it adds nothing.
        self.client = s3_client(self.bucket, endpoint_url, retries={"total_max_attempts": 1, "mode": "standard"},
                                max_pool_connections=transfer.concurrency + 4,
                                connect_timeout=transfer.connect_timeout_seconds,
                                read_timeout=transfer.read_timeout_seconds, s3={"payload_signing_enabled": False})
        self.parts = ThreadPoolExecutor(transfer.concurrency, thread_name_prefix="lmforge-part")

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def check(self) -> None:
        """Fail fast, with the reason, when the bucket is missing or not ours to write."""
        try:
            RetryPolicy(attempts=3, base_seconds=0.2).call("head_bucket", lambda: self.client.head_bucket(
                Bucket=self.bucket))
        except ClientError as exc:
            code = _error_code(exc)
            if code in ("404", "NoSuchBucket"):
                raise StorageError(f"{self.uri}: bucket {self.bucket!r} does not exist") from exc
            if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise StorageError(f"{self.uri}: access denied to bucket {self.bucket!r} ({code}); check the "
                                   "credentials (AWS_* env, profile, or the pod's IAM role)") from exc
            raise StorageError(f"{self.uri}: {exc}") from exc
        except Exception as exc:
            raise StorageError(f"{self.uri}: cannot reach the object store ({type(exc).__name__}: {exc})") from exc

    # -- reading -------------------------------------------------------------------------

    def get_bytes(self, rel: str) -> bytes | None:
        def get():
            try:
                return self.client.get_object(Bucket=self.bucket, Key=self.key(rel))["Body"].read()
            except ClientError as exc:
                if _error_code(exc) in ("NoSuchKey", "404"):
                    return None
                raise

        return self.retry.call(f"get {rel}", get)

    def list(self, rel_prefix: str) -> dict[str, int]:
        """Every object under rel_prefix: relative key → size."""
        return {rel: obj.size for rel, obj in self.listing(rel_prefix).items()}

    def listing(self, rel_prefix: str) -> dict[str, StoredObject]:
        """Every object under rel_prefix: relative key → size and age."""
        found: dict[str, StoredObject] = {}
        paginator = self.client.get_paginator("list_objects_v2")
        base = self.key(rel_prefix)

        def page_all():
            found.clear()
            for page in paginator.paginate(Bucket=self.bucket, Prefix=base):
                now = _server_now(page)
                for item in page.get("Contents", []):
                    found[item["Key"][len(self.key("")) :]] = StoredObject(
                        item["Size"], (now - item["LastModified"]).total_seconds())
            return found

        return self.retry.call(f"list {rel_prefix}", page_all)

    def download(self, rel: str, target: Path, size: int, progress: Progress | None = None) -> None:
        """Ranged GETs in parallel, written in place into `target` (the caller's temp file)."""
        part = self.transfer.part_size
        with open(target, "wb") as fh:
            fh.truncate(size)
        fd = os.open(target, os.O_WRONLY)
        try:
            def fetch(start: int) -> None:
                end = min(size, start + part) - 1

                def get():
                    body = self.client.get_object(Bucket=self.bucket, Key=self.key(rel), Range=f"bytes={start}-{end}")
                    data = body["Body"].read()
                    if len(data) != end - start + 1:
                        raise StorageError(f"{rel}: short read at {start}")
                    return data

                data = self.retry.call(f"get {rel}@{start}", get)
                os.pwrite(fd, data, start)
                if progress:
                    progress(len(data))

            for future in [self.parts.submit(fetch, start) for start in range(0, size, part)]:
                future.result()
        finally:
            os.close(fd)

    # -- writing -------------------------------------------------------------------------

    def put_bytes(self, rel: str, data: bytes) -> None:
        self.retry.call(f"put {rel}", lambda: self.client.put_object(
            Bucket=self.bucket, Key=self.key(rel), Body=data, ChecksumCRC32C=_crc32c_b64(data)))

    def upload_file(self, path: Path, rel: str, cancel: HasIsSet, progress: Progress | None = None) -> str:
        """Upload one file; returns its sha256. The file is read once, in order: each part is
        hashed into the whole-file sha256 and its own CRC32C, then sent by the part pool while
        the next one is read (at most `concurrency` parts held in memory)."""
        if cancel.is_set():
            raise Cancelled(rel)
        size = path.stat().st_size
        part_size = max(self.transfer.part_size, -(-size // MAX_PARTS))
        if size <= part_size:
            data = path.read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            self.put_bytes(rel, data)
            if progress:
                progress(size)
            return digest
        key = self.key(rel)
        upload_id = self.retry.call(f"create {rel}", lambda: self.client.create_multipart_upload(
            Bucket=self.bucket, Key=key, ChecksumAlgorithm="CRC32C"))["UploadId"]
        try:
            parts, digest = self._upload_parts(path, key, upload_id, part_size, cancel, progress)
            self.retry.call(f"complete {rel}", lambda: self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}))
        except BaseException:
            self.abort(key, upload_id)
            raise
        return digest

    def _upload_parts(self, path: Path, key: str, upload_id: str, part_size: int, cancel: HasIsSet,
                      progress: Progress | None) -> tuple[list[dict], str]:
        in_flight = threading.BoundedSemaphore(self.transfer.concurrency)
        whole = hashlib.sha256()

        def send(number: int, data: bytes, checksum: str) -> dict:
            try:
                if cancel.is_set():
                    raise Cancelled(key)
                response = self.retry.call(f"part {number} of {key}", lambda: self.client.upload_part(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data,
                    ChecksumCRC32C=checksum))
                if progress:
                    progress(len(data))
                return {"PartNumber": number, "ETag": response["ETag"], "ChecksumCRC32C": checksum}
            finally:
                in_flight.release()

        futures = []
        try:
            with open(path, "rb", buffering=0) as fh:
                number = 0
                while data := fh.read(part_size):
                    number += 1
                    whole.update(data)
                    checksum = _crc32c_b64(data)
                    while not in_flight.acquire(timeout=0.5):
                        if cancel.is_set() or any(f.done() and f.exception() for f in futures):
                            raise Cancelled(key)
                    futures.append(self.parts.submit(send, number, data, checksum))
            return [f.result() for f in futures], whole.hexdigest()
        except BaseException:
            for future in futures:
                future.cancel()
            wait(futures)
            failed = next((f.exception() for f in futures if not f.cancelled() and f.exception()), None)
            if failed is not None:
                raise failed from None  # the part's own error says more than "cancelled"
            raise

    def abort(self, key: str, upload_id: str) -> None:
        try:
            RetryPolicy(attempts=5).call(f"abort {key}", lambda: self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id))
        except Exception:  # noqa: S110 - best effort; the uploader's sweep aborts stale leftovers later
            pass

    def open_uploads(self, rel_prefix: str) -> list[OpenUpload]:
        """Multipart uploads open under rel_prefix, whoever began them."""
        paginator = self.client.get_paginator("list_multipart_uploads")

        def page_all():
            found = []
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.key(rel_prefix)):
                now = _server_now(page)
                found += [OpenUpload(u["Key"][len(self.key("")) :], u["UploadId"],
                                     (now - u["Initiated"]).total_seconds()) for u in page.get("Uploads", [])]
            return found

        return self.retry.call(f"list uploads {rel_prefix}", page_all)

    def abort_upload(self, upload: OpenUpload) -> None:
        self.abort(self.key(upload.rel), upload.upload_id)

    def delete(self, rels: list[str], *, cancellable: bool = True) -> None:
        """cancellable=False: done even after the grace period is over (cleaning up after oneself)."""
        retry = self.retry if cancellable else RetryPolicy(attempts=3, base_seconds=0.2)
        for start in range(0, len(rels), 1000):
            batch = [{"Key": self.key(rel)} for rel in rels[start : start + 1000]]
            retry.call("delete", lambda batch=batch: self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}))

    def close(self) -> None:
        self.parts.shutdown(wait=False, cancel_futures=True)


class FileDestination:
    """A directory standing in for the object store (the embedded default and tests)."""

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
