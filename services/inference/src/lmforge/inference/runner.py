"""The engine's thread: it steps the engine while there is work and hands each new token to
the asyncio side (the API), which awaits them per request. All engine calls happen under one
lock, so requests can be added and cancelled from the event loop at any time."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from lmforge.inference.engine import Engine, Sequence
from lmforge.inference.sampling import SamplingParams


@dataclass(eq=False)
class Handle:
    seq: Sequence
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)

    async def tokens(self) -> AsyncIterator[int]:
        """Each generated token as it is produced; ends when the sequence finishes."""
        while True:
            token, finished = await self.queue.get()
            if token is not None:
                yield token
            if finished:
                return


class EngineRunner:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._lock = threading.Lock()
        self._work = threading.Event()
        self._stopping = False
        self._handles: dict[Sequence, Handle] = {}
        self._thread = threading.Thread(target=self._run, name="lmforge-engine", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def submit(self, prompt: list[int], params: SamplingParams) -> Handle:
        """Queue a request (raises QueueFull or ValueError at once); call from the event loop."""
        with self._lock:
            seq = self.engine.add(prompt, params)
            handle = Handle(seq, asyncio.get_running_loop())
            self._handles[seq] = handle
        self._work.set()
        return handle

    def cancel(self, handle: Handle) -> None:
        with self._lock:
            self.engine.cancel(handle.seq)
            self._handles.pop(handle.seq, None)

    def counts(self) -> tuple[int, int]:
        """(running, waiting)."""
        with self._lock:
            return len(self.engine.running), len(self.engine.waiting)

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._work.wait(timeout=0.5)
                with self._lock:
                    produced = self.engine.step() if self.engine.has_work() else []
                    if not self.engine.has_work():
                        self._work.clear()
                    deliveries = [(self._handles.get(seq), token, seq.finished) for seq, token in produced]
                    for seq, _ in produced:
                        if seq.finished:
                            self._handles.pop(seq, None)
                for handle, token, finished in deliveries:
                    if handle is not None:
                        handle.loop.call_soon_threadsafe(handle.queue.put_nowait, (token, finished))
        except BaseException as exc:  # surfaced by /readyz; every waiting request is ended
            self.error = exc
            with self._lock:
                for handle in self._handles.values():
                    handle.loop.call_soon_threadsafe(handle.queue.put_nowait, (None, True))
                self._handles.clear()

    def stop(self) -> None:
        self._stopping = True
        self._work.set()
        self._thread.join(timeout=5)
