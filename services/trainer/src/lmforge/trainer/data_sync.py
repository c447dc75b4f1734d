"""Data sources on S3: a data-prep output under s3://BUCKET/PREFIX is copied once per node into
CACHE_ROOT/BUCKET/PREFIX/ before training, and `ShardSource` memory-maps the local copy.

- manifest.json is written last, so a cache directory that a killed sync left behind is never
  read as a complete data-prep output;
- files already in the cache that match the bucket (size, and sha256 unless told not to) are kept,
  so a restarted pod downloads only what is missing;
- every download goes to a temp file beside its target, is checked (size, sha256 from the manifest)
  and only then renamed into place.

Downloads are lmforge.common.s3's parallel ranged GETs, each request retried by the one retry
policy (lmforge.common.retry).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from lmforge.common.errors import ConfigError, LmforgeError, ShardFormatError, StorageError
from lmforge.common.logging import get_logger
from lmforge.common.s3 import S3Bucket, error_code
from lmforge.common.storage import S3Location, atomic_path, atomic_write_bytes, local_path_of, scheme_of, sha256_file

MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"
FILE_WORKERS = 8  # files in flight; each worker also hashes its file
PART_CONCURRENCY = 10  # ranged GETs in flight over all files
PROGRESS_EVERY_S = 10.0


@dataclass(frozen=True)
class _File:
    rel: str  # '/'-separated path under the source
    size: int  # the object's size in the bucket
    sha256: str | None  # from the manifest; None for .idx files, which it does not list


def local_source_path(uri: str, cache_root: Path) -> Path:
    """Where a data source is read from: a local path as given, an s3:// URI under `cache_root`."""
    scheme = scheme_of(uri)
    if scheme == "file":
        return local_path_of(uri)
    if scheme != "s3":
        raise ConfigError(f"data.sources: {uri!r} is neither a local path nor an s3:// URI")
    loc = S3Location.parse(uri)
    parts = _safe_parts(loc.key, uri)
    return Path(cache_root, loc.bucket, *parts)


def sync_source(uri: str, cache_root: Path, *, verify_sha256: bool = True) -> Path:
    """Make the data source at `uri` available locally and return its directory. Local paths are
    returned unchanged; s3:// sources are synced into `cache_root` (see the module docstring).
    Downloaded files are always checked against the manifest; `verify_sha256` decides whether
    files already in the cache are hashed too, or kept on a size match alone."""
    dest = local_source_path(uri, cache_root)
    if scheme_of(uri) != "s3":
        return dest
    log = get_logger("trainer").bind(source=uri)
    started = time.perf_counter()
    loc = S3Location.parse(uri)
    prefix = "/".join(_safe_parts(loc.key, uri))
    bucket = S3Bucket(loc.bucket, concurrency=PART_CONCURRENCY)
    try:
        raw_manifest = _get_manifest(bucket, _key(prefix, MANIFEST), uri)
        files = _plan(uri, raw_manifest, _list_sizes(bucket, prefix))
        local_manifest = dest / MANIFEST
        if local_manifest.exists() and local_manifest.read_bytes() != raw_manifest:
            local_manifest.unlink()  # the source changed: this cache is incomplete until the sync below ends
        log.info("data_sync_start", path=str(dest), files=len(files), bytes=sum(f.size for f in files))
        downloaded, reused, done_bytes = _download_all(bucket, prefix, files, dest, verify_sha256, log)
    finally:
        bucket.close()

    if not local_manifest.exists():
        atomic_write_bytes(local_manifest, raw_manifest)
    log.info("data_sync_done", path=str(dest), files=len(files), downloaded=downloaded, reused=reused,
             bytes=done_bytes, seconds=round(time.perf_counter() - started, 3))
    return dest


def _download_all(bucket: S3Bucket, prefix: str, files: list[_File], dest: Path, verify_sha256: bool,
                  log) -> tuple[int, int, int]:
    """Fetch every file the cache lacks; returns (downloaded, reused, bytes downloaded)."""
    downloaded = reused = done_bytes = 0
    last_progress = time.perf_counter()
    failed = threading.Event()  # set on the first error: the other downloads stop at their next part
    # On an error the pool waits for its workers, which stop early and delete their temp files.
    with ThreadPoolExecutor(FILE_WORKERS) as pool:
        jobs = {pool.submit(_fetch, bucket, _key(prefix, f.rel), dest / f.rel, f, verify_sha256, failed): f
                for f in files}
        try:
            for job in as_completed(jobs):
                if job.result():
                    downloaded, done_bytes = downloaded + 1, done_bytes + jobs[job].size
                else:
                    reused += 1
                if time.perf_counter() - last_progress >= PROGRESS_EVERY_S:
                    last_progress = time.perf_counter()
                    log.info("data_sync_progress", files_done=downloaded + reused, files=len(files), bytes=done_bytes)
        except BaseException:
            failed.set()
            for job in jobs:
                job.cancel()
            raise
    return downloaded, reused, done_bytes


def sync_sources(uris: list[str], cache_root: Path, *, local_rank: int, barrier: Callable[[], None],
                 verify_sha256: bool = True) -> list[Path]:
    """Local rank 0 of each node syncs every source; then all ranks meet at `barrier` and get the
    local directories, in the order of `uris`."""
    if local_rank == 0:
        for uri in dict.fromkeys(uris):
            sync_source(uri, cache_root, verify_sha256=verify_sha256)
    barrier()
    return [local_source_path(uri, cache_root) for uri in uris]


def _safe_parts(path: str, uri: str) -> list[str]:
    parts = [p for p in path.split("/") if p]
    if any(p in {".", ".."} for p in parts):
        raise ConfigError(f"data source {uri}: '.' and '..' are not allowed in paths")
    return parts


def _key(prefix: str, rel: str) -> str:
    return f"{prefix}/{rel}" if prefix else rel


def _get_manifest(bucket: S3Bucket, key: str, uri: str) -> bytes:
    not_there = f"data source {uri}: no {bucket.url(key)} (not a data-prep output)"
    try:
        data = bucket.get_bytes(key)
    except Exception as exc:
        if error_code(exc) == "NoSuchBucket":
            raise ConfigError(not_there) from exc
        raise StorageError(f"cannot read {bucket.url(key)}: {exc}") from exc
    if data is None:
        raise ConfigError(not_there)
    return data


def _list_sizes(bucket: S3Bucket, prefix: str) -> dict[str, int]:
    """Size of every object under the prefix, by path relative to it."""
    base = f"{prefix}/" if prefix else ""
    try:
        return {key[len(base) :]: obj.size for key, obj in bucket.listing(base).items()}
    except Exception as exc:
        raise StorageError(f"cannot list {bucket.url(base)}: {exc}") from exc


def _plan(uri: str, raw_manifest: bytes, sizes: dict[str, int]) -> list[_File]:
    """The files to sync: tokenizer.json (if present) and every shard the manifest lists, with its .idx."""
    try:
        manifest = json.loads(raw_manifest)
        shards, tokenizer_sha256 = manifest["shards"], manifest["tokenizer"]["sha256"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ShardFormatError(f"{uri}/{MANIFEST}: not a data-prep manifest ({exc!r})") from exc
    files = [_File(TOKENIZER, sizes[TOKENIZER], tokenizer_sha256)] if TOKENIZER in sizes else []
    for entry in shards:
        rel = "/".join(_safe_parts(entry["path"], uri))
        if rel not in sizes:
            raise ShardFormatError(f"{uri}/{rel}: listed in manifest.json but not in the bucket")
        files.append(_File(rel, sizes[rel], entry["sha256"]))
        index = str(PurePosixPath(rel).with_suffix(".idx"))
        if index in sizes:
            files.append(_File(index, sizes[index], None))
    return files


def _problem(path: Path, f: _File, check_sha256: bool) -> str | None:
    """Why `path` is not a good copy of `f`, or None."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "missing"
    if size != f.size:
        return f"{size} bytes, the bucket has {f.size}"
    if check_sha256 and f.sha256 and sha256_file(path) != f.sha256:
        return "sha256 does not match manifest.json (corrupt or replaced)"
    return None


def _fetch(bucket: S3Bucket, key: str, target: Path, f: _File, verify_cached: bool, cancel) -> bool:
    """Download one file unless the cache already has it; returns whether it downloaded."""
    if _problem(target, f, verify_cached) is None:
        return False
    with atomic_path(target) as tmp:
        try:
            bucket.download(key, tmp, f.size, cancel=cancel)
        except Exception as exc:
            if isinstance(exc, LmforgeError):
                raise
            raise StorageError(f"cannot download {bucket.url(key)}: {exc}") from exc
        if problem := _problem(tmp, f, check_sha256=True):
            raise ShardFormatError(f"{bucket.url(key)}: {problem}")
    return True
