"""MANIFEST.json: what a complete checkpoint in the object store holds. Written last; a step
without it is not a checkpoint (DESIGN.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from lmforge.common.checkpoint_layout import COMMIT_MARKER, UPLOADED_MARKER, step_name
from lmforge.common.errors import ShardFormatError

MANIFEST = "MANIFEST.json"
JOURNAL = ".upload-journal.json"
FORMAT_VERSION = 1
# Local state, not part of the checkpoint: the commit marker is re-created by restore after
# verification; the journal records the uploader's progress.
LOCAL_ONLY = frozenset({COMMIT_MARKER, UPLOADED_MARKER, JOURNAL})


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the step directory
    size: int
    sha256: str


def checkpoint_files(step_path: Path) -> list[Path]:
    return sorted(p for p in step_path.rglob("*") if p.is_file() and p.name not in LOCAL_ONLY)


def remote_step_prefix(step: int) -> str:
    return f"checkpoints/{step_name(step)}/"


def build_manifest(step: int, entries: list[FileEntry], meta: dict | None) -> bytes:
    meta = meta or {}
    body = {"format_version": FORMAT_VERSION, "step": step,
            "files": [{"path": e.path, "size": e.size, "sha256": e.sha256} for e in entries],
            "val_loss": meta.get("val_loss"), "best": bool(meta.get("best"))}
    return json.dumps(body, indent=1).encode()


def parse_manifest(data: bytes, where: str) -> dict:
    try:
        manifest = json.loads(data)
        files = [FileEntry(f["path"], int(f["size"]), f["sha256"]) for f in manifest["files"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ShardFormatError(f"{where}: not a valid {MANIFEST} ({exc})") from exc
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ShardFormatError(f"{where}: {MANIFEST} format_version {manifest.get('format_version')!r} is not "
                               f"{FORMAT_VERSION}")
    for entry in files:
        if entry.path.startswith("/") or ".." in Path(entry.path).parts:
            raise ShardFormatError(f"{where}: unsafe path {entry.path!r} in {MANIFEST}")
    return {**manifest, "files": files}
