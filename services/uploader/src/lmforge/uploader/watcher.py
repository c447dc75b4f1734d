"""The sidecar's loop: find committed checkpoints, upload them, publish MANIFEST.json last,
prune the store, and free local disk.

A checkpoint is uploaded only when the trainer's commit marker is present (never one still
being written). Its files go up in parallel (multipart, CRC32C per part); then MANIFEST.json
(files, sizes, sha256) is written: only then is the checkpoint in the store. Locally an
UPLOADED marker records that, so a restarted sidecar does not hash it again; without the
marker, a manifest already in the store is checked against the local files, and files an
interrupted sidecar had sent whole (its journal in the step directory) are not sent again.
Each file is read once: the same pass feeds the manifest's sha256 and the parts' CRC32C.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

from lmforge.common.checkpoint_layout import (
    COMMIT_MARKER,
    UPLOADED_MARKER,
    best_checkpoint,
    committed_steps,
    parse_step,
    step_dir,
)
from lmforge.common.errors import LmforgeError
from lmforge.common.logging import get_logger
from lmforge.common.storage import atomic_write_bytes, sha256_file
from lmforge.uploader.config import UploaderConfig
from lmforge.uploader.manifest import (
    JOURNAL,
    MANIFEST,
    FileEntry,
    build_manifest,
    checkpoint_files,
    parse_manifest,
    remote_step_prefix,
)
from lmforge.uploader.metrics import UploaderMetrics
from lmforge.uploader.retry import Cancelled

log = get_logger("uploader")


class CheckpointVanished(LmforgeError):
    """The trainer's retention removed a checkpoint while it was being uploaded."""


class UploadJournal:
    """Files of a checkpoint already sent whole, with their sha256 (kept in the step
    directory), so a restarted sidecar sends only the rest."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        try:
            self._entries = {e["path"]: FileEntry(**e) for e in json.loads(path.read_text())}
        except (OSError, ValueError, TypeError, KeyError):
            self._entries = {}

    def get(self, rel: str) -> FileEntry | None:
        return self._entries.get(rel)

    def record(self, entry: FileEntry) -> None:
        with self._lock:
            self._entries[entry.path] = entry
            data = [vars(e) for e in self._entries.values()]
            atomic_write_bytes(self.path, json.dumps(data).encode())


class _Either:
    """is_set() when either event is."""

    def __init__(self, first: threading.Event, second: threading.Event):
        self.first, self.second = first, second

    def is_set(self) -> bool:
        return self.first.is_set() or self.second.is_set()


def read_meta(path: Path) -> dict:
    try:
        return json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
        return {}


def is_final(meta: dict) -> bool:
    steps = (meta.get("config") or {}).get("steps")
    return steps is not None and meta.get("step") == steps - 1


class CheckpointUploader:
    def __init__(self, local_dir: Path, destination, config: UploaderConfig, metrics: UploaderMetrics | None = None):
        self.local_dir = local_dir
        self.dest = destination
        self.config = config
        self.metrics = metrics or UploaderMetrics()
        self.stopping = threading.Event()  # SIGTERM: start nothing new
        self.cancel = threading.Event()  # grace period over: abort what is in flight
        self.final_uploaded = False
        self.last_uploaded_step = -1
        self._manifests: dict[int, dict] = {}
        self._failed_at: dict[int, float] = {}
        self._files = ThreadPoolExecutor(2, thread_name_prefix="lmforge-file")

    # -- the store's view ----------------------------------------------------------------

    def remote_manifests(self) -> dict[int, dict]:
        """Steps with a manifest in the store → the manifest. One listing per call; a
        manifest never changes once written, so each is fetched only the first time."""
        listing = self.dest.list("checkpoints/")
        manifests = {}
        for rel in listing:
            parts = rel.split("/")
            if len(parts) == 3 and parts[2] == MANIFEST and (step := parse_step(parts[1])) is not None:
                if step not in self._manifests:
                    data = self.dest.get_bytes(rel)
                    if data is None:
                        continue
                    self._manifests[step] = parse_manifest(data, f"{self.dest.uri}/{rel}")
                manifests[step] = self._manifests[step]
        self._manifests = manifests  # forget pruned ones
        return manifests

    def start(self) -> None:
        self.dest.check()
        leftovers = self.dest.abort_open_uploads("checkpoints/")
        if leftovers:
            log.info("aborted_leftover_uploads", count=leftovers)
        manifests = self.remote_manifests()
        if manifests:
            self.last_uploaded_step = max(manifests)
            self.metrics.last_uploaded_step.set(self.last_uploaded_step)
        log.info("started", dir=str(self.local_dir), dest=self.dest.uri, in_store=sorted(manifests))

    # -- one pass ------------------------------------------------------------------------

    def candidates(self, manifests: dict[int, dict]) -> list[int]:
        """Committed local checkpoints not yet in the store: the newest `keep` and the best
        (others would be pruned at once), oldest first, skipping recent failures for a while."""
        committed = committed_steps(self.local_dir)
        best = best_checkpoint(self.local_dir)
        wanted = sorted(set(committed[-self.config.keep :]) | ({best["step"]} if best else set()))
        now = time.monotonic()
        return [s for s in wanted if not self._in_store(s, manifests)
                and now - self._failed_at.get(s, -1e18) >= self.config.retry_failed_after_seconds]

    def _in_store(self, step: int, manifests: dict[int, dict]) -> bool:
        path = step_dir(self.local_dir, step)
        if step not in manifests:
            return False
        if (path / UPLOADED_MARKER).exists():
            return True
        # A manifest from an earlier sidecar: trust it only if it describes these files.
        local = {p.relative_to(path).as_posix(): p for p in checkpoint_files(path)}
        entries = manifests[step]["files"]
        if set(local) != {e.path for e in entries} or any(
                local[e.path].stat().st_size != e.size or sha256_file(local[e.path]) != e.sha256 for e in entries):
            log.warning("manifest_mismatch", step=step, action="uploading again")
            return False
        atomic_write_bytes(path / UPLOADED_MARKER, b"")
        return True

    def run_once(self, *, draining: bool = False) -> list[int]:
        """Upload what is pending, then prune; returns the steps uploaded. A store that fails
        even after retries is logged and counted, and the next pass tries again. A normal
        pass stops starting uploads at SIGTERM; the draining pass after it does not (only
        the end of the grace period stops it)."""
        uploaded: list[int] = []
        try:
            manifests = self.remote_manifests()
            pending = self.candidates(manifests)
            self.metrics.pending.set(len(pending))
            for step in pending:
                if self.cancel.is_set() or (self.stopping.is_set() and not draining):
                    break
                if self.upload_step(step):
                    uploaded.append(step)
            self.prune(self.remote_manifests() if uploaded else manifests)
        except Exception as exc:  # the sidecar outlives a bad minute of the store
            self.metrics.failures.labels(reason=type(exc).__name__).inc()
            log.error("pass_failed", error=f"{type(exc).__name__}: {exc}", retry_in_seconds=self.config.poll_seconds)
        self.free_disk()
        latest = committed_steps(self.local_dir)
        if latest and (step_dir(self.local_dir, latest[-1]) / UPLOADED_MARKER).exists() \
                and is_final(read_meta(step_dir(self.local_dir, latest[-1]))):
            self.final_uploaded = True
        return uploaded

    def upload_step(self, step: int) -> bool:
        path = step_dir(self.local_dir, step)
        started = time.monotonic()
        try:
            committed_at = (path / COMMIT_MARKER).stat().st_mtime
            entries = self._upload_files(step, path)
            self.dest.put_bytes(remote_step_prefix(step) + MANIFEST, build_manifest(step, entries, read_meta(path)))
            self._manifests.pop(step, None)  # replaced: fetch the new one next time
        except Cancelled:
            log.warning("upload_cancelled", step=step, reason="shutdown grace period over; nothing published")
            return False
        except FileNotFoundError as exc:
            self.metrics.failures.labels(reason="vanished").inc()
            log.warning("upload_skipped", step=step, reason=f"removed locally while uploading ({exc.filename})")
            return False
        except Exception as exc:  # counted, logged, retried on a later pass: never silent
            self._failed_at[step] = time.monotonic()
            self.metrics.failures.labels(reason=type(exc).__name__).inc()
            log.error("upload_failed", step=step, error=f"{type(exc).__name__}: {exc}",
                      retry_in_seconds=self.config.retry_failed_after_seconds)
            return False
        atomic_write_bytes(path / UPLOADED_MARKER, b"")
        (path / JOURNAL).unlink(missing_ok=True)
        seconds = time.monotonic() - started
        lag = time.time() - committed_at
        self._failed_at.pop(step, None)
        self.metrics.upload_seconds.observe(seconds)
        self.last_uploaded_step = max(step, self.last_uploaded_step)
        self.metrics.last_uploaded_step.set(self.last_uploaded_step)
        self.metrics.lag_seconds.set(lag)
        size = sum(e.size for e in entries)
        log.info("uploaded", step=step, files=len(entries), bytes=size, seconds=round(seconds, 3),
                 lag_seconds=round(lag, 3), dest=f"{self.dest.uri}/{remote_step_prefix(step)}")
        return True

    def _upload_files(self, step: int, path: Path) -> list[FileEntry]:
        files = checkpoint_files(path)
        if not files:
            raise CheckpointVanished(f"{path}: no files")
        remote = self.dest.list(remote_step_prefix(step))
        journal = UploadJournal(path / JOURNAL)
        stop = _Either(self.cancel, threading.Event())  # shutdown, or another file of this checkpoint failed

        def one(file: Path) -> FileEntry:
            try:
                rel = file.relative_to(path).as_posix()
                size = file.stat().st_size
                key = remote_step_prefix(step) + rel
                done = journal.get(rel)
                if done and done.size == size and remote.get(key) == size:
                    return done  # sent completely by an earlier, interrupted sidecar
                digest = self.dest.upload_file(file, key, stop, progress=self.metrics.uploaded_bytes.inc)
                entry = FileEntry(rel, size, digest)
                journal.record(entry)
                return entry
            except BaseException:
                stop.second.set()
                raise

        futures = [self._files.submit(one, file) for file in files]
        wait(futures)  # every file finished or aborted its multipart upload before this returns
        return [f.result() for f in futures]

    # -- retention -----------------------------------------------------------------------

    def prune(self, manifests: dict[int, dict]) -> None:
        """Keep the newest `keep` checkpoints plus the best; delete older ones only once a
        newer manifest exists. The manifest goes first, so a half-deleted checkpoint is
        never taken for a complete one."""
        if not manifests:
            return
        newest = max(manifests)
        best = [s for s, m in manifests.items() if m.get("best")]
        keep = set(sorted(manifests)[-self.config.keep :]) | ({max(best)} if best else set())
        listing = self.dest.list("checkpoints/")
        by_step: dict[int, list[str]] = {}
        for rel in listing:
            parts = rel.split("/")
            if len(parts) >= 3 and (step := parse_step(parts[1])) is not None:
                by_step.setdefault(step, []).append(rel)
        for step, rels in sorted(by_step.items()):
            if step in keep or step >= newest:
                continue
            manifest_key = remote_step_prefix(step) + MANIFEST
            if manifest_key in rels:
                self.dest.delete([manifest_key])
            self.dest.delete([r for r in rels if r != manifest_key])
            log.info("pruned", step=step, complete=manifest_key in rels)

    def free_disk(self) -> None:
        """Above the usage threshold, delete uploaded local checkpoints, oldest first, never
        the newest committed one."""
        threshold = self.config.free_disk_above
        if threshold is None:
            return
        for step in committed_steps(self.local_dir)[:-1]:
            usage = shutil.disk_usage(self.local_dir)
            if usage.used / usage.total <= threshold:
                return
            path = step_dir(self.local_dir, step)
            if (path / UPLOADED_MARKER).exists():
                (path / COMMIT_MARKER).unlink(missing_ok=True)  # never half a checkpoint that looks whole
                shutil.rmtree(path, ignore_errors=True)
                log.info("freed_local", step=step, used_ratio=round(usage.used / usage.total, 3))

    # -- the loop ------------------------------------------------------------------------

    def run(self, *, exit_when_done: bool = False) -> None:
        while not self.stopping.is_set():
            self.run_once()
            if exit_when_done and self.final_uploaded:
                log.info("done", reason="the final checkpoint is uploaded")
                return
            self.stopping.wait(self.config.poll_seconds)
        # SIGTERM: a native sidecar gets it once the trainer has exited, so the final
        # checkpoint may have been committed after the last pass. Upload what is committed
        # and not yet in the store, within the grace period; a local emptyDir dies with the pod.
        if not self.cancel.is_set():
            drained = self.run_once(draining=True)
            log.info("drained", steps=drained)

    def request_stop(self) -> None:
        """SIGTERM: finish the upload in flight and any committed checkpoint not yet uploaded,
        or abort them when the grace period is over; then stop."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        timer = threading.Timer(self.config.grace_seconds, self.cancel.set)
        timer.daemon = True
        timer.start()
        log.info("stopping", grace_seconds=self.config.grace_seconds)

    def close(self) -> None:
        self._files.shutdown(wait=True, cancel_futures=True)
        self.dest.close()
