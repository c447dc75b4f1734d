"""A node-local cache of verified blocks of object-store files, shared by every rank (process)
of the node, bounded in bytes, least recently used blocks evicted first.

Under the cache directory:
    blocks/AB/NAME   one block; NAME is the block's sha256, so the name is its own check and a
                     block shared by two files is stored once
    tmp/             fills in progress
    index.sqlite     one row per block (bytes, last use). SQLite's lock serializes the node's
                     fills and evictions: a block enters blocks/ and the index in one transaction,
                     so no two processes count it twice or evict past each other
    locks/NNN        one flock per stripe of names: one thread of the node fetches a missing
                     block while the others wait for it, then read it from the cache

- `fetch` (the caller's) returns the block verified against its sha256; only then is it
  renamed into blocks/, so a block found there is trusted without hashing it again.
- Readers open the file and pread: an eviction that unlinks it meanwhile leaves the open file
  readable (POSIX); a reader that finds it gone fetches it again.
- A process records its reads in the index at most once a second (and before it evicts), so
  the LRU order across processes is exact to about that second.
- No fsync: the cache lives in a pod's emptyDir, which a node crash discards anyway. A block
  renamed but not indexed (the process died between the two) is indexed when the next process
  opens the cache; temp files older than an hour are removed then.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from lmforge.common.errors import StorageError

STRIPES = 256  # fill locks: blocks whose names share a stripe are fetched one at a time
TOUCH_EVERY_S = 1.0
STALE_TMP_S = 3600.0


class BlockCache:
    """See the module docstring. One instance per process and directory; thread-safe."""

    def __init__(self, root: str | Path, max_bytes: int):
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.blocks_dir, self.tmp_dir, self.locks_dir = self.root / "blocks", self.root / "tmp", self.root / "locks"
        self.blocks_dir.mkdir(parents=True, exist_ok=True)
        self.tmp_dir.mkdir(exist_ok=True)
        self.locks_dir.mkdir(exist_ok=True)
        # The node's ranks open the index at the same moment; SQLite answers a concurrent switch to
        # WAL with "database is locked" at once (no busy wait), so one process at a time sets it up.
        with open(self.root / "index.lock", "a") as setup_lock:
            fcntl.flock(setup_lock, fcntl.LOCK_EX)
            self._db = sqlite3.connect(self.root / "index.sqlite", timeout=300, isolation_level=None,
                                       check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=OFF")
            self._db.execute("CREATE TABLE IF NOT EXISTS blocks (name TEXT PRIMARY KEY, bytes INTEGER NOT NULL, "
                             "used INTEGER NOT NULL)")
            self._db.execute("CREATE INDEX IF NOT EXISTS blocks_by_use ON blocks (used)")
        self._db_lock = threading.Lock()
        self._touched: dict[str, int] = {}
        self._last_touch_flush = time.monotonic()
        self._reconcile()

    def read(self, name: str, offset: int, length: int, fetch: Callable[[], bytes]) -> bytes:
        """`length` bytes at `offset` of block `name`, from the cache, else fetched and stored."""
        data = self._pread(name, offset, length)
        if data is None:
            with self._filling(name):
                data = self._pread(name, offset, length)  # another process may have filled it meanwhile
                if data is None:
                    block = fetch()
                    self._store(name, block)
                    return block[offset : offset + length]
        self._touch(name)
        return data

    def cached_bytes(self) -> int:
        """Bytes of the blocks in the index (what the bound applies to)."""
        with self._db_lock:
            return int(self._db.execute("SELECT COALESCE(SUM(bytes), 0) FROM blocks").fetchone()[0])

    def close(self) -> None:
        with self._transaction() as db:
            self._flush_touches(db)
        self._db.close()

    # -- internals -------------------------------------------------------------------------

    def _path(self, name: str) -> Path:
        return self.blocks_dir / name[:2] / name

    def _pread(self, name: str, offset: int, length: int) -> bytes | None:
        try:
            fd = os.open(self._path(name), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _filling(self, name: str) -> Iterator[None]:
        """One thread of the node at a time fetches blocks of `name`'s stripe. flock, not fcntl
        record locks: those belong to the process, so two threads of one process would share a
        lock (and the kernel reports a false deadlock between two such processes)."""
        stripe = zlib.crc32(name.encode()) % STRIPES
        fd = os.open(self.locks_dir / f"{stripe:03d}", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._db_lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _store(self, name: str, block: bytes) -> None:
        tmp = self.tmp_dir / f"{name}.{os.getpid()}.{threading.get_ident()}"
        target = self._path(name)
        try:
            tmp.write_bytes(block)
            with self._transaction() as db:
                self._flush_touches(db)
                self._evict(db, room_for=len(block))
                target.parent.mkdir(exist_ok=True)
                os.replace(tmp, target)
                db.execute("INSERT OR REPLACE INTO blocks VALUES (?, ?, ?)", (name, len(block), time.time_ns()))
        except OSError as exc:  # a full or read-only volume
            raise StorageError(f"block cache {self.root}: cannot store a block: {exc}") from exc
        finally:
            tmp.unlink(missing_ok=True)

    def _evict(self, db: sqlite3.Connection, room_for: int = 0) -> None:
        """Delete least recently used blocks until `room_for` more bytes fit under the bound."""
        total = db.execute("SELECT COALESCE(SUM(bytes), 0) FROM blocks").fetchone()[0]
        if total + room_for <= self.max_bytes:
            return
        for name, size in db.execute("SELECT name, bytes FROM blocks ORDER BY used").fetchall():
            self._path(name).unlink(missing_ok=True)
            db.execute("DELETE FROM blocks WHERE name = ?", (name,))
            total -= size
            if total + room_for <= self.max_bytes:
                return

    def _touch(self, name: str) -> None:
        with self._db_lock:
            self._touched[name] = time.time_ns()
            if time.monotonic() - self._last_touch_flush < TOUCH_EVERY_S:
                return
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._flush_touches(self._db)
            finally:
                self._db.execute("COMMIT")

    def _flush_touches(self, db: sqlite3.Connection) -> None:
        """Write the recorded reads (in the caller's transaction)."""
        touched, self._touched = self._touched, {}
        db.executemany("UPDATE blocks SET used = max(used, ?) WHERE name = ?",
                       [(used, name) for name, used in touched.items()])
        self._last_touch_flush = time.monotonic()

    def _reconcile(self) -> None:
        """Index the blocks a dead process renamed but did not index, forget blocks whose files
        are gone, drop stale temp files, and evict down to this process's bound."""
        now = time.time()
        for tmp in self.tmp_dir.iterdir():
            with contextlib.suppress(FileNotFoundError):
                if now - tmp.stat().st_mtime > STALE_TMP_S:
                    tmp.unlink()
        with self._transaction() as db:
            indexed = {name for (name,) in db.execute("SELECT name FROM blocks")}
            on_disk = {}
            for path in self.blocks_dir.glob("*/*"):
                with contextlib.suppress(FileNotFoundError):
                    on_disk[path.name] = path.stat().st_size
            db.executemany("INSERT INTO blocks VALUES (?, ?, 0)",
                           [(name, size) for name, size in on_disk.items() if name not in indexed])
            db.executemany("DELETE FROM blocks WHERE name = ?", [(name,) for name in indexed - on_disk.keys()])
            self._evict(db)
