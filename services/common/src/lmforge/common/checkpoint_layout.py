"""The on-disk checkpoint layout and commit protocol shared by the trainer (writer), the
uploader sidecar (reader/publisher) and restore (docs/design.md: "a checkpoint exists only once
its commit marker is written").

    CKPT_DIR/step-00000042/...        one directory per step
    CKPT_DIR/step-00000042/COMMITTED  written last by the trainer: the files are complete
    CKPT_DIR/step-00000042/UPLOADED   written by the uploader (and restore) once a store holds it: which
                                      store, and which MANIFEST.json there (UploadRecord); "uploaded"
                                      is checked against that store (is_uploaded), never the bare file
    CKPT_DIR/step-00000042/BAD        written by the trainer when a committed checkpoint failed
                                      to load ({"step", "file", "reason", …}): no reader uses the step again,
                                      and no cleanup deletes it (an operator may want to look);
                                      a new copy of the step moves it aside to step-N.bad first
    CKPT_DIR/best.json                {"step", "val_loss"} of the best committed checkpoint
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from lmforge.common.atomic_files import atomic_write_bytes
from lmforge.common.errors import StorageError
from lmforge.common.logging import get_logger
from lmforge.common.retry import RetryPolicy
from lmforge.common.s3 import ObjectHead, S3Bucket

COMMIT_MARKER = "COMMITTED"
UPLOADED_MARKER = "UPLOADED"
BAD_MARKER = "BAD"
BEST_FILE = "best.json"
STEP_PREFIX = "step-"
_STEP_NAME = re.compile(r"step-(\d{8,})")


def step_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def step_dir(root: Path, step: int) -> Path:
    return root / step_name(step)


def parse_step(name: str) -> int | None:
    """The step of a `step-NNNNNNNN` name, else None."""
    match = _STEP_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def is_committed(path: Path) -> bool:
    """A step directory readers may use: committed, and not marked bad."""
    return (path / COMMIT_MARKER).exists() and not (path / BAD_MARKER).exists()


def step_dirs(root: Path, *, committed: bool) -> list[int]:
    """Steps with (committed=True) or without (False) a commit marker, ascending. A step
    marked bad is in neither list."""
    if not root.is_dir():
        return []
    steps = []
    for path in root.iterdir():
        step = parse_step(path.name)
        if step is None or not path.is_dir() or (path / BAD_MARKER).exists():
            continue
        if (path / COMMIT_MARKER).exists() == committed:
            steps.append(step)
    return sorted(steps)


def committed_steps(root: Path) -> list[int]:
    return step_dirs(root, committed=True)


def set_aside(path: Path) -> Path:
    """Move a step directory (one marked bad) out of the way of a new copy of its step, to a
    name no reader takes for a step: `step-N.bad`, `step-N.bad-2`, …; returns the new path."""
    target, n = path.with_name(path.name + ".bad"), 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.bad-{n}")
    path.rename(target)
    return target


def bad_steps(root: Path) -> list[int]:
    """Steps marked bad by the trainer, ascending."""
    if not root.is_dir():
        return []
    return sorted(step for path in root.iterdir()
                  if (step := parse_step(path.name)) is not None and (path / BAD_MARKER).is_file())


def best_checkpoint(root: Path) -> dict | None:
    """{"step", "val_loss"} of the best committed checkpoint, or None."""
    path = root / BEST_FILE
    if not path.exists():
        return None
    best = json.loads(path.read_text())
    return best if is_committed(step_dir(root, best["step"])) else None


# -- the UPLOADED marker ---------------------------------------------------------------------


@dataclass(frozen=True)
class UploadRecord:
    """What an UPLOADED marker says: the store that holds the step (`destination`, the uploader's
    --dest or restore's --src, and its `endpoint_url` when not the default) and which manifest it
    holds there: the manifest's path under `destination`, its ETag and size (a file:// store has
    no ETag: the manifest's sha256 stands in)."""

    destination: str
    manifest: str
    etag: str
    size: int
    endpoint_url: str | None = None

    @property
    def manifest_uri(self) -> str:
        return f"{self.destination}/{self.manifest}"


def stored_manifest(destination: str, manifest: str, endpoint_url: str | None = None) -> ObjectHead | None:
    """The manifest's identity in the store (one HEAD; a few quick retries, so a trainer asking
    is never held up long); None when the store does not hold it."""
    parsed = urlparse(destination)
    if parsed.scheme == "file":
        path = Path(parsed.path) / manifest
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        return ObjectHead(hashlib.sha256(data).hexdigest(), len(data))
    if parsed.scheme != "s3" or not parsed.netloc:
        raise StorageError(f"destination {destination!r}: expected s3://BUCKET/PREFIX or file:///PATH")
    key = "/".join(part for part in (parsed.path.strip("/"), manifest) if part)
    return _bucket(parsed.netloc, endpoint_url).head(key)


@functools.lru_cache(maxsize=8)
def _bucket(name: str, endpoint_url: str | None) -> S3Bucket:
    """One client per store for the process: making one costs far more than the HEAD."""
    return S3Bucket(name, endpoint_url, concurrency=1, connect_timeout=5.0, read_timeout=10.0,
                    retry=RetryPolicy(attempts=3, backoff_max_seconds=2.0, log=get_logger("storage")))


def mark_uploaded(step_path: Path, destination: str, manifest: str, endpoint_url: str | None = None) -> UploadRecord:
    """Write the step's UPLOADED marker for the manifest `destination` now holds (its identity
    read back with one HEAD). Raises StorageError when the store does not hold it."""
    head = stored_manifest(destination, manifest, endpoint_url)
    if head is None:
        raise StorageError(f"{destination}/{manifest}: not in the store right after it was written")
    record = UploadRecord(destination, manifest, head.etag, head.size, endpoint_url)
    atomic_write_bytes(step_path / UPLOADED_MARKER, json.dumps(dataclasses.asdict(record), sort_keys=True).encode())
    return record


def upload_record(step_path: Path) -> UploadRecord | None:
    """The step's UPLOADED marker; None when there is none, or it says nothing usable (an empty
    marker of an older uploader, or a damaged one)."""
    try:
        return UploadRecord(**json.loads((step_path / UPLOADED_MARKER).read_bytes()))
    except (OSError, ValueError, TypeError):
        return None


def is_uploaded(step_path: Path, destination: str | None = None) -> bool:
    """The one meaning of "uploaded" (the uploader's --exit-when-done and disk freeing, the
    trainer's purge_requires_upload): the step's UPLOADED marker names `destination` (any store,
    when None: the trainer is not told the sidecar's) and that store holds the very manifest
    the marker records, same ETag and size (one HEAD). An empty or damaged marker, one for
    another store, a manifest deleted or replaced since, a store that does not answer: not
    uploaded."""
    record = upload_record(step_path)
    if record is None or (destination is not None and record.destination != destination.rstrip("/")):
        return False
    try:
        head = stored_manifest(record.destination, record.manifest, record.endpoint_url)
    except Exception as exc:  # noqa: BLE001 - unreachable, denied, ...: "not uploaded" is the safe answer
        get_logger("storage").warning("upload_check_failed", manifest=record.manifest_uri,
                                      error=f"{type(exc).__name__}: {exc}", action="counted as not uploaded")
        return False
    return head is not None and (head.etag, head.size) == (record.etag, record.size)


def safe_to_delete(root: Path, step: int, destination: str | None = None) -> bool:
    """Whether retention (the trainer's purge_requires_upload) or disk freeing may delete the local
    checkpoint `step`: its UPLOADED marker names `destination` (any store, when None) and that
    store holds it (is_uploaded), or held it and has since pruned it by its own retention: the
    store holds the newest later committed step whose marker names it. A step never uploaded
    there is kept."""
    record = upload_record(step_dir(root, step))
    if record is None or (destination is not None and record.destination != destination.rstrip("/")):
        return False
    if is_uploaded(step_dir(root, step), record.destination):
        return True
    later = [s for s in committed_steps(root) if s > step
             and (r := upload_record(step_dir(root, s))) is not None and r.destination == record.destination]
    return bool(later) and is_uploaded(step_dir(root, later[-1]), record.destination)
