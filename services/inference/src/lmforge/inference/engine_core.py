"""The engine core: the model, its KV cache, the scheduler and the sampler (lmforge.inference.engine)
in a process of their own, stepping as fast as the device allows (vLLM v1's EngineCore).

The API processes (HTTP, auth, JSON, tokenization, detokenization, streaming) run beside it and
talk to it over one ZeroMQ socket (lmforge.inference.engine_protocol): the engine binds a ROUTER,
each API process connects a DEALER. Between two steps the engine takes in every message waiting
(new requests, aborts, scoring jobs) without blocking; with no work it blocks on the socket, and
sends each API process a heartbeat with its counters every HEARTBEAT_SECONDS. After a step it sends
each API process one message with its sequences' tokens. So the engine's Python does the
scheduling and the model's launches only, and the GIL it holds is its own.

`run_engine_core` is the process's whole life: load the package, report ready (or why it could
not load) through a pipe to the process that started it, serve, and on a fault it cannot serve on
tell every API process (`Fatal`) and exit with ENGINE_FAILED_EXIT. The same function also runs in a
thread of the API process (`engine_layout: thread`, for debugging and in-process tests): the
messages and the code are the same.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field

import msgspec
import zmq

from lmforge.common.errors import CLI_ERRORS, as_lmforge_error
from lmforge.common.logging import configure_logging, get_logger
from lmforge.inference import engine_protocol as protocol

log = get_logger("inference")

HEARTBEAT_SECONDS = 0.5
ENGINE_FAILED_EXIT = 70  # EX_SOFTWARE: the engine broke while serving


@dataclass
class EngineSpec:
    """What the engine core loads and how it runs: picklable, handed to a spawned process."""

    package: str  # the package URI (its identity in the prefix cache's keys)
    path: str  # its local copy
    device: str
    engine: dict  # EngineConfig's fields
    require_checksums: bool = False
    log_level: str | None = None
    extra: dict = field(default_factory=dict)


def load_engine(spec: EngineSpec):
    """The package's model in an Engine (checksums verified as asked)."""
    import torch

    from lmforge.inference.engine import Engine
    from lmforge.inference.text import Codec
    from lmforge.model.package import TOKENIZER, load_package

    model, meta = load_package(spec.path, device=spec.device, require_checksums=spec.require_checksums)
    if spec.device == "cuda":
        model = model.to(torch.bfloat16)
    eos_id = Codec(os.path.join(spec.path, TOKENIZER)).eos_id
    identity = json.dumps({"package": spec.package, "step": meta.get("step"), "files": meta.get("files")},
                          sort_keys=True)
    return Engine(model, eos_id=eos_id, model_identity=identity, **spec.engine)


def engine_info(engine) -> protocol.EngineInfo:
    return protocol.EngineInfo(vocab_size=engine.config.vocab_size, context_length=engine.config.context_length,
                               max_waiting=engine.max_waiting, kv_cache_bytes=engine.cache.bytes,
                               kv_cache_blocks=engine.cache.num_blocks,
                               parameters=sum(p.numel() for p in engine.model.parameters()), pid=os.getpid())


def load_failure(exc: BaseException) -> dict:
    """How a load failure crosses the pipe: its kind, message and, for an error a CLI reports, the
    exit code it stands for."""
    exit_code = as_lmforge_error(exc).exit_code if isinstance(exc, CLI_ERRORS) else None
    return {"kind": type(exc).__name__, "message": str(exc), "exit_code": exit_code}


def run_engine_core(spec: EngineSpec, address: str, conn, in_process: bool = False) -> None:
    """Load, say ready (or why not) on `conn`, then serve on `address` until told to shut down.
    In a process of its own, a broken engine ends the process with ENGINE_FAILED_EXIT."""
    if not in_process:
        configure_logging(spec.log_level)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the API process, which stops us
    try:
        engine = load_engine(spec)
    except BaseException as exc:  # noqa: BLE001 - the API process reports it (readyz, the CLI's exit code)
        conn.send(("failed", load_failure(exc)))
        conn.close()
        return
    core = EngineCore(engine, address, parent_pid=None if in_process else os.getppid())
    conn.send(("ready", None))
    conn.close()
    failed = core.serve()
    if failed and not in_process:
        os._exit(ENGINE_FAILED_EXIT)  # noqa: SLF001 - no atexit work: the model's memory goes with the process


class EngineCore:
    """The serving loop around one Engine, on one ROUTER socket."""

    def __init__(self, engine, address: str, parent_pid: int | None = None):
        self.engine = engine
        self.parent_pid = parent_pid  # the API process that started this one: we end when it is gone
        self.info = engine_info(engine)
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 0)  # an API process gone: its messages are dropped
        self.socket.bind(address)
        if address.startswith("ipc://"):
            os.chmod(address.removeprefix("ipc://"), 0o600)  # this user's processes only (the pod's)
        self.encode = protocol.encoder().encode
        self.decode = protocol.engine_decoder().decode
        self.clients: dict[bytes, int] = {}  # API process identity -> Adds taken in
        self.sequences: dict = {}  # Sequence -> (identity, key)
        self.by_key: dict[tuple[bytes, int], object] = {}
        self._stopping = False
        self._last_heartbeat = 0.0

    # -- the loop ---------------------------------------------------------------------------------

    def serve(self) -> bool:
        """Serve until Shutdown; True if the engine broke (every API process was told)."""
        try:
            while not self._stopping and not self._orphaned():
                busy = self.engine.has_work()
                self._receive(timeout_ms=0 if busy else int(HEARTBEAT_SECONDS * 1000))
                if self.engine.has_work():
                    self._send_step(self.engine.step())
                elif time.monotonic() - self._last_heartbeat >= HEARTBEAT_SECONDS:
                    self._send_step([])
            return False
        except BaseException as exc:  # noqa: BLE001 - logged once with its traceback, told to every API process
            log.error("engine_failed", error=str(exc), kind=type(exc).__name__, exc_info=True)
            for identity in self.clients:
                self._send(identity, protocol.Fatal(type(exc).__name__, str(exc)))
            return True
        finally:
            self.socket.close(linger=200)
            self.context.term()

    def _orphaned(self) -> bool:
        """The API process that started us is gone (killed without stopping us): so are its requests."""
        if self.parent_pid is None or os.getppid() == self.parent_pid:
            return False
        log.error("engine_orphaned", parent_pid=self.parent_pid)
        return True

    def _receive(self, timeout_ms: int) -> None:
        if not self.socket.poll(timeout_ms):
            return
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                if len(frames) != 2:
                    raise msgspec.DecodeError(f"{len(frames) - 1} frames, not 1")
                identity, payload = frames
                message = self.decode(payload)
            except msgspec.DecodeError as exc:  # not one of our API processes' messages: dropped, not fatal
                log.warning("engine_message_refused", error=str(exc), size=sum(map(len, frames)))
                continue
            self._handle(identity, message)

    def _handle(self, identity: bytes, message) -> None:
        if isinstance(message, protocol.Add):
            self.clients[identity] = self.clients.get(identity, 0) + 1
            self._add(identity, message)
        elif isinstance(message, protocol.Abort):
            seq = self.by_key.pop((identity, message.key), None)
            if seq is not None:
                self.sequences.pop(seq, None)
                self.engine.cancel(seq)
        elif isinstance(message, protocol.Compute):
            self._send(identity, self._compute(message))
        elif isinstance(message, protocol.Hello):
            self.clients.setdefault(identity, 0)
            self._send(identity, protocol.Ready(self.info))
        elif isinstance(message, protocol.Shutdown):
            self._stopping = True

    def _add(self, identity: bytes, add: protocol.Add) -> None:
        try:
            seq = self.engine.new_sequence(add.prompt, add.params, add.request_id)
        except ValueError as exc:  # the API checks the same bounds first: this is a second line
            self._send(identity, protocol.Step([protocol.Output(add.key, None, "error", error=str(exc))],
                                               *self._counters(identity)))
            return
        seq.arrived = add.arrived
        self.sequences[seq] = (identity, add.key)
        self.by_key[identity, add.key] = seq
        self.engine.enqueue(seq)

    def _compute(self, job: protocol.Compute) -> protocol.ComputeResult:
        try:
            if job.kind == "score":
                return protocol.ComputeResult(job.key, self.engine.score(job.tokens))
            chosen, tops = self.engine.prompt_logprobs(job.tokens, job.top)
            return protocol.ComputeResult(job.key, chosen, tops)
        except ValueError as exc:
            return protocol.ComputeResult(job.key, error=str(exc))

    # -- what goes out ----------------------------------------------------------------------------

    def _counters(self, identity: bytes) -> tuple:
        return (self.engine.stats(), len(self.engine.running), len(self.engine.waiting),
                self.clients.get(identity, 0))

    def _send_step(self, produced) -> None:
        by_client: dict[bytes, list[protocol.Output]] = {identity: [] for identity in self.clients}
        for seq, token in produced:
            owner = self.sequences.get(seq)
            if owner is None:
                continue  # aborted meanwhile
            identity, key = owner
            if seq.finished:
                del self.sequences[seq]
                self.by_key.pop(owner, None)
            by_client.setdefault(identity, []).append(self._output(key, seq, token))
        for identity, outputs in by_client.items():
            self._send(identity, protocol.Step(outputs, *self._counters(identity)))
        self._last_heartbeat = time.monotonic()

    @staticmethod
    def _output(key: int, seq, token: int | None) -> protocol.Output:
        output = protocol.Output(key, token, seq.finish_reason, seq.scheduled_at, seq.first_token_at, seq.finished_at)
        if token is not None and seq.params.logprobs is not None:
            output.logprob = seq.logprobs[-1]
            if seq.params.logprobs:
                output.top_logprobs = seq.top_logprobs[-1]
        if seq.error is not None:
            output.error = f"{type(seq.error).__name__}: {seq.error}"
        return output

    def _send(self, identity: bytes, message) -> None:
        self.socket.send_multipart([identity, self.encode(message)], copy=False)
