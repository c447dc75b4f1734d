"""Batches prepared ahead in background threads (pinned host memory on GPU).

Which sequences a batch holds stays a pure function of its index (see sampling.py); the threads
only compute batch(index) for the next indices before the loop asks for them, `depth` of them
at once, and hand them over in index order. Loading several at once is what hides an object
store's latency: one batch at a time, a loader is never faster than one batch's round trips.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from lmforge.trainer.data import SampleRef

BatchFn = Callable[[int], tuple[np.ndarray, list[SampleRef]]]


def _load(batch_fn: BatchFn, index: int, pin: bool) -> tuple[torch.Tensor, list[SampleRef]]:
    tokens, refs = batch_fn(index)
    batch = torch.from_numpy(tokens)
    return (batch.pin_memory() if pin else batch), refs


class Prefetcher:
    """Iterates (index, batch, refs, seconds waited) over `indices`, `depth` batches loading at
    once ahead of the loop, plus one ready (depth 0: loaded in the caller's thread)."""

    def __init__(self, batch_fn: BatchFn, indices: range, *, depth: int, pin_memory: bool):
        self._batch_fn, self._indices, self._depth, self._pin = batch_fn, indices, depth, pin_memory
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor, list[SampleRef], float]]:
        if self._depth == 0:
            for index in self._indices:
                tick = time.perf_counter()
                batch, refs = _load(self._batch_fn, index, self._pin)
                yield index, batch, refs, time.perf_counter() - tick
            return
        self._thread = threading.Thread(target=self._produce, name="lmforge-prefetch", daemon=True)
        self._thread.start()
        for index in self._indices:
            tick = time.perf_counter()
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            batch, refs = item
            yield index, batch, refs, time.perf_counter() - tick

    def _produce(self) -> None:
        loaders = ThreadPoolExecutor(self._depth, thread_name_prefix="lmforge-load")
        pending: deque[Future] = deque()
        indices = iter(self._indices)
        try:
            while not self._stop.is_set():
                while len(pending) < self._depth and (index := next(indices, None)) is not None:
                    pending.append(loaders.submit(_load, self._batch_fn, index, self._pin))
                if not pending:
                    return
                item = pending.popleft().result()
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # handed to the consumer, which raises it
            self._queue.put(exc)
        finally:
            loaders.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
