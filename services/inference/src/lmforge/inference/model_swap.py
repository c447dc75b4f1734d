"""Following a model pointer (lmforge.model.pointer) while serving.

Every `pointer_poll_seconds` the follower re-reads the pointer. When it names another package,
the follower downloads it, verifies it (file checksums required) and loads it beside the current
model, which goes on serving meanwhile; then it swaps: new requests take the new model, requests
already running finish on the old one (each holds a lease on its model), and the old model is
stopped once the last lease is returned, or after `swap_drain_seconds` at the latest. /readyz
stays 200 throughout. The replica holds both models during a swap (memory, GPU memory and the
download cache must have room for two).

A package that fails (it does not verify, does not load, does not fit) is refused: logged
(`model_refused`), counted (model_swaps_total{outcome="refused"}), its download deleted, and
not tried again until the pointer names another package; the old model serves on. A failed
read of the pointer or of the package's files (the store unreachable) is logged and retried at
the next poll.

The follower knows the service only as `Serving` (the fields and the one method it uses), and
the models through served_model: the service imports this module, never the reverse.
"""

from __future__ import annotations

import shutil
import threading
import time
from typing import Protocol

from lmforge.common.errors import StorageError
from lmforge.common.logging import get_logger
from lmforge.common.store import scheme_of
from lmforge.inference.config import ServeConfig
from lmforge.inference.metrics import ServeMetrics
from lmforge.inference.served_model import ServedModel, load_model
from lmforge.model.package import download_dir
from lmforge.model.pointer import read_pointer

log = get_logger("inference")


class Serving(Protocol):
    """What the follower needs of the service (an InferenceService): the model it serves and how
    to swap another in, and what loading one takes."""

    config: ServeConfig
    metrics: ServeMetrics
    model_name: str
    device: str
    model: ServedModel | None

    def swap_in(self, new: ServedModel) -> ServedModel:
        """Make `new` the current model; returns the one it replaces."""
        ...


class PointerFollower:
    def __init__(self, service: Serving):
        self.service = service
        self.pointer_uri = service.config.model
        self.poll_seconds = service.config.pointer_poll_seconds
        self.refused: str | None = None  # the package last refused: not retried while the pointer names it
        self._missing_logged = False
        self._downloads = threading.Lock()  # a retired model's download is not deleted while one loads
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lmforge-model-pointer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            self.check()

    def check(self) -> None:
        """Read the pointer once; swap to the package it names if that is new and loads."""
        metrics = self.service.metrics
        try:
            pointer = read_pointer(self.pointer_uri)
        except Exception as exc:  # noqa: BLE001 - a bad read never stops the follower or the serving
            metrics.observe_pointer_read_error()
            log.warning("model_pointer_unreadable", pointer=self.pointer_uri, error=str(exc), kind=type(exc).__name__)
            return
        if pointer is None:
            if not self._missing_logged:
                metrics.observe_pointer_read_error()
                log.warning("model_pointer_missing", pointer=self.pointer_uri, serving=self.service.model.package)
            self._missing_logged = True
            return
        self._missing_logged = False
        current = self.service.model
        if pointer.model in (current.package, self.refused):
            return
        log.info("model_swap_started", pointer=self.pointer_uri, package=pointer.model, serving=current.package,
                 set_at=pointer.set_at, set_by=pointer.set_by)
        started = time.monotonic()
        try:
            with self._downloads:
                new = load_model(pointer.model, self.service.config, self.service.device,
                                 model_name=self.service.model_name, require_checksums=True)
        except StorageError as exc:  # the store, not the package: try again at the next poll
            log.warning("model_swap_retry", package=pointer.model, error=str(exc), serving=current.package)
            return
        except Exception as exc:  # noqa: BLE001 - any failure refuses the package, never the serving
            self.refused = pointer.model
            metrics.observe_swap("refused")
            log.error("model_refused", pointer=self.pointer_uri, package=pointer.model, error=str(exc),
                      kind=type(exc).__name__, serving=current.package)
            with self._downloads:
                discard_download(pointer.model, self.service.config.cache_dir)
            return
        old = self.service.swap_in(new)
        metrics.observe_swap("swapped")
        log.info("model_swapped", package=new.package, step=new.step, previous=old.package,
                 seconds=round(time.monotonic() - started, 2))
        threading.Thread(target=self.retire, args=(old,), name="lmforge-model-retire", daemon=True).start()

    def retire(self, old: ServedModel) -> None:
        """Stop a swapped-out model once no request holds it (or after swap_drain_seconds: the
        requests still on it then end with 503) and delete its download, unless the pointer has
        led back to that package meanwhile."""
        started = time.monotonic()
        drained = old.wait_unleased(self.service.config.swap_drain_seconds)
        old.engine.stop()
        with self._downloads:
            if self.service.model.package != old.package:
                discard_download(old.package, self.service.config.cache_dir)
        log.info("model_retired", package=old.package, drained=drained, unfinished_requests=old.leases,
                 seconds=round(time.monotonic() - started, 2))


def discard_download(package: str, cache_dir: str) -> None:
    """Delete the local copy of an s3:// package (a local package is never touched)."""
    if scheme_of(package) == "s3":
        shutil.rmtree(download_dir(package, cache_dir), ignore_errors=True)
