"""Leases: how uploaders that share one destination tell live uploads from leftovers.

While an uploader writes a checkpoint it holds a lease in the store,
`KIND/.uploaders/IDENTITY.json` (KIND: checkpoints, or weights for weights packages), naming
the step prefixes it is writing. The lease is written before the first byte of the step (so
before any multipart upload of it begins), refreshed every quarter of `stale_upload_seconds`
while held, and deleted when released.

Whatever a live lease claims (one refreshed within stale_upload_seconds, by the store's
clock) is left alone by every other uploader. An open upload is aborted only when it is
provably not live: claimed by a lease that stopped being refreshed; claimed by a lease of
this uploader's own identity (a dead predecessor: pod names are unique among live pods);
or claimed by no lease and initiated more than stale_upload_seconds ago.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from lmforge.common.logging import get_logger
from lmforge.common.store import Store

LEASE_PREFIX = "checkpoints/.uploaders/"
EVERYTHING = frozenset({""})  # what an unreadable lease is taken to claim

log = get_logger("uploader")


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class Claims:
    live: frozenset[str]  # prefixes that live uploaders (this one included) are writing
    dead: frozenset[str]  # prefixes claimed by stale leases or by this identity's predecessor
    stale_leases: tuple[str, ...]  # lease objects that stopped being refreshed (or a predecessor's)

    def is_live(self, rel: str) -> bool:
        return any(rel.startswith(p) for p in self.live)

    def is_dead(self, rel: str) -> bool:
        return any(rel.startswith(p) for p in self.dead)


class UploadLease:
    def __init__(self, destination: Store, identity: str, stale_seconds: float, lease_prefix: str = LEASE_PREFIX):
        self.dest = destination
        self.identity = identity or default_identity()
        self.lease_prefix = lease_prefix
        self.rel = lease_prefix + re.sub(r"[^A-Za-z0-9._-]", "_", self.identity) + ".json"
        self.stale_seconds = stale_seconds
        self._held: set[str] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat, name="lmforge-lease", daemon=True)
        self._thread.start()

    @contextmanager
    def claim(self, prefix: str) -> Iterator[None]:
        """Hold `prefix` in the lease for the block. Raises (and the block does not run) when
        the lease cannot be written: an unclaimed upload could be taken for a leftover."""
        with self._lock:
            self._held.add(prefix)
            try:
                self._write()
            except BaseException:
                self._held.discard(prefix)
                raise
        try:
            yield
        finally:
            with self._lock:
                self._held.discard(prefix)
                try:
                    if self._held:
                        self._write()
                    else:
                        self.dest.delete([self.rel], cancellable=False)
                except Exception as exc:  # the lease goes stale by itself
                    log.warning("lease_release_failed", lease=self.rel, error=f"{type(exc).__name__}: {exc}")

    def _write(self) -> None:
        body = {"identity": self.identity, "prefixes": sorted(self._held), "stale_seconds": self.stale_seconds}
        self.dest.put_bytes(self.rel, json.dumps(body).encode())

    def _heartbeat(self) -> None:
        while not self._closed.wait(self.stale_seconds / 4):
            with self._lock:
                if not self._held:
                    continue
                try:
                    self._write()
                except Exception as exc:  # logged; the next beat tries again
                    log.warning("lease_refresh_failed", lease=self.rel, error=f"{type(exc).__name__}: {exc}")

    def claims(self) -> Claims:
        """What the leases in the store claim now."""
        with self._lock:
            held = set(self._held)
        live, dead, stale = set(held), set(), []
        for rel, obj in self.dest.listing(self.lease_prefix).items():
            if "/" in rel[len(self.lease_prefix) :] or not rel.endswith(".json"):
                continue
            prefixes = self._prefixes(rel)
            if rel == self.rel:
                dead |= prefixes - held  # written by a predecessor of this identity, or released late
                if not held:
                    stale.append(rel)
            elif obj.age_seconds > self.stale_seconds:
                dead |= prefixes
                stale.append(rel)
            else:
                live |= prefixes
        return Claims(frozenset(live), frozenset(dead), tuple(stale))

    def _prefixes(self, rel: str) -> set[str]:
        data = self.dest.get_bytes(rel)
        if data is None:  # released since the listing
            return set()
        try:
            prefixes = json.loads(data)["prefixes"]
            if isinstance(prefixes, list) and all(isinstance(p, str) for p in prefixes):
                return set(prefixes)
        except (ValueError, KeyError, TypeError):
            pass
        log.warning("lease_unreadable", lease=rel, action="taken to claim everything")
        return set(EVERYTHING)

    def abort_stale_uploads(self, rel_prefix: str) -> int:
        """Abort the open uploads under rel_prefix that are provably not live; returns how many."""
        uploads = self.dest.open_uploads(rel_prefix)  # listed before the leases: each was claimed before it began
        if not uploads:
            return 0
        claims = self.claims()
        aborted = 0
        for upload in uploads:
            if claims.is_live(upload.key):
                continue
            if claims.is_dead(upload.key):
                reason = "its uploader's lease is stale or this uploader's predecessor's"
            elif upload.age_seconds > self.stale_seconds:
                reason = "no lease claims it"
            else:
                continue  # unclaimed but recent: decided on a later sweep
            self.dest.abort_upload(upload)
            aborted += 1
            log.info("aborted_stale_upload", key=upload.key, age_seconds=round(upload.age_seconds), reason=reason)
        for rel in claims.stale_leases:
            self.dest.delete([rel])
        return aborted

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
