"""The API process's side of the engine: starts the engine core (lmforge.inference.engine_core) in a
process of its own (or, with `engine_layout: thread`, a thread), and turns its messages into each
request's stream of tokens for the asyncio side.

The event loop never waits on the engine. `submit`, `cancel` and the scoring jobs encode a message
and hand it to this process's I/O thread through an in-process ZeroMQ queue; the I/O thread owns
the socket to the engine, sends, receives each step's outputs and wakes the event loop once per
step with all of them. Each request is mirrored by a `Sequence` whose tokens, logprobs, times and
finish reason the I/O thread fills in from the engine's outputs (metrics and traces read it).

Admission (429) is decided here, at once: the engine's waiting queue as of its last message, plus
this process's requests the engine has not taken in yet, against `max_waiting`.

The engine gone (its process exited, or it broke and said so with `Fatal`) is `error`: /healthz
fails on it, and every request still held ends (its consumer sees the stream end without a finish
reason). Stopped (a retired model after a swap, shutdown), it takes no more work either.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import multiprocessing
import os
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import zmq

from lmforge.common.errors import ConfigError, InputError, LmforgeError, StorageError
from lmforge.common.logging import get_logger
from lmforge.inference import engine_protocol as protocol
from lmforge.inference.engine import QueueFull
from lmforge.inference.engine_core import EngineSpec, run_engine_core
from lmforge.inference.sampling import SamplingParams
from lmforge.inference.sequence import Sequence, check_prompt
from lmforge.inference.stats import EngineStats

log = get_logger("inference")

POLL_MS = 100  # how often the I/O thread looks at the engine's liveness when nothing arrives
STOP_SECONDS = 10
ERRORS_BY_EXIT_CODE = {1: LmforgeError, 2: ConfigError, 3: InputError, 4: StorageError}


class EngineStopped(Exception):
    """The engine was stopped (its model retired) or is gone: it takes no more work."""


class EngineGone(Exception):
    """Why the engine can no longer serve: it broke, or its process exited."""


class RequestFailedInEngine(Exception):
    """The engine failed this one request (it logged the fault with the request id)."""


@dataclass(eq=False)
class Handle:
    seq: Sequence
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False

    async def tokens(self) -> AsyncIterator[int]:
        """Each generated token as it is produced; ends when the sequence finishes (also failed:
        `seq.error`) or the engine stops."""
        while True:
            token, finished = await self.queue.get()
            if token is not None:
                yield token
            if finished:
                return


def _deliver(deliveries: list[tuple[Handle, tuple[int | None, bool]]]) -> None:
    for handle, item in deliveries:
        handle.queue.put_nowait(item)


def process_alive(pid: int) -> bool:
    """A process of this machine (or pod) with this id exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_error(failure: dict) -> Exception:
    """A load failure reported by the engine as the error it stands for (an exit code's class)."""
    cls = ERRORS_BY_EXIT_CODE.get(failure["exit_code"])
    if cls is None:
        return RuntimeError(f"{failure['kind']}: {failure['message']}")
    return cls(failure["message"])


class EngineClient:
    """`layout`: "process" starts the engine in a process of its own, "thread" in a thread of this
    process; "connect" joins an engine another API process started, at `address` (it is not
    stopped with this client)."""

    def __init__(self, spec: EngineSpec | None, layout: str = "process", address: str | None = None):
        if (layout == "connect") != (address is not None):
            raise ValueError("an address is given exactly when connecting to a running engine")
        self.spec, self.layout = spec, layout
        self.address = address or f"ipc://{tempfile.gettempdir()}/lmforge-engine-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.info: protocol.EngineInfo | None = None
        self.error: BaseException | None = None  # why the engine is gone (EngineGone)
        self._engine: multiprocessing.Process | threading.Thread | None = None
        self._context = zmq.Context()
        self._outbox_address = f"inproc://outbox-{id(self)}"
        self._senders = threading.local()
        self._encode = protocol.encoder().encode
        self._keys = itertools.count()
        self._handles: dict[int, Handle] = {}
        self._jobs: dict[int, concurrent.futures.Future] = {}
        self._lock = threading.Lock()  # orders submissions against closing
        self._closed = False
        self._stopping = False
        self._adds_sent = 0
        self._adds_seen = 0
        self._running = self._waiting = 0
        self._stats = EngineStats()
        self._io: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self, timeout: float = 30) -> protocol.EngineInfo:
        """Start the engine and wait until it has loaded the model (raises why it could not); or,
        connecting, wait up to `timeout` s for the engine to answer."""
        if self.layout != "connect":
            self._start_engine()
        outbox = self._context.socket(zmq.PULL)
        outbox.setsockopt(zmq.RCVHWM, 0)
        outbox.bind(self._outbox_address)
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.address)
        dealer.send(self._encode(protocol.Hello()))
        if not dealer.poll(int(timeout * 1000)):
            dealer.close()
            outbox.close()
            raise EngineGone(f"no engine answered at {self.address} within {timeout:g} s")
        ready = protocol.api_decoder().decode(dealer.recv())
        if not isinstance(ready, protocol.Ready):
            raise EngineGone(f"the engine at {self.address} answered {type(ready).__name__}, not Ready")
        self.info = ready.info
        self._stats = EngineStats(kv_blocks_total=self.info.kv_cache_blocks)
        self._io = threading.Thread(target=self._run_io, args=(dealer, outbox), name="lmforge-engine-io",
                                    daemon=True)
        self._io.start()
        return self.info

    def _start_engine(self) -> None:
        parent, child = multiprocessing.Pipe(duplex=False)
        if self.layout == "thread":
            self._engine = threading.Thread(target=run_engine_core, args=(self.spec, self.address, child, True),
                                            name="lmforge-engine", daemon=True)
        else:
            self._engine = multiprocessing.get_context("spawn").Process(
                target=run_engine_core, args=(self.spec, self.address, child), name="lmforge-engine")
        self._engine.start()
        if self.layout != "thread":
            child.close()  # the engine's end, now in its process
        status = self._wait_for_load(parent)
        if status[0] == "failed":
            self._engine.join(timeout=STOP_SECONDS)
            raise start_error(status[1])

    def _wait_for_load(self, conn) -> tuple:
        while not conn.poll(0.2):
            if not self._engine_alive():
                code = getattr(self._engine, "exitcode", None)
                raise RuntimeError(f"the engine exited while loading the model (exit code {code})")
        return conn.recv()

    def _engine_alive(self) -> bool:
        if self.layout == "connect":
            return self.info is not None and process_alive(self.info.pid)
        return self._engine is not None and self._engine.is_alive()

    @property
    def alive(self) -> bool:
        return self.error is None and not self._closed and self._engine_alive()

    @property
    def pid(self) -> int | None:
        """The engine's process id (this process's own for a thread)."""
        return self.info.pid if self.info is not None else None

    def stop(self) -> None:
        """Stop the engine (every request it still holds ends) and the I/O thread."""
        if self._stopping:
            return
        self._stopping = True
        io_running = self._io is not None and self._io.is_alive()
        if self.layout != "connect" and io_running:  # an engine this client joined is its starter's to stop
            with contextlib.suppress(EngineStopped):
                self._send(protocol.Shutdown())
        if self._io is not None:
            self._io.join(timeout=STOP_SECONDS)
        if self._engine is not None:
            self._engine.join(timeout=STOP_SECONDS)
            if isinstance(self._engine, multiprocessing.process.BaseProcess) and self._engine.is_alive():
                self._engine.kill()
                self._engine.join(timeout=STOP_SECONDS)
        self._close()
        self._context.destroy(linger=0)
        with contextlib.suppress(OSError):
            os.unlink(self.address.removeprefix("ipc://"))

    # -- requests (from the event loop) -----------------------------------------------------------

    def submit(self, prompt: list[int], params: SamplingParams, request_id: str | None = None) -> Handle:
        """Queue a request; raises QueueFull, EngineStopped or ValueError (a bad prompt) at once."""
        check_prompt(prompt, self.info.context_length)
        key = next(self._keys)
        seq = Sequence(key, list(prompt), params, None, request_id=request_id)
        handle = Handle(seq, asyncio.get_running_loop())
        with self._lock:
            if self._closed or self.error is not None:
                raise EngineStopped(f"the engine was stopped{self._why()}")
            waiting = self._waiting + self._adds_sent - self._adds_seen
            if waiting >= self.info.max_waiting:
                raise QueueFull(f"{waiting} requests are waiting")
            self._handles[key] = handle
            self._adds_sent += 1
        self._send(protocol.Add(key, seq.prompt, params, request_id, seq.arrived))
        return handle

    def cancel(self, handle: Handle) -> None:
        """Drop a request whose client went away: the engine frees its KV blocks before its next step."""
        handle.cancelled = True
        if self._handles.pop(handle.seq.id, None) is not None:
            with contextlib.suppress(EngineStopped):  # a stopped engine holds no blocks to free
                self._send(protocol.Abort(handle.seq.id))
        handle.queue.put_nowait((None, True))  # a consumer still awaiting tokens ends now

    async def score(self, tokens: list[int]) -> list[float]:
        """Teacher-forced logprobs of `tokens`, computed by the engine between steps."""
        return (await self._compute("score", tokens, 0))[0]

    async def prompt_logprobs(self, tokens: list[int], top: int) -> tuple[list[float], list[dict[int, float]]]:
        """Engine.prompt_logprobs, computed by the engine between steps."""
        return await self._compute("prompt_logprobs", tokens, top)

    async def _compute(self, kind: str, tokens: list[int], top: int):
        future: concurrent.futures.Future = concurrent.futures.Future()
        key = next(self._keys)
        with self._lock:
            if self._closed or self.error is not None:
                raise EngineStopped(f"the engine was stopped{self._why()}")
            self._jobs[key] = future
        self._send(protocol.Compute(key, kind, list(tokens), top))
        return await asyncio.wrap_future(future)

    def counts(self) -> tuple[int, int]:
        """(running, waiting): the engine's as of its last message, this process's requests it has
        not taken in yet counted as waiting."""
        return self._running, self._waiting + self._adds_sent - self._adds_seen

    def stats(self) -> EngineStats:
        return self._stats

    def _why(self) -> str:
        return f": {self.error}" if self.error is not None else ""

    def _send(self, message) -> None:
        """Hand a message to the I/O thread (any thread may call it: each has its own queue end)."""
        sender = getattr(self._senders, "socket", None)
        if sender is None:
            sender = self._senders.socket = self._context.socket(zmq.PUSH)
            sender.setsockopt(zmq.LINGER, 0)
            sender.setsockopt(zmq.SNDHWM, 0)  # never full: a send fails only once the I/O thread is gone
            sender.connect(self._outbox_address)
        try:
            sender.send(self._encode(message), zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as exc:
            raise EngineStopped(f"the engine was stopped{self._why()}") from exc

    # -- the I/O thread ---------------------------------------------------------------------------

    def _run_io(self, dealer: zmq.Socket, outbox: zmq.Socket) -> None:
        decode = protocol.api_decoder().decode
        poller = zmq.Poller()
        poller.register(dealer, zmq.POLLIN)
        poller.register(outbox, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll(POLL_MS))
                if outbox in events:
                    while True:
                        try:
                            dealer.send(outbox.recv(zmq.NOBLOCK), copy=False)
                        except zmq.Again:
                            break
                if dealer in events:
                    while True:
                        try:
                            payload = dealer.recv(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self._receive(decode(payload.buffer))
                if self._stopping and (self.layout == "connect" or not self._engine_alive()):
                    return
                if self.error is not None:
                    return
                if not self._engine_alive() and not self._stopping:
                    code = getattr(self._engine, "exitcode", "unknown")
                    self.error = EngineGone(f"the engine process (pid {self.pid}) exited with code {code}")
                    log.error("engine_gone", pid=self.pid, exit_code=code)
                    return
        except BaseException as exc:  # noqa: BLE001 - a broken I/O thread is a broken engine to the API
            log.error("engine_io_failed", error=str(exc), kind=type(exc).__name__, exc_info=True)
            self.error = EngineGone(f"{type(exc).__name__}: {exc}")
        finally:
            self._close()
            dealer.close(linger=0)
            outbox.close(linger=0)

    def _receive(self, message) -> None:
        if isinstance(message, protocol.Step):
            self._running, self._waiting, self._adds_seen = message.running, message.waiting, message.adds_seen
            self._stats = message.stats
            by_loop: dict[asyncio.AbstractEventLoop, list] = {}
            for output in message.outputs:
                handle = self._handles.get(output.key)
                if handle is None:
                    continue  # cancelled meanwhile
                finished = self._apply(handle.seq, output)
                if finished:
                    self._handles.pop(output.key, None)
                by_loop.setdefault(handle.loop, []).append((handle, (output.token, finished)))
            for loop, batch in by_loop.items():  # one event-loop wake-up per step, not per token
                with contextlib.suppress(RuntimeError):  # its event loop is gone (shutdown)
                    loop.call_soon_threadsafe(_deliver, batch)
        elif isinstance(message, protocol.ComputeResult):
            future = self._jobs.pop(message.key, None)
            if future is not None:
                if message.error is not None:
                    future.set_exception(ValueError(message.error))
                else:
                    future.set_result((message.logprobs, message.top_logprobs))
        elif isinstance(message, protocol.Fatal):
            self.error = EngineGone(f"{message.kind}: {message.message}")

    @staticmethod
    def _apply(seq: Sequence, output: protocol.Output) -> bool:
        """Mirror one output onto the request's Sequence; True once it is finished."""
        seq.scheduled_at = output.scheduled_at or seq.scheduled_at
        seq.first_token_at = output.first_token_at or seq.first_token_at
        if output.token is not None:
            seq.output.append(output.token)
            if output.logprob is not None:
                seq.logprobs.append(output.logprob)
                if output.top_logprobs is not None:
                    seq.top_logprobs.append(output.top_logprobs)
        if output.error is not None:
            seq.error = RequestFailedInEngine(output.error)
        if output.finish_reason is not None:
            seq.finished_at = output.finished_at
            seq.finish_reason = output.finish_reason
        return seq.finished

    def _close(self) -> None:
        """Take no more work; end every request and job still held."""
        with self._lock:
            self._closed = True
            handles, self._handles = list(self._handles.values()), {}
            jobs, self._jobs = list(self._jobs.values()), {}
        for handle in handles:
            with contextlib.suppress(RuntimeError):  # its event loop is gone (shutdown): nobody waits
                handle.loop.call_soon_threadsafe(handle.queue.put_nowait, (None, True))
        for future in jobs:
            if not future.done():
                future.set_exception(EngineStopped(f"the engine was stopped{self._why()}"))
