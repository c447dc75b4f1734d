"""The trace index a server answers /v1/trace from, and how its searches run (lmforge.trace does the search).

The index is fetched (a local directory in place, s3:// into `trace.cache_dir`, verified: lmforge.trace.cache)
and opened in the background, as the model is: until it is open, or when it failed to, /v1/trace answers 503
with the reason, and the model serves on either way.

A search is a call into infini-gram's C++ engine, which releases the GIL but cannot be cancelled. So searches
run on a pool of `trace.max_concurrent` threads, and a request that finds every thread taken is refused at once
(429) instead of queueing; a client waits at most `trace.timeout_s` (504 after), while the search it started
runs to its end on its thread, which stays taken until then. The work of one search is bounded by the request's
caps (trace.max_tokens, max_documents, max_count), so the thread comes back.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from lmforge.common.logging import get_logger
from lmforge.inference.config import TraceConfig
from lmforge.inference.metrics import TraceMetrics
from lmforge.trace.cache import fetch_index
from lmforge.trace.engine import TraceIndex

log = get_logger("inference")
T = TypeVar("T")


class TraceBusy(Exception):
    """Every search thread is taken."""


class TraceTimeout(Exception):
    """The search took longer than trace.timeout_s (it goes on in the background)."""


class TraceRunner:
    def __init__(self, config: TraceConfig, metrics: TraceMetrics):
        self.config = config
        self.metrics = metrics
        self.index: TraceIndex | None = None
        self.load_error: BaseException | None = None
        self._slots = threading.BoundedSemaphore(config.max_concurrent)
        self._pool = ThreadPoolExecutor(config.max_concurrent, thread_name_prefix="lmforge-trace")

    def load(self) -> None:
        """Fetch and open the index; an error is kept (readiness() names it), never raised."""
        started = time.monotonic()
        try:
            root = fetch_index(self.config.index, self.config.cache_dir)
            index = TraceIndex.open(root)
        except BaseException as exc:  # noqa: BLE001 - /v1/trace reports it; the model serves on
            self.load_error = exc
            log.error("trace_index_load_failed", index=self.config.index, error=str(exc), kind=type(exc).__name__)
            return
        self.metrics.set_index(index.tokens, index.bytes, index.partitions)
        self.index = index
        log.info("trace_index_loaded", index=self.config.index, path=str(root), tokens=index.tokens,
                 documents=index.documents, partitions=index.partitions, bytes=index.bytes,
                 seconds=round(time.monotonic() - started, 2))

    def load_in_background(self) -> threading.Thread:
        thread = threading.Thread(target=self.load, name="lmforge-trace-load", daemon=True)
        thread.start()
        return thread

    def readiness(self, tokenizer_sha256: str | None) -> str | None:
        """None when searches for a model with this tokenizer can run, else why not (one line)."""
        if self.load_error is not None:
            return f"the trace index failed to load: {self.load_error}"
        index = self.index
        if index is None:
            return "the trace index is loading"
        if tokenizer_sha256 != index.tokenizer_sha256:
            return (f"the model's tokenizer (sha256 {str(tokenizer_sha256)[:12]}…) is not the one the trace index was "
                    f"built with ({index.tokenizer_sha256[:12]}…): its token ids would not match the training data")
        return None

    async def run(self, search: Callable[[], T]) -> T:
        """search() on a search thread: TraceBusy when none is free, TraceTimeout after trace.timeout_s."""
        if not self._slots.acquire(blocking=False):
            raise TraceBusy(f"{self.config.max_concurrent} traces are running")
        try:
            future = self._pool.submit(search)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _: self._slots.release())  # when the search ends, not when we stop waiting
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.config.timeout_s)
        except TimeoutError:
            raise TraceTimeout(f"the trace took longer than {self.config.timeout_s:g} s") from None

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
