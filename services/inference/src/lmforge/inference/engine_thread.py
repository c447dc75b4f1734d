"""The engine's thread: it steps the engine while there is work and hands each new token to
the asyncio side (the API), which awaits them per request.

The event loop never waits for the model: submissions, cancellations and scoring jobs go
into an inbox that the engine thread drains between steps. A step that fails some requests ends
their streams (their sequences carry the error); the engine serves on. Once stopped (a retired
model after a swap, shutdown) or broken (the engine raised out of a step: a fault it cannot serve
on, logged once with its traceback, and /healthz fails), the engine thread takes no more work, and every
request it still holds ends (its consumer sees the stream end without a finish reason)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from lmforge.common.logging import get_logger
from lmforge.inference.engine import Engine, QueueFull, Sequence
from lmforge.inference.sampling import SamplingParams

log = get_logger("inference")


@dataclass(eq=False)
class Handle:
    seq: Sequence
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False

    async def tokens(self) -> AsyncIterator[int]:
        """Each generated token as it is produced; ends when the sequence finishes (also failed:
        `seq.error`) or the engine thread stops."""
        while True:
            token, finished = await self.queue.get()
            if token is not None:
                yield token
            if finished:
                return


class RunnerStopped(Exception):
    """The engine thread was stopped (its model retired) or broke: it takes no more work."""


def _deliver(deliveries: list[tuple[Handle, tuple[int | None, bool]]]) -> None:
    for handle, item in deliveries:
        handle.queue.put_nowait(item)


class EngineThread:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._pending = 0  # submissions in the inbox, counted against the waiting limit
        self._pending_lock = threading.Lock()  # also orders submissions against closing
        self._stopping = False
        self._closed = False  # no more work accepted: set under _pending_lock
        self._handles: dict[Sequence, Handle] = {}
        self._thread = threading.Thread(target=self._run, name="lmforge-engine", daemon=True)
        self.error: BaseException | None = None  # what broke the engine thread

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def submit(self, prompt: list[int], params: SamplingParams, request_id: str | None = None) -> Handle:
        """Queue a request; raises QueueFull (or RunnerStopped) at once. Call from the event loop."""
        seq = self.engine.new_sequence(prompt, params, request_id)
        handle = Handle(seq, asyncio.get_running_loop())

        def admit():
            with self._pending_lock:
                self._pending -= 1
            self._handles[seq] = handle
            self.engine.enqueue(seq)

        with self._pending_lock:
            if self._closed:
                raise RunnerStopped("the engine was stopped")
            waiting = len(self.engine.waiting) + self._pending
            if waiting >= self.engine.max_waiting:
                raise QueueFull(f"{waiting} requests are waiting")
            self._pending += 1
            self._inbox.put(admit)
        return handle

    def cancel(self, handle: Handle) -> None:
        """Drop a request whose client went away; its cache slot is freed before the next step.
        Call from the event loop."""
        def drop():
            self.engine.cancel(handle.seq)
            self._handles.pop(handle.seq, None)

        handle.cancelled = True
        self._inbox.put(drop)
        handle.queue.put_nowait((None, True))  # a consumer still awaiting tokens ends now

    async def score(self, tokens: list[int]) -> list[float]:
        """Teacher-forced logprobs of `tokens`, computed by the engine thread between steps."""
        return await self._between_steps(lambda: self.engine.score(tokens))

    async def prompt_logprobs(self, tokens: list[int], top: int) -> tuple[list[float], list[dict[int, float]]]:
        """Engine.prompt_logprobs, computed by the engine thread between steps."""
        return await self._between_steps(lambda: self.engine.prompt_logprobs(tokens, top))

    async def _between_steps(self, compute: Callable[[], Any]) -> Any:
        future: concurrent.futures.Future = concurrent.futures.Future()

        def job():
            try:
                future.set_result(compute())
            except Exception as exc:  # noqa: BLE001 - handed to the awaiting request
                future.set_exception(exc)

        with self._pending_lock:
            if self._closed:
                raise RunnerStopped("the engine was stopped")
            self._inbox.put(job)
        return await asyncio.wrap_future(future)

    def counts(self) -> tuple[int, int]:
        """(running, waiting)."""
        return len(self.engine.running), len(self.engine.waiting) + self._pending

    def _drain_inbox(self, block: bool) -> None:
        try:
            job = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
            while True:
                job()
                job = self._inbox.get_nowait()
        except queue.Empty:
            pass

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._drain_inbox(block=not self.engine.has_work())
                if not self.engine.has_work():
                    continue
                deliveries = []
                for seq, token in self.engine.step():
                    handle = self._handles.get(seq)
                    if seq.finished:
                        self._handles.pop(seq, None)
                    if handle is not None:
                        deliveries.append((handle, (token, seq.finished)))
                by_loop: dict[asyncio.AbstractEventLoop, list] = {}
                for handle, item in deliveries:  # one event-loop wake-up per step, not per token
                    by_loop.setdefault(handle.loop, []).append((handle, item))
                for loop, batch in by_loop.items():
                    loop.call_soon_threadsafe(_deliver, batch)
        except BaseException as exc:  # surfaced by /readyz and /healthz
            log.error("engine_failed", error=str(exc), kind=type(exc).__name__, exc_info=True)
            self.error = exc
        finally:
            self._close()

    def _close(self) -> None:
        """Take no more work; run what is already in the inbox (admissions, cancellations, scoring
        jobs, which fail if the engine broke), then end every request still held."""
        with self._pending_lock:
            self._closed = True
        self._drain_inbox(block=False)
        for handle in self._handles.values():
            with contextlib.suppress(RuntimeError):  # its event loop is gone (shutdown): nobody waits
                handle.loop.call_soon_threadsafe(handle.queue.put_nowait, (None, True))
        self._handles.clear()

    def stop(self) -> None:
        self._stopping = True
        self._inbox.put(lambda: None)
        self._thread.join(timeout=5)
