"""Batches prepared ahead in a background thread (pinned host memory on GPU).

Which sequences a batch holds stays a pure function of its index (see data.py); the thread
only computes batch(index) for the next indices before the loop asks for them.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch

from lmforge.trainer.data import SampleRef

BatchFn = Callable[[int], tuple[np.ndarray, list[SampleRef]]]


def _load(batch_fn: BatchFn, index: int, pin: bool) -> tuple[torch.Tensor, list[SampleRef]]:
    tokens, refs = batch_fn(index)
    batch = torch.from_numpy(tokens)
    return (batch.pin_memory() if pin else batch), refs


class Prefetcher:
    """Iterates (index, batch, refs, seconds waited) over `indices`, `depth` batches ahead
    (depth 0: loaded in the caller's thread)."""

    def __init__(self, batch_fn: BatchFn, indices: range, *, depth: int, pin_memory: bool):
        self._batch_fn, self._indices, self._depth, self._pin = batch_fn, indices, depth, pin_memory
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
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
        try:
            for index in self._indices:
                item = _load(self._batch_fn, index, self._pin)
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
        except BaseException as exc:  # handed to the consumer, which raises it
            self._queue.put(exc)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
