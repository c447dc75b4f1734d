"""The model pointer: one small JSON object in the object store (or a local file) that names the
model package the inference service serves, e.g. s3://BUCKET/PREFIX/models/current:

    {"kind": "lmforge-model-pointer", "model": "s3://BUCKET/PREFIX/models/r2-step9000",
     "set_at": "2026-03-02T10:11:12Z", "set_by": "lmforge-train pipeline run …",
     "previous": [{"model": "s3://BUCKET/PREFIX/models/r1-step8000", "set_at": "…", "set_by": "…"}, …]}

Only `model` is required to read one (`{"model": "s3://…"}` written by hand works). `previous`
lists the values it replaced, the latest first (at most HISTORY): `point_to` pushes the current
value, `rollback` pops the latest one back (the value rolled back from is dropped, so a second
rollback goes one further back, never forward to the model just rolled back).

A pointer is a file and a package is a directory (a prefix), so `resolve_model` tells them apart
by whether an object exists at the URI itself. The inference server follows a pointer (it re-reads
it while serving); the chart's Deployment names the pointer, which a `helm upgrade` leaves alone.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from datetime import UTC, datetime

from lmforge.common.atomic_files import atomic_write_bytes
from lmforge.common.errors import InputError, StorageError
from lmforge.common.s3 import S3Bucket, S3Location
from lmforge.common.store import local_path_of, scheme_of

KIND = "lmforge-model-pointer"
HISTORY = 10  # earlier values kept for rollback


@dataclass(frozen=True)
class ModelPointer:
    model: str  # the package URI
    set_at: str = ""  # UTC, ISO 8601
    set_by: str = ""  # who or what wrote it
    previous: tuple[ModelPointer, ...] = ()  # the values it replaced, latest first (each without its own)

    def to_json(self) -> dict:
        return {"kind": KIND, **self._value(), "previous": [p._value() for p in self.previous]}

    def _value(self) -> dict:
        return {"model": self.model, "set_at": self.set_at, "set_by": self.set_by}

    def without_previous(self) -> ModelPointer:
        return ModelPointer(self.model, self.set_at, self.set_by)


def parse_pointer(data: bytes, where: str) -> ModelPointer:
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{where}: not a model pointer (not JSON: {exc})") from exc
    return _pointer_of(body, where)


def _pointer_of(body, where: str) -> ModelPointer:
    if not isinstance(body, dict) or not isinstance(body.get("model"), str) or not body["model"].strip():
        raise InputError(f"{where}: not a model pointer (a JSON object with a \"model\" URI is expected)")
    previous = body.get("previous")
    previous = [] if previous is None else previous
    if not isinstance(previous, list):
        raise InputError(f"{where}: \"previous\" must be a list of earlier values")
    return ModelPointer(body["model"].strip(), str(body.get("set_at", "")), str(body.get("set_by", "")),
                        tuple(_pointer_of(p, f"{where} (previous)").without_previous() for p in previous))


_buckets: dict[tuple, S3Bucket] = {}
_buckets_lock = threading.Lock()


def _bucket(bucket: str) -> S3Bucket:
    """One S3Bucket (one client) per bucket and endpoint, reused: a follower reads its pointer every few seconds."""
    key = (bucket, *(os.environ.get(name) for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_PROFILE")))
    with _buckets_lock:
        if key not in _buckets:
            _buckets[key] = S3Bucket(bucket)
        return _buckets[key]


def _read(uri: str) -> bytes | None:
    """The bytes of the object or file at `uri`; None when there is none (or it is a directory)."""
    if scheme_of(uri) == "s3":
        location = S3Location.parse(uri.rstrip("/"))
        if not location.key:  # a bucket: a package at its root, not an object
            return None
        try:
            return _bucket(location.bucket).get_bytes(location.key)  # None: no such object
        except Exception as exc:  # denied, missing bucket, or still failing after the retries
            raise StorageError(f"cannot read {uri}: {exc}") from exc
    if scheme_of(uri) != "file":
        raise InputError(f"{uri}: a model pointer is a local file or an s3:// object")
    path = local_path_of(uri)
    if not path.is_file():
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise StorageError(f"cannot read {path}: {exc}") from exc


def read_pointer(uri: str) -> ModelPointer | None:
    """The pointer at `uri`, or None when no object exists there."""
    data = _read(uri)
    return None if data is None else parse_pointer(data, uri)


def resolve_model(uri: str) -> tuple[ModelPointer | None, str]:
    """(the pointer, the package it names) when `uri` is a pointer; (None, uri) for a package."""
    pointer = read_pointer(uri)
    return (pointer, pointer.model) if pointer is not None else (None, uri)


def write_pointer(uri: str, pointer: ModelPointer) -> None:
    """Replace the pointer at `uri` in one step (an S3 PUT; a local rename): a reader sees the old
    value or the new one, never part of either."""
    data = (json.dumps(pointer.to_json(), indent=1) + "\n").encode()
    if scheme_of(uri) == "s3":
        location = S3Location.parse(uri.rstrip("/"))
        try:
            _bucket(location.bucket).put_bytes(location.key, data, content_type="application/json")
        except Exception as exc:
            raise StorageError(f"cannot write {uri}: {exc}") from exc
        return
    atomic_write_bytes(local_path_of(uri), data)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def point_to(uri: str, package: str, *, set_by: str) -> ModelPointer:
    """Point `uri` at `package`; the value replaced goes first in `previous` (unless it named
    the same package: then the history stays as it is)."""
    current = read_pointer(uri)
    previous: tuple[ModelPointer, ...] = ()
    if current is not None:
        previous = current.previous if current.model == package else (current.without_previous(), *current.previous)
    pointer = ModelPointer(package, _now(), set_by, previous[:HISTORY])
    write_pointer(uri, pointer)
    return pointer


def rollback(uri: str, *, set_by: str) -> ModelPointer:
    """Point `uri` back at the latest value in its `previous`, which leaves the history."""
    current = read_pointer(uri)
    if current is None:
        raise InputError(f"{uri}: no model pointer to roll back")
    if not current.previous:
        raise InputError(f"{uri}: the pointer names no previous model to roll back to (it serves {current.model})")
    back, *rest = current.previous
    pointer = ModelPointer(back.model, _now(), f"{set_by} (rollback from {current.model})", tuple(rest))
    write_pointer(uri, pointer)
    return pointer
