"""MANIFEST.json: what a complete checkpoint in the object store holds. Written last; a step
without it is not a checkpoint (docs/design.md)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from lmforge.common.checkpoint_layout import BAD_MARKER, COMMIT_MARKER, UPLOADED_MARKER, step_name
from lmforge.common.errors import ShardFormatError
from lmforge.common.storage import sha256_file

MANIFEST = "MANIFEST.json"
JOURNAL = ".upload-journal.json"
FORMAT_VERSION = 1
# Local state, not part of the checkpoint: the commit marker is re-created by restore after
# verification; the journal records the uploader's progress; the trainer's BAD marker goes to
# the store on its own (watcher.publish_bad), never in a manifest.
LOCAL_ONLY = frozenset({COMMIT_MARKER, UPLOADED_MARKER, JOURNAL, BAD_MARKER})


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the step directory
    size: int
    sha256: str


def checkpoint_files(step_path: Path) -> list[Path]:
    return sorted(p for p in step_path.rglob("*") if p.is_file() and p.name not in LOCAL_ONLY)


CHECKPOINTS, WEIGHTS = "checkpoints", "weights"  # the kinds of step directories in a run's store
EVALS = "evals/"  # evaluation results of weights packages (eval_launcher.py)
BEST_FILE = EVALS + "best.json"  # the best evaluated (promoted) weights step: weights retention keeps it


def remote_step_prefix(step: int, kind: str = CHECKPOINTS) -> str:
    return f"{kind}/{step_name(step)}/"


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


def local_mismatch(path: Path, manifest: dict, parallel_files: int = 4) -> str | None:
    """How the checkpoint files in `path` differ from `manifest`, or None when they match."""
    local = {p.relative_to(path).as_posix(): p for p in checkpoint_files(path)}
    entries = {e.path: e for e in manifest["files"]}
    if missing := sorted(set(entries) - set(local)):
        return f"{path / missing[0]}: missing" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
    if extra := sorted(set(local) - set(entries)):
        return f"{path / extra[0]}: not in the manifest"
    for rel, entry in entries.items():
        if (size := local[rel].stat().st_size) != entry.size:
            return f"{local[rel]}: {size} bytes, the manifest says {entry.size}"
    with ThreadPoolExecutor(parallel_files) as pool:
        digests = dict(zip(entries, pool.map(lambda rel: sha256_file(local[rel]), entries), strict=True))
    for rel, entry in entries.items():
        if digests[rel] != entry.sha256:
            return f"{local[rel]}: sha256 does not match the manifest"
    return None
