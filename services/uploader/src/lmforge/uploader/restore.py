"""Restore (the trainer pod's init container): bring the newest complete checkpoint from
the store into the local checkpoint directory.

Newest first, a checkpoint qualifies only if its MANIFEST.json exists and every file it
lists downloads with the listed size and sha256; otherwise the next older one is tried,
with a log line saying why. A committed local copy (a persistent volume) is trusted only
once its files match that manifest (names, sizes, sha256); otherwise the store's copy
replaces it. A checkpoint marked BAD (it failed to load: locally by the trainer, or in the
store by an uploader that found the same files there) is passed over, never restored as the
newest. Files land in a temp directory that is renamed into place, and the commit marker is
written last, so the trainer never sees half a restore. The restored step's UPLOADED marker
names the store it came from and its manifest (ETag, size): a sidecar watching that store need
not upload it again, one watching another store does. With nothing in the store, restore
succeeds and training starts fresh.
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lmforge.common.atomic_files import atomic_write_bytes
from lmforge.common.checkpoint_layout import (
    BAD_MARKER,
    COMMIT_MARKER,
    mark_uploaded,
    parse_step,
    step_dir,
    step_name,
)
from lmforge.common.errors import InputError, ShardFormatError
from lmforge.common.logging import get_logger
from lmforge.common.storage import sha256_file
from lmforge.common.store import Store
from lmforge.uploader.manifest import MANIFEST, local_mismatch, parse_manifest, remote_step_prefix

log = get_logger("uploader")


class CorruptCheckpoint(ShardFormatError):
    pass


def remote_steps(destination: Store) -> tuple[list[int], set[int]]:
    """Steps with a manifest in the store, ascending, and those of them marked BAD there."""
    found: dict[str, set[int]] = {MANIFEST: set(), BAD_MARKER: set()}
    for rel in destination.listing("checkpoints/"):
        parts = rel.split("/")
        if len(parts) == 3 and parts[2] in found and (step := parse_step(parts[1])) is not None:
            found[parts[2]].add(step)
    return sorted(found[MANIFEST]), found[MANIFEST] & found[BAD_MARKER]


def _marked_bad(destination: Store, local_dir: Path, step: int, bad_in_store: set[int]) -> str | None:
    if step in bad_in_store:
        return f"marked {BAD_MARKER} in the store ({destination.uri}/{remote_step_prefix(step)}{BAD_MARKER})"
    if (step_dir(local_dir, step) / BAD_MARKER).exists():
        return f"marked {BAD_MARKER} here ({step_dir(local_dir, step) / BAD_MARKER})"
    return None


def restore(destination: Store, local_dir: Path, step: int | None = None, parallel_files: int = 4) -> int | None:
    """Returns the restored step, or None when the store holds no checkpoint (a fresh start)."""
    local_dir.mkdir(parents=True, exist_ok=True)
    available, bad_in_store = remote_steps(destination)
    if step is not None:
        if step not in available:
            raise InputError(f"{destination.uri}: no complete checkpoint for step {step} (have {available or 'none'})")
        if bad := _marked_bad(destination, local_dir, step, bad_in_store):
            raise InputError(f"step {step} is {bad}: it failed to load; remove that marker to restore it anyway")
        available = [step]
    for candidate in reversed(available):
        target = step_dir(local_dir, candidate)
        if bad := _marked_bad(destination, local_dir, candidate, bad_in_store):
            log.warning("restore_skipped", step=candidate, reason=bad)
            continue
        try:
            manifest = _manifest(destination, candidate)
            if (target / COMMIT_MARKER).exists():
                problem = local_mismatch(target, manifest, parallel_files)
                if problem is None:
                    log.info("restore_present", step=candidate, path=str(target), verified=True)
                    return candidate
                log.warning("restore_present_mismatch", step=candidate, path=str(target), reason=problem,
                            action="replacing it with the store's copy")
            _restore_step(destination, local_dir, candidate, manifest, parallel_files)
        except (CorruptCheckpoint, ShardFormatError) as exc:
            log.warning("restore_skipped", step=candidate, reason=str(exc))
            continue
        log.info("restored", step=candidate, path=str(target))
        return candidate
    if step is not None:
        raise InputError(f"{destination.uri}: checkpoint for step {step} is corrupt in the store")
    log.info("restore_nothing", src=destination.uri, reason="no complete checkpoint in the store; starting fresh")
    return None


def _manifest(destination: Store, step: int) -> dict:
    where = f"{destination.uri}/{remote_step_prefix(step)}"
    data = destination.get_bytes(remote_step_prefix(step) + MANIFEST)
    if data is None:
        raise CorruptCheckpoint(f"{where}: manifest disappeared")
    return parse_manifest(data, where + MANIFEST)


def _restore_step(destination: Store, local_dir: Path, step: int, manifest: dict, parallel_files: int) -> None:
    where = f"{destination.uri}/{remote_step_prefix(step)}"
    sizes = {rel: stored.size for rel, stored in destination.listing(remote_step_prefix(step)).items()}
    temp = local_dir / f".restore-{step_name(step)}"
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir(parents=True)
    try:
        def fetch(entry) -> None:
            key = remote_step_prefix(step) + entry.path
            if sizes.get(key) != entry.size:
                raise CorruptCheckpoint(f"{where}{entry.path}: size in store {sizes.get(key)} != manifest "
                                        f"{entry.size}")
            path = temp / entry.path
            path.parent.mkdir(parents=True, exist_ok=True)
            destination.download(key, path, entry.size)
            if sha256_file(path) != entry.sha256:
                raise CorruptCheckpoint(f"{where}{entry.path}: sha256 does not match the manifest")

        with ThreadPoolExecutor(parallel_files) as pool:
            for future in [pool.submit(fetch, entry) for entry in manifest["files"]]:
                future.result()
        target = step_dir(local_dir, step)
        # An uncommitted leftover of this step, or a committed copy that failed verification:
        # the marker first, so a removal cut short never leaves half a checkpoint that looks whole.
        (target / COMMIT_MARKER).unlink(missing_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(temp, target)
        try:
            mark_uploaded(target, destination.uri, remote_step_prefix(step) + MANIFEST, destination.endpoint_url)
        except Exception as exc:  # noqa: BLE001 - the marker only spares the sidecar a check of the files
            log.warning("restore_unmarked", step=step, error=f"{type(exc).__name__}: {exc}",
                        action="the sidecar compares the files with the store's manifest instead")
        atomic_write_bytes(target / COMMIT_MARKER, b"")
    finally:
        shutil.rmtree(temp, ignore_errors=True)
