"""Where a server reads a trace index from: `fetch_index(uri, cache_dir)` gives a local directory.

A local index (a path or file://) is used in place. An index in object storage (s3://) is copied into
`cache_dir`: one folder per index version, every file checked against what index.json records before it
is kept, and the folder renamed into place only once complete, so a half download never looks like an
index. (A model package's cache, lmforge.model.package.fetch_package, keeps a file per object and checks
it when the package loads; an index is too large to read twice, so each file is verified as it lands and
a restarted download keeps what was verified.)

    <cache_dir>/trace-index-<16 hex>/            a complete copy (the name: the URI and index.json's sha256)
    <cache_dir>/trace-index-<16 hex>.partial/    a download under way: each file appears under its own name
                                                 only once verified, so a restarted download keeps them

The engine's files are checked by size and sha256 (index.json's partition entries), tokenizer.json by
index.json's tokenizer_sha256, each partition's entry.json by equality with its entry. Once a version is
complete, the other versions in `cache_dir` are deleted (but one another process is downloading): a server
holds one index at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from lmforge.common.errors import InputError
from lmforge.common.storage import open_store, sha256_file
from lmforge.common.store import ObjectMissing, Store, local_path_of, scheme_of
from lmforge.trace.format import ENTRY, INDEX_JSON, TOKENIZER, read_index_json

PREFIX = "trace-index-"
PARTIAL = ".partial"


def fetch_index(uri: str, cache_dir: str | Path) -> Path:
    """A local directory holding the trace index at `uri` (see the module docstring)."""
    if scheme_of(uri) == "file":
        root = local_path_of(uri)
        if not (root / INDEX_JSON).is_file():
            raise InputError(f"{uri}: not a trace index ({INDEX_JSON} missing)")
        return root
    if scheme_of(uri) != "s3":
        raise InputError(f"{uri}: a trace index is read from a directory or s3://, not {scheme_of(uri)}://")
    store = open_store(uri)
    try:
        return _fetch(store, uri.rstrip("/"), Path(cache_dir))
    finally:
        store.close()


def version_dir(uri: str, manifest: bytes, cache_dir: Path) -> Path:
    """The folder one version of the index at `uri` is kept in."""
    digest = hashlib.sha256(uri.encode() + b"\0" + hashlib.sha256(manifest).digest()).hexdigest()[:16]
    return cache_dir / f"{PREFIX}{digest}"


def _fetch(store: Store, uri: str, cache_dir: Path) -> Path:
    manifest = _read(store, INDEX_JSON)
    info = read_index_json(manifest.decode("utf-8", errors="replace"), source=f"{uri}/{INDEX_JSON}")
    target = version_dir(uri, manifest, cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _locked(target.with_name(target.name + ".lock")):
        if not target.is_dir():
            partial = target.with_name(target.name + PARTIAL)
            partial.mkdir(exist_ok=True)
            for rel, size, sha256 in expected_files(info):
                _download_verified(store, uri, rel, size, sha256, partial)
            for entry in info["partitions"]:
                _check_entry(store, uri, entry, partial)
            (partial / INDEX_JSON).write_bytes(manifest)  # last: a copy with index.json has every file
            os.replace(partial, target)
        _remove_other_versions(cache_dir, keep=target)
    return target


def expected_files(info: dict) -> list[tuple[str, int | None, str]]:
    """(relative path, bytes or None, sha256) of every file of the index but index.json and entry.json."""
    files: list[tuple[str, int | None, str]] = [(TOKENIZER, None, info["tokenizer_sha256"])]
    for entry in info["partitions"]:
        for name, meta in sorted(entry["files"].items()):
            files.append((f"{entry['name']}/{name}", meta["bytes"], meta["sha256"]))
    return files


def _download_verified(store: Store, uri: str, rel: str, size: int | None, sha256: str, into: Path) -> None:
    path = into / rel
    if path.is_file():
        return  # verified by an earlier, interrupted download: only verified files get their name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    try:
        store.download(rel, tmp, size=size)
    except Exception as exc:
        tmp.unlink(missing_ok=True)
        failure = store.failure(exc, "download", rel)
        if failure is None:
            raise
        raise failure from exc
    got = tmp.stat().st_size
    if size is not None and got != size:
        tmp.unlink()
        raise InputError(f"{uri}/{rel}: {got} bytes, index.json records {size}; refusing the index")
    if sha256_file(tmp) != sha256:
        tmp.unlink()
        raise InputError(f"{uri}/{rel}: sha256 does not match index.json (corrupt or replaced); refusing the index")
    os.replace(tmp, path)


def _check_entry(store: Store, uri: str, entry: dict, into: Path) -> None:
    """A partition's entry.json is the entry index.json holds for it."""
    rel = f"{entry['name']}/{ENTRY}"
    data = _read(store, rel)
    try:
        stored = json.loads(data)
    except json.JSONDecodeError as exc:
        raise InputError(f"{uri}/{rel}: not JSON ({exc})") from None
    if stored != entry:
        raise InputError(f"{uri}/{rel}: differs from the partition's entry in index.json (a partition rebuilt "
                         "after index.json was written?)")
    (into / rel).write_bytes(data)


def _read(store: Store, rel: str) -> bytes:
    try:
        return store.read_bytes(rel)
    except ObjectMissing:
        what = "not a trace index" if rel == INDEX_JSON else "an incomplete index"
        raise InputError(f"{store.join(rel)}: missing ({what})") from None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One process at a time downloads a version (two servers sharing a cache folder)."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_other_versions(cache_dir: Path, keep: Path) -> None:
    """Every other version, complete or partial, unless a process holds its lock (downloading it now: another
    server sharing the cache folder). The empty .lock files stay: removing one while a process waits on it
    would let a third process lock a new file and download beside it."""
    names = {p.name.removesuffix(".lock").removesuffix(PARTIAL) for p in cache_dir.iterdir()
             if p.name.startswith(PREFIX)}
    for name in sorted(names - {keep.name}):
        with open(cache_dir / f"{name}.lock", "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            for path in (cache_dir / name, cache_dir / f"{name}{PARTIAL}"):
                shutil.rmtree(path, ignore_errors=True)
