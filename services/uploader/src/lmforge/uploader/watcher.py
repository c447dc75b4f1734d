"""The sidecar's loop: find committed checkpoints, upload them, publish MANIFEST.json last,
prune the store, and free local disk.

A checkpoint is uploaded only when the trainer's commit marker is present (never one still
being written). Its files go up in parallel (multipart, CRC32C per part); then MANIFEST.json
(files, sizes, sha256) is written: only then is the checkpoint in the store. Locally an
UPLOADED marker records where and which manifest (the destination, the manifest's ETag and
size), so a restarted sidecar does not hash it again once one HEAD confirms the store holds
it. "Uploaded" is always this destination holding that manifest (checkpoint_layout.is_uploaded),
never the bare file: a marker of another destination (restore's, an earlier watch's) or an
empty one of an older version is not. Without a marker that holds, a manifest already in the
store is checked against the local files, and files an interrupted sidecar had sent whole (its
journal in the step directory) are not sent again.
Each file is read once: the same pass feeds the manifest's sha256 and the parts' CRC32C.

Several uploaders may share one destination (a pod being replaced while its successor
starts): each claims the step it writes in a lease (lease.py), and leaves alone what
another's live lease claims — its open uploads, and its checkpoint not yet published.
A checkpoint that failed to upload is retried, each time after twice the wait.

The same protocol moves weights packages (kind "weights": RUN_DIR/weights/step-N, a model
package the trainer commits with the same marker) to `weights/step-N/` in the store, with
their own retention: the newest `weights_keep`, plus the promoted step (`evals/best.json`) and
whatever the evaluation launcher still needs (`pinned`). Restore reads checkpoints only.

A checkpoint the trainer marked BAD (it failed to load) is never uploaded, nor counted as
the newest or best; when the store holds the same files, the marker is published beside
them so that restore passes over it too.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

from lmforge.common.atomic_files import atomic_write_bytes
from lmforge.common.checkpoint_layout import (
    BAD_MARKER,
    COMMIT_MARKER,
    UploadRecord,
    bad_steps,
    best_checkpoint,
    committed_steps,
    is_uploaded,
    mark_uploaded,
    parse_step,
    safe_to_delete,
    step_dir,
    upload_record,
)
from lmforge.common.errors import LmforgeError
from lmforge.common.logging import get_logger
from lmforge.common.retry import Cancelled
from lmforge.common.store import Store
from lmforge.uploader.config import UploaderConfig
from lmforge.uploader.lease import Claims, UploadLease
from lmforge.uploader.manifest import (
    BEST_FILE,
    CHECKPOINTS,
    JOURNAL,
    MANIFEST,
    FileEntry,
    build_manifest,
    checkpoint_files,
    local_mismatch,
    parse_manifest,
    remote_step_prefix,
)
from lmforge.uploader.metrics import UploaderMetrics

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
    """The run's last step: a checkpoint's meta.json names the run's `steps`; a weights
    package's says `final`."""
    if meta.get("final") is True:
        return True
    steps = (meta.get("config") or {}).get("steps")
    return steps is not None and meta.get("step") == steps - 1


class CheckpointUploader:
    def __init__(self, local_dir: Path, destination: Store, config: UploaderConfig,
                 metrics: UploaderMetrics | None = None, *, kind: str = CHECKPOINTS,
                 pinned: Callable[[], set[int]] | None = None):
        """`kind`: "checkpoints" (retention `keep` plus the best) or "weights" (`weights_keep` plus
        the promoted step and `pinned()`: steps the store must keep for now)."""
        self.local_dir = local_dir
        self.kind = kind
        self.prefix = f"{kind}/"
        self.keep = config.keep if kind == CHECKPOINTS else config.weights_keep
        self.pinned = pinned
        self.dest = destination
        self.config = config
        self.metrics = metrics or UploaderMetrics()
        self.stopping = threading.Event()  # SIGTERM: start nothing new
        self.cancel = threading.Event()  # grace period over: abort what is in flight
        self.last_uploaded_step = -1
        self._confirmed: dict[int, UploadRecord] = {}  # markers the store has confirmed while this process runs
        self._manifests: dict[int, dict] = {}
        self._remote_bad: set[int] = set()  # steps marked BAD in the store
        self._bad_checked: set[int] = set()  # local BAD steps already compared with the store
        self._retry_at: dict[int, float] = {}  # failed steps: when they may be tried again
        self._failures: dict[int, int] = {}
        self._swept_at = -1e18
        self.lease = UploadLease(destination, config.identity, config.stale_upload_seconds,
                                 f"{self.prefix}.uploaders/")
        self._files = ThreadPoolExecutor(2, thread_name_prefix="lmforge-file")

    # -- the store's view ----------------------------------------------------------------

    def remote_manifests(self) -> dict[int, dict]:
        """Steps with a manifest in the store → the manifest. One listing per call; a
        manifest never changes once written, so each is fetched only the first time."""
        listing = self.dest.listing(self.prefix)
        manifests = {}
        self._remote_bad = {step for rel in listing if len(parts := rel.split("/")) == 3 and parts[2] == BAD_MARKER
                            and (step := parse_step(parts[1])) is not None}
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
        self.sweep()
        manifests = self.remote_manifests()
        if manifests:
            self.last_uploaded_step = max(manifests)
        self.metrics.last_uploaded_step.set(self.last_uploaded_step)  # known now: -1 when the store has none
        log.info("started", kind=self.kind, dir=str(self.local_dir), dest=self.dest.uri, in_store=sorted(manifests),
                 identity=self.lease.identity)

    def sweep(self) -> None:
        """Abort the open uploads that are provably leftovers (never another uploader's live one)."""
        self._swept_at = time.monotonic()
        aborted = self.lease.abort_stale_uploads(self.prefix)
        if aborted:
            log.info("aborted_leftover_uploads", count=aborted)

    # -- one pass ------------------------------------------------------------------------

    def candidates(self, manifests: dict[int, dict]) -> list[int]:
        """Committed local checkpoints not yet in the store: the newest `keep` and the best
        (others would be pruned at once), oldest first, skipping failed ones until their retry time."""
        committed = committed_steps(self.local_dir)
        best = best_checkpoint(self.local_dir)
        wanted = sorted(set(committed[-self.keep :]) | ({best["step"]} if best else set()))
        now = time.monotonic()
        return [s for s in wanted if not self._in_store(s, manifests) and now >= self._retry_at.get(s, -1e18)]

    def _failed(self, step: int) -> float:
        """Record a failed upload of `step`; returns the wait before its next try."""
        failures = self._failures[step] = self._failures.get(step, 0) + 1
        wait_seconds = min(self.config.retry_failed_after_seconds * 2 ** (failures - 1),
                           self.config.retry_failed_max_seconds)
        self._retry_at[step] = time.monotonic() + wait_seconds
        return wait_seconds

    def _in_store(self, step: int, manifests: dict[int, dict]) -> bool:
        """Whether the store holds this local checkpoint. A marker is checked against the store
        once (one HEAD), then trusted while the listing shows the manifest."""
        path = step_dir(self.local_dir, step)
        if step not in manifests:
            self._confirmed.pop(step, None)
            return False
        record = upload_record(path)
        if record is not None and self._confirmed.get(step) == record:
            return True  # the same marker (a new copy of the step has none)
        if record is not None and is_uploaded(path, self.dest.uri):
            self._confirmed[step] = record
            return True
        # A manifest of an earlier sidecar, or one replaced since the marker: trust it only if it
        # describes these files.
        if (problem := local_mismatch(path, manifests[step])) is not None:
            log.warning("manifest_mismatch", step=step, reason=problem, action="uploading again")
            return False
        self._mark_uploaded(step)
        return True

    def _mark_uploaded(self, step: int) -> None:
        self._confirmed[step] = mark_uploaded(step_dir(self.local_dir, step), self.dest.uri,
                                              self._step_prefix(step) + MANIFEST, self.dest.endpoint_url)

    def _marked_here(self, step: int) -> bool:
        """Its UPLOADED marker names this destination (not checked in the store)."""
        record = upload_record(step_dir(self.local_dir, step))
        return record is not None and record.destination == self.dest.uri

    def final_uploaded(self) -> bool:
        """The newest committed checkpoint is the run's last and this destination holds it
        (checked in the store: a store that does not answer has not got it)."""
        latest = committed_steps(self.local_dir)
        if not latest:
            return False
        path = step_dir(self.local_dir, latest[-1])
        return is_final(read_meta(path)) and is_uploaded(path, self.dest.uri)

    def run_once(self, *, draining: bool = False) -> list[int]:
        """Upload what is pending, then prune; returns the steps uploaded. A store that fails
        even after retries is logged and counted, and the next pass tries again. A normal
        pass stops starting uploads at SIGTERM; the draining pass after it does not (only
        the end of the grace period stops it)."""
        uploaded: list[int] = []
        try:
            if time.monotonic() - self._swept_at >= self.config.stale_upload_seconds:
                self.sweep()  # leftovers of uploaders that died since the last sweep
            manifests = self.remote_manifests()
            pending = self.candidates(manifests)
            self.metrics.pending.set(len(pending))
            for step in pending:
                if self.cancel.is_set() or (self.stopping.is_set() and not draining):
                    break
                if self.upload_step(step):
                    uploaded.append(step)
            if uploaded:
                manifests = self.remote_manifests()
            self.publish_bad(manifests)
            self.prune(manifests)
        except Exception as exc:  # the sidecar outlives a bad minute of the store
            self.metrics.failures.labels(reason=type(exc).__name__).inc()
            log.error("pass_failed", error=f"{type(exc).__name__}: {exc}", retry_in_seconds=self.config.poll_seconds)
        self.free_disk()
        return uploaded

    def upload_step(self, step: int) -> bool:
        path = step_dir(self.local_dir, step)
        started = time.monotonic()
        try:
            committed_at = (path / COMMIT_MARKER).stat().st_mtime
            with self.lease.claim(self._step_prefix(step)):
                entries = self._upload_files(step, path)
                self.dest.put_bytes(self._step_prefix(step) + MANIFEST,
                                    build_manifest(step, entries, read_meta(path)))
            self._manifests.pop(step, None)  # replaced: fetch the new one next time
            self._mark_uploaded(step)
        except Cancelled:
            log.warning("upload_cancelled", step=step, reason="shutdown grace period over; nothing published")
            return False
        except FileNotFoundError as exc:
            self.metrics.failures.labels(reason="vanished").inc()
            log.warning("upload_skipped", step=step, reason=f"removed locally while uploading ({exc.filename})")
            return False
        except Exception as exc:  # counted, logged, retried on a later pass: never silent
            retry_in = self._failed(step)
            self.metrics.failures.labels(reason=type(exc).__name__).inc()
            log.error("upload_failed", step=step, error=f"{type(exc).__name__}: {exc}",
                      failures=self._failures[step], retry_in_seconds=round(retry_in, 3))
            return False
        (path / JOURNAL).unlink(missing_ok=True)
        seconds = time.monotonic() - started
        lag = time.time() - committed_at
        self._retry_at.pop(step, None)
        self._failures.pop(step, None)
        self.metrics.upload_seconds.observe(seconds)
        self.last_uploaded_step = max(step, self.last_uploaded_step)
        self.metrics.last_uploaded_step.set(self.last_uploaded_step)
        self.metrics.lag_seconds.set(lag)
        size = sum(e.size for e in entries)
        log.info("uploaded", kind=self.kind, step=step, files=len(entries), bytes=size, seconds=round(seconds, 3),
                 lag_seconds=round(lag, 3), dest=f"{self.dest.uri}/{self._step_prefix(step)}")
        return True

    def _upload_files(self, step: int, path: Path) -> list[FileEntry]:
        files = checkpoint_files(path)
        if not files:
            raise CheckpointVanished(f"{path}: no files")
        remote = self.dest.listing(self._step_prefix(step))
        # A file sent by an earlier attempt is reused only while young: a prune removes a
        # checkpoint without a manifest only once all its files are older than the stale age.
        fresh = self.config.stale_upload_seconds / 2
        journal = UploadJournal(path / JOURNAL)
        stop = _Either(self.cancel, threading.Event())  # shutdown, or another file of this checkpoint failed

        def one(file: Path) -> FileEntry:
            try:
                rel = file.relative_to(path).as_posix()
                size = file.stat().st_size
                key = self._step_prefix(step) + rel
                done = journal.get(rel)
                sent = remote.get(key)
                if done and done.size == size and sent and sent.size == size and sent.age_seconds < fresh:
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

    def publish_bad(self, manifests: dict[int, dict]) -> None:
        """Put the trainer's BAD marker of a local checkpoint beside the store's copy when that
        copy holds the same files (so it fails to load the same way). A local copy that differs
        from the store's was damaged locally: the store's copy stands."""
        for step in bad_steps(self.local_dir):
            if step not in manifests or step in self._remote_bad or step in self._bad_checked:
                continue
            path = step_dir(self.local_dir, step)
            problem = local_mismatch(path, manifests[step])
            if problem is not None:
                self._bad_checked.add(step)
                log.warning("bad_copy_differs_from_store", step=step, reason=problem,
                            action="not marked bad in the store: its copy is not this one")
                continue
            self.dest.put_bytes(self._step_prefix(step) + BAD_MARKER, (path / BAD_MARKER).read_bytes())
            self._remote_bad.add(step)
            log.warning("published_bad", step=step, dest=f"{self.dest.uri}/{self._step_prefix(step)}{BAD_MARKER}",
                        action="restore passes over it; retention keeps it for an operator")

    # -- retention -----------------------------------------------------------------------

    def prune(self, manifests: dict[int, dict]) -> None:
        """Keep the newest `keep` checkpoints plus the best; delete older ones only once a
        newer manifest exists. The manifest goes first, so a half-deleted checkpoint is
        never taken for a complete one. A checkpoint marked BAD in the store neither counts
        nor is deleted (an operator may want it). A checkpoint without a manifest is never deleted
        while it may still be completed: while a live lease claims it, while this uploader
        has it pending, or while any of its files is younger than the stale age."""
        manifests = {s: m for s, m in manifests.items() if s not in self._remote_bad}
        if not manifests:
            return
        newest = max(manifests)
        best = [s for s, m in manifests.items() if m.get("best")]
        keep = set(sorted(manifests)[-self.keep :]) | ({max(best)} if best else set()) | self._pinned()
        if not self._doomed(keep, newest, self.dest.listing(self.prefix), None):
            return  # the usual pass: nothing to delete, and no need to read the leases
        claims = self.lease.claims()  # before the listing: a step claimed after it has young files
        for step, rels in self._doomed(keep, newest, self.dest.listing(self.prefix), claims).items():
            manifest_key = self._step_prefix(step) + MANIFEST
            if manifest_key in rels:
                self.dest.delete([manifest_key])
            self.dest.delete([r for r in rels if r != manifest_key])
            log.info("pruned", step=step, complete=manifest_key in rels)

    def _step_prefix(self, step: int) -> str:
        return remote_step_prefix(step, self.kind)

    def _pinned(self) -> set[int]:
        """Weights steps retention keeps whatever their age: the promoted one, and `pinned()`."""
        if self.kind == CHECKPOINTS:
            return set()
        pinned = set(self.pinned()) if self.pinned is not None else set()
        data = self.dest.get_bytes(BEST_FILE)
        try:
            step = json.loads(data)["step"] if data is not None else None
        except (ValueError, KeyError, TypeError):
            step = None
        return pinned | ({step} if isinstance(step, int) else set())

    def _doomed(self, keep: set[int], newest: int, listing: dict, claims: Claims | None) -> dict[int, list[str]]:
        """The steps retention deletes now → their objects."""
        by_step: dict[int, list[str]] = {}
        for rel in listing:
            parts = rel.split("/")
            if len(parts) >= 3 and (step := parse_step(parts[1])) is not None:
                by_step.setdefault(step, []).append(rel)
        pending = {s for s in committed_steps(self.local_dir) if not self._marked_here(s)}
        doomed = {}
        for step, rels in sorted(by_step.items()):
            if step in keep or step >= newest or step in self._remote_bad or (
                    claims and claims.is_live(self._step_prefix(step))):
                continue
            if self._step_prefix(step) + MANIFEST not in rels and (step in pending or any(
                    listing[r].age_seconds <= self.config.stale_upload_seconds for r in rels)):
                continue  # not published yet and may still be: never deleted from under its uploader
            doomed[step] = rels
        return doomed

    def free_disk(self) -> None:
        """Above the usage threshold, delete local checkpoints this destination holds (or held
        and has pruned since: checkpoint_layout.safe_to_delete), oldest first, never the newest
        committed one."""
        threshold = self.config.free_disk_above
        if threshold is None:
            return
        for step in committed_steps(self.local_dir)[:-1]:
            usage = shutil.disk_usage(self.local_dir)
            if usage.used / usage.total <= threshold:
                return
            path = step_dir(self.local_dir, step)
            if safe_to_delete(self.local_dir, step, self.dest.uri):
                (path / COMMIT_MARKER).unlink(missing_ok=True)  # never half a checkpoint that looks whole
                shutil.rmtree(path, ignore_errors=True)
                log.info("freed_local", step=step, used_ratio=round(usage.used / usage.total, 3))

    # -- the loop ------------------------------------------------------------------------

    def run(self, *, exit_when_done: bool = False) -> None:
        while not self.stopping.is_set():
            self.run_once()
            if exit_when_done and self.final_uploaded():
                log.info("done", reason="the final checkpoint is uploaded", dest=self.dest.uri)
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
        self.lease.close()
        self.dest.close()
