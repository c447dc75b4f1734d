"""The S3 client wrapper: one bucket (any S3-compatible endpoint) by full key, with verified
transfers, every request retried by the one retry policy (lmforge.common.retry), and what S3's
errors mean (`s3_failure`). Every lmforge reader and writer of s3:// goes through it, most of
them through the Store over it (lmforge.common.s3_store.S3Store: data prep's outputs, the
checkpoint uploader and restore, the trainer's streamed data, data prep's fetch); the model
pointer, model fetching and open_input use S3Bucket directly.

Who retries what: botocore's own retries are off (total_max_attempts=1 on every client made
here) and its HTTP layer never retries, so each request (one part, one ranged GET, one small
object, one listing, ...) is retried by the RetryPolicy alone, and only when its error is
transient (`is_transient`: throttling, 5xx, timeouts, dropped connections). An error that
waiting will not cure (missing bucket or key, denied access, a bad request) fails at once.

Uploads above one part size are multipart: the file is read once, in order; each part is
hashed into the whole file's sha256 and its own CRC32C (which S3 verifies), then sent by the
part pool while the next one is read (at most `concurrency` parts in memory). A failed or
cancelled upload is aborted, so no parts are left behind. A smaller object is one PUT with its
CRC32C. Downloads are parallel ranged GETs, each checked for its length; `get_range` is one of
them (the trainer's streaming reads).

Ages (of objects, of open uploads) are measured on the store's clock (the response's Date
header against LastModified/Initiated), so a skewed local clock cannot make a live upload look
stale.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import os
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from urllib.parse import urlparse

import crc32c

from lmforge.common.errors import InputError, StorageError
from lmforge.common.logging import get_logger
from lmforge.common.retry import Cancelled, RetryPolicy, never
from lmforge.common.store import (
    NOT_CANCELLED,
    AccessDenied,
    HasIsSet,
    ObjectMissing,
    OpenUpload,
    Progress,
    StoredObject,
)

PUBLIC_ANONYMOUS_BUCKETS = frozenset({"commoncrawl"})
MIB = 1 << 20
DEFAULT_PART_SIZE = 8 * MIB
MAX_PARTS = 10_000  # S3's limit per multipart upload; larger files get larger parts
TRANSIENT_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeTooSkewed",
                             "InternalError", "ServiceUnavailable", "503", "500", "502", "504"})
NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})  # no such object (a HEAD or GET answers None)
MISSING_BUCKET_CODES = frozenset({"404", "NoSuchBucket"})  # to a request about the bucket itself
MISSING_CODES = NOT_FOUND_CODES | MISSING_BUCKET_CODES
DENIED_CODES = frozenset({"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"})


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


def s3_client(bucket: str | None = None, endpoint_url: str | None = None, *,
              credentials: Mapping[str, str] | None = None, **config):
    """A boto3 S3 client with botocore's retries off (the RetryPolicy retries). Credentials come
    from the standard AWS chain, or from `credentials` (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    AWS_DEFAULT_REGION, as the environment would name them); the endpoint from the argument or
    AWS_ENDPOINT_URL(_S3). Public buckets are read unsigned. `config` overrides botocore Config
    fields (timeouts, pool size, s3 options)."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    anonymous = bucket in PUBLIC_ANONYMOUS_BUCKETS and os.environ.get("LMFORGE_S3_ANONYMOUS", "1") != "0"
    settings = {"retries": {"total_max_attempts": 1, "mode": "standard"},
                "signature_version": UNSIGNED if anonymous else None, **config}
    given = credentials or {}
    keys = {"aws_access_key_id": given.get("AWS_ACCESS_KEY_ID"), "region_name": given.get("AWS_DEFAULT_REGION"),
            "aws_secret_access_key": given.get("AWS_SECRET_ACCESS_KEY")}
    # A session per client: boto3's default session is not safe to share across threads.
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=Config(**settings),
                                          **{name: value for name, value in keys.items() if value})


def error_code(exc: BaseException) -> str:
    """S3's error code of a botocore ClientError ('' for anything else)."""
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def is_transient(exc: BaseException) -> bool:
    """Worth another try: throttling, 5xx, timeouts, dropped connections."""
    from botocore.exceptions import ClientError, HTTPClientError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return True  # connection reset or closed, read timeout, endpoint briefly unreachable
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return error_code(exc) in TRANSIENT_CODES or status >= 500
    return False


def is_s3_error(exc: BaseException) -> bool:
    """An error of a request to the store (botocore's, or a transfer S3Bucket found wrong), as
    opposed to a local file's OSError, a cancel, or a bug."""
    from botocore.exceptions import BotoCoreError, ClientError

    return isinstance(exc, BotoCoreError | ClientError | StorageError)


def s3_failure(exc: BaseException, context: str) -> StorageError | None:
    """What a failed request means to a user: ObjectMissing (no such key or bucket), AccessDenied,
    else a StorageError, each `context: exc`; None when `exc` is no store error (is_s3_error)."""
    if not is_s3_error(exc):
        return None
    if isinstance(exc, StorageError):
        kind = type(exc)
    else:
        code = error_code(exc)
        kind = ObjectMissing if code in MISSING_CODES else AccessDenied if code in DENIED_CODES else StorageError
    return kind(f"{context}: {exc}")


def crc32c_b64(data) -> str:
    """S3's CRC32C checksum of `data` (hardware-accelerated: about 6x cheaper than zlib's CRC32)."""
    return base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode()


@dataclass(frozen=True)
class ObjectHead:
    """What a HEAD says of an object: its ETag (the store's identity of these bytes) and size."""

    etag: str
    size: int


def _server_now(response: dict) -> datetime:
    """The store's clock at `response` (its Date header); the local clock if it has none."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    try:
        return parsedate_to_datetime(date)
    except (TypeError, ValueError):
        return datetime.now(UTC)


class S3Bucket:
    """The objects of one bucket, by full key. `retry` defaults to the policy's defaults, logged
    as `storage`; its predicate is replaced by is_transient. `credentials`: see s3_client."""

    def __init__(self, bucket: str, endpoint_url: str | None = None, *, part_size: int = DEFAULT_PART_SIZE,
                 concurrency: int = 10, connect_timeout: float = 10.0, read_timeout: float = 60.0,
                 retry: RetryPolicy | None = None, credentials: Mapping[str, str] | None = None):
        self.bucket = bucket
        self.part_size, self.concurrency = part_size, concurrency
        self.retry = retry or RetryPolicy(log=get_logger("storage"))
        # Integrity comes from the CRC32C of each part (checked by S3) and the callers' sha256:
        # hashing every byte again to sign it adds nothing.
        self.client = s3_client(bucket, endpoint_url, credentials=credentials, max_pool_connections=concurrency + 4,
                                connect_timeout=connect_timeout, read_timeout=read_timeout,
                                s3={"payload_signing_enabled": False})
        self._parts = ThreadPoolExecutor(concurrency, thread_name_prefix="lmforge-part")

    def _call(self, what: str, fn, policy: RetryPolicy | None = None):
        return (policy or self.retry).call(what, fn, retryable=is_transient)

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def create(self) -> None:
        """Create the bucket (a local S3-compatible server's, for the demo)."""
        self._call("create_bucket", lambda: self.client.create_bucket(Bucket=self.bucket))

    # -- reading -------------------------------------------------------------------------

    def head_bucket(self) -> None:
        """Raises the ClientError when the bucket is missing or not ours (three tries at most)."""
        self._call("head_bucket", lambda: self.client.head_bucket(Bucket=self.bucket),
                   dataclasses.replace(self.retry, attempts=3, should_stop=never))

    def head(self, key: str) -> ObjectHead | None:
        """The object's ETag and size (one HEAD); None when there is no object at `key`."""
        from botocore.exceptions import ClientError

        def head():
            try:
                response = self.client.head_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                if error_code(exc) in NOT_FOUND_CODES:
                    return None
                raise
            return ObjectHead(response["ETag"], response["ContentLength"])

        return self._call(f"head {key}", head)

    def size_of(self, key: str) -> int | None:
        """The object's size; None when there is no object at `key`."""
        head = self.head(key)
        return None if head is None else head.size

    def get_bytes(self, key: str) -> bytes | None:
        """The object's bytes; None when there is no object at `key`."""
        from botocore.exceptions import ClientError

        def get():
            try:
                return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            except ClientError as exc:
                if error_code(exc) in NOT_FOUND_CODES:
                    return None
                raise

        return self._call(f"get {key}", get)

    def open_stream(self, key: str):
        """The object's body to read as a stream (botocore StreamingBody: read(n), close()). The GET
        is retried; a stream that breaks later is the reader's to handle."""
        return self._call(f"get {key}", lambda: self.client.get_object(Bucket=self.bucket, Key=key)["Body"])

    def get_range_sized(self, key: str, start: int, length: int) -> tuple[bytes, int]:
        """Up to `length` bytes from `start` (one ranged GET; fewer only where the object ends) and
        the object's whole size (from Content-Range), so the caller can check it against what it
        expects. A missing object, or a `start` past its end, raises the ClientError (NoSuchKey,
        InvalidRange)."""
        if length <= 0:
            return b"", self.size_of(key) or 0

        def get():
            response = self.client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{start + length - 1}")
            data = response["Body"].read()
            total_text = response.get("ContentRange", "").rpartition("/")[2]
            total = int(total_text) if total_text.isdigit() else start + len(data)
            if len(data) != min(length, total - start):
                raise StorageError(f"{self.url(key)}: short read at {start}")
            return data, total

        return self._call(f"get {key}@{start}", get)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Exactly `length` bytes of the object from `start`, or a StorageError."""
        if length <= 0:
            return b""
        data, _ = self.get_range_sized(key, start, length)
        if len(data) != length:
            raise StorageError(f"{self.url(key)}: short read at {start} (the object ends first)")
        return data

    def open_ranged(self, key: str, buffer_size: int = MIB) -> io.BufferedReader:
        """A seekable, read-only file over the object: reads are ranged GETs of what is read
        (at least `buffer_size` bytes each), so a reader that seeks (Parquet: the footer, then the
        column chunks it needs) fetches only that, and nothing is written to local disk."""
        size = self.size_of(key)
        if size is None:
            raise ObjectMissing(f"{self.url(key)}: no such object")
        return io.BufferedReader(RangeReader(self, key, size), buffer_size)

    def listing(self, prefix: str) -> dict[str, StoredObject]:
        """Every object under `prefix`: key → size and age."""
        paginator = self.client.get_paginator("list_objects_v2")

        def page_all():
            found = {}
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                now = _server_now(page)
                for item in page.get("Contents", []):
                    found[item["Key"]] = StoredObject(item["Size"], (now - item["LastModified"]).total_seconds())
            return found

        return self._call(f"list {prefix}", page_all)

    def download(self, key: str, target: Path, size: int | None = None, progress: Progress | None = None,
                 cancel: HasIsSet = NOT_CANCELLED) -> None:
        """Ranged GETs in parallel, written in place into `target` (the caller's temp file).
        `size`: the object's, when the caller knows it from a listing."""
        if size is None:
            size = self.size_of(key)
            if size is None:
                raise ObjectMissing(f"{self.url(key)}: no such object")
        part = self.part_size
        with open(target, "wb") as fh:
            fh.truncate(size)
        fd = os.open(target, os.O_WRONLY)

        def fetch(start: int) -> None:
            if cancel.is_set():
                raise Cancelled(key)
            data = self.get_range(key, start, min(size, start + part) - start)
            os.pwrite(fd, data, start)
            if progress:
                progress(len(data))

        futures = [self._parts.submit(fetch, start) for start in range(0, size, part)]
        try:
            for future in futures:
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            wait(futures)  # no part writes to the descriptor once it is closed
            raise
        finally:
            os.close(fd)

    # -- writing -------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes, content_type: str | None = None) -> None:
        extra = {"ContentType": content_type} if content_type else {}
        self._call(f"put {key}", lambda: self.client.put_object(
            Bucket=self.bucket, Key=key, Body=data, ChecksumCRC32C=crc32c_b64(data), **extra))

    def upload_file(self, path: Path, key: str, cancel: HasIsSet = NOT_CANCELLED,
                    progress: Progress | None = None) -> str:
        """Upload one file (see the module docstring); returns its sha256."""
        if cancel.is_set():
            raise Cancelled(key)
        size = Path(path).stat().st_size
        part_size = max(self.part_size, -(-size // MAX_PARTS))
        if size <= part_size:
            data = Path(path).read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            self.put_bytes(key, data)
            if progress:
                progress(size)
            return digest
        upload_id = self._call(f"create {key}", lambda: self.client.create_multipart_upload(
            Bucket=self.bucket, Key=key, ChecksumAlgorithm="CRC32C"))["UploadId"]
        try:
            parts, digest = self._upload_parts(Path(path), key, upload_id, part_size, cancel, progress)
            self._call(f"complete {key}", lambda: self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}))
        except BaseException:
            self.abort(key, upload_id)
            raise
        return digest

    def _upload_parts(self, path: Path, key: str, upload_id: str, part_size: int, cancel: HasIsSet,
                      progress: Progress | None) -> tuple[list[dict], str]:
        in_flight = threading.BoundedSemaphore(self.concurrency)
        whole = hashlib.sha256()

        def send(number: int, data: bytes, checksum: str) -> dict:
            try:
                if cancel.is_set():
                    raise Cancelled(key)
                response = self._call(f"part {number} of {key}", lambda: self.client.upload_part(
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
                    checksum = crc32c_b64(data)
                    while not in_flight.acquire(timeout=0.5):
                        if cancel.is_set() or any(f.done() and f.exception() for f in futures):
                            raise Cancelled(key)
                    futures.append(self._parts.submit(send, number, data, checksum))
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
        """Best effort, even after a cancel: the uploader's sweep aborts stale leftovers later."""
        try:
            self._call(f"abort {key}", lambda: self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id),
                dataclasses.replace(self.retry, attempts=5, should_stop=never))
        except Exception:  # noqa: S110 - best effort (see the docstring)
            pass

    def open_uploads(self, prefix: str) -> list[OpenUpload]:
        """Multipart uploads open under `prefix`, whoever began them."""
        paginator = self.client.get_paginator("list_multipart_uploads")

        def page_all():
            found = []
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                now = _server_now(page)
                found += [OpenUpload(u["Key"], u["UploadId"], (now - u["Initiated"]).total_seconds())
                          for u in page.get("Uploads", [])]
            return found

        return self._call(f"list uploads {prefix}", page_all)

    def delete(self, keys: list[str], *, cancellable: bool = True) -> None:
        """cancellable=False: done even once should_stop() is true (cleaning up after oneself)."""
        policy = None if cancellable else dataclasses.replace(self.retry, attempts=3, should_stop=never)
        for start in range(0, len(keys), 1000):
            batch = [{"Key": key} for key in keys[start : start + 1000]]
            self._call("delete", lambda batch=batch: self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}), policy)

    def close(self) -> None:
        self._parts.shutdown(wait=False, cancel_futures=True)


class RangeReader(io.RawIOBase):
    """The raw file under S3Bucket.open_ranged: each readinto is one ranged GET at the position."""

    def __init__(self, objects: S3Bucket, key: str, size: int):
        super().__init__()
        self.objects, self.key, self.size = objects, key, size
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self.position = base + offset
        return self.position

    def readinto(self, buffer) -> int:
        length = min(len(buffer), self.size - self.position)
        if length <= 0:
            return 0
        try:
            data = self.objects.get_range(self.key, self.position, length)
        except StorageError:
            raise
        except Exception as exc:  # botocore's, once the retries are spent: a reader's error is a StorageError
            raise StorageError(f"cannot read {self.objects.url(self.key)}: {exc}") from exc
        memoryview(buffer).cast("B")[:length] = data
        self.position += length
        return length
