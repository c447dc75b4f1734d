"""The serving core between the HTTP layer and the engine: loads the model package (in the
background, so /healthz answers while a large model downloads), starts its engine (in a process
of its own: lmforge.inference.engine_client), and turns one request into a stream of text deltas
with metrics and spans when it ends.

`--model` may name a model pointer instead of a package: the server then serves the package the
pointer names and follows the pointer (model_swap). A request uses the model that was current
when it started (`ServedModel`, held by a lease) to its end, also across a swap."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
from opentelemetry import trace

from lmforge.common.logging import get_logger
from lmforge.inference.config import ServeConfig
from lmforge.inference.engine_client import EngineStopped, Handle
from lmforge.inference.metrics import ServeMetrics
from lmforge.inference.model_swap import PointerFollower
from lmforge.inference.sampling import SamplingParams
from lmforge.inference.served_model import ServedModel, default_model_name, load_model
from lmforge.inference.stats import EngineStats
from lmforge.inference.text import TextStream
from lmforge.inference.trace_runner import TraceRunner
from lmforge.inference.tracing import MonotonicClock, record_generation_spans, tracer_provider
from lmforge.model.pointer import resolve_model

log = get_logger("inference")

INLINE_TEXT_CHARS = 4096  # tokenized on the event loop (microseconds), never queued behind a long text
TEXT_THREADS = 4


class NotReady(Exception):
    """The model is still loading, failed to load, or the engine stopped."""


class RequestFailed(NotReady):
    """The engine failed this one request (and serves the others on). A NotReady, so that a
    stream ends on it as on an engine that stopped: with an error event."""


@dataclass
class Delta:
    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: str | None = None


def resolve_device(choice: str) -> str:
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise NotReady("device=cuda but no GPU is visible")
    return choice


class InferenceService:
    def __init__(self, config: ServeConfig, span_exporter=None):
        self.config = config
        self.model_name = config.model_name or default_model_name(config.model)
        self.device = resolve_device(config.device)
        self.model: ServedModel | None = None  # the current model: each new request takes it
        self.follower: PointerFollower | None = None  # when config.model is a pointer
        self.load_error: BaseException | None = None
        self.metrics = ServeMetrics(self.model_name, self.device, self._counts, self._engine_stats)
        # /v1/trace's index (None: not configured), loaded beside the model
        self.trace = TraceRunner(config.trace, self.metrics.trace) if config.trace.index else None
        self._text_pool = ThreadPoolExecutor(TEXT_THREADS, thread_name_prefix="lmforge-text")
        self.tracer_provider = tracer_provider("lmforge-inference", span_exporter)
        self.tracer = self.tracer_provider.get_tracer("lmforge.inference")
        self.clock = MonotonicClock()
        self._stopped = False

    # -- lifecycle -----------------------------------------------------------------------------

    def load(self) -> None:
        """Resolve the pointer (if `model` is one), fetch and load the package, start the engine
        and, for a pointer, follow it; errors are kept for /readyz and the CLI."""
        try:
            pointer, package = resolve_model(self.config.model)
            if pointer is not None:
                log.info("model_pointer_resolved", pointer=self.config.model, package=package,
                         set_at=pointer.set_at, set_by=pointer.set_by)
            self.model = load_model(package, self.config, self.device, model_name=self.model_name,
                                    require_checksums=pointer is not None)
            self.metrics.set_model_info(self.model.version, self.model.step)
            if pointer is not None:
                self.follower = PointerFollower(self)
                self.follower.start()
        except BaseException as exc:  # noqa: BLE001 - reported by /readyz; the CLI exits non-zero
            self.load_error = exc
            log.error("model_load_failed", model=self.config.model, error=str(exc), kind=type(exc).__name__)

    def swap_in(self, new: ServedModel) -> ServedModel:
        """Make `new` the current model (new requests take it); returns the one it replaces."""
        old, self.model = self.model, new
        self.metrics.set_model_info(new.version, new.step)
        return old

    def load_in_background(self) -> threading.Thread:
        """Load the model (the thread returned) and the trace index, if any (a thread of its own: its failure
        leaves the model serving)."""
        if self.trace is not None:
            self.trace.load_in_background()
        thread = threading.Thread(target=self.load, name="lmforge-model-load", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        """Stop following the pointer, the engine and the helpers (once; later calls do nothing)."""
        if self._stopped:
            return
        self._stopped = True
        if self.follower is not None:
            self.follower.stop()
        if self.model is not None:
            self.model.engine.stop()
        if self.trace is not None:
            self.trace.stop()
        self._text_pool.shutdown(wait=False, cancel_futures=True)
        self.tracer_provider.shutdown()

    def readiness(self, model: ServedModel | None = None) -> str | None:
        """None when ready to serve (the current model, or `model`), else why not."""
        model = model or self.model
        if self.load_error is not None:
            return f"model failed to load: {self.load_error}"
        if model is None:
            return "model loading"
        if not model.engine.alive:
            return f"engine stopped: {model.engine.error}"
        return None

    def liveness(self) -> str | None:
        """None while the process can serve (or is loading), else why not: the current model's
        engine broke or its process exited, which only a restart mends."""
        model = self.model
        if model is not None and model.engine.error is not None:
            return f"engine failed: {model.engine.error}"
        return None

    def _counts(self) -> tuple[int, int] | None:
        model = self.model
        return model.engine.counts() if model else None  # no engine yet: no value, not 0

    def _engine_stats(self) -> EngineStats | None:
        model = self.model
        return model.engine.stats() if model else None

    # -- requests ------------------------------------------------------------------------------

    def ensure_ready(self) -> ServedModel:
        """The current model, if it can serve; a request leases it and uses it to its end."""
        model = self.model  # read once: a swap meanwhile does not mix two models in one request
        reason = self.readiness(model)
        if reason is not None:
            raise NotReady(reason)
        return model

    async def encode(self, model: ServedModel, text: str) -> list[int]:
        """The token ids of `text`. A long text is tokenized on a worker thread: it takes seconds
        at a megabyte, while the event loop goes on answering every other client and the probes."""
        if len(text) <= INLINE_TEXT_CHARS:
            return model.codec.encode(text)
        return await asyncio.get_running_loop().run_in_executor(self._text_pool, model.codec.encode, text)

    async def token_texts(self, model: ServedModel, ids: list[int]) -> list[str]:
        """Each token's text (a whole context's worth is done on a worker thread)."""
        return await asyncio.get_running_loop().run_in_executor(
            self._text_pool, lambda: [model.codec.token_text(t) for t in ids])

    def submit(self, model: ServedModel, prompt_ids: list[int], params: SamplingParams,
               request_id: str | None = None) -> Handle:
        """Raises QueueFull when the waiting queue is at capacity, NotReady when the engine stopped."""
        try:
            return model.engine.submit(prompt_ids, params, request_id)
        except EngineStopped as exc:
            raise NotReady(f"engine stopped: {exc}") from exc

    async def deltas(self, model: ServedModel, handle: Handle, stop: list[str],
                     span: trace.Span) -> AsyncIterator[Delta]:
        """Text deltas as tokens arrive; the last one carries the finish reason. If the consumer
        stops early (the client went away), the sequence is cancelled and its slot freed. Raises
        RequestFailed when the engine failed the sequence, NotReady when the engine stopped."""
        seq, stream = handle.seq, TextStream(model.codec, stop)
        pending = Delta("")
        reason, generated = "cancelled", 0
        try:
            async for token in handle.tokens():
                generated += 1
                self._add_token(pending, seq, generated - 1, token)
                pending.text += stream.feed(token)
                if stream.stopped:
                    reason = "stop"
                    break
                if pending.text:
                    yield pending
                    pending = Delta("")
            else:
                reason = "cancelled" if handle.cancelled else seq.finish_reason or "error"
                pending.text += stream.flush()
            if seq.error is not None:
                raise RequestFailed(f"internal error while generating (request id {seq.request_id}); "
                                    "the server logged it")
            if reason == "error":
                raise NotReady(f"engine stopped: {model.engine.error}")
            pending.finish_reason = reason
            yield pending
        finally:
            ended_at = time.monotonic()
            if not seq.finished:
                model.engine.cancel(handle)
            self.metrics.observe_generation(seq, reason, ended_at, generated)
            record_generation_spans(self.tracer, span, seq, ended_at, self.clock)
            span.set_attribute("lmforge.finish_reason", reason)
            span.set_attribute("lmforge.generated_tokens", generated)

    @staticmethod
    def _add_token(delta: Delta, seq, index: int, token: int) -> None:
        delta.token_ids.append(token)
        if seq.params.logprobs is not None:
            delta.logprobs.append(seq.logprobs[index])
            if seq.params.logprobs:
                delta.top_logprobs.append(seq.top_logprobs[index])

    async def score(self, model: ServedModel, ids: list[int]) -> tuple[list[float], float]:
        """(logprob of each token after the first, perplexity over them)."""
        try:
            logprobs = await model.engine.score(ids)
        except EngineStopped as exc:
            raise NotReady(f"engine stopped: {exc}") from exc
        return logprobs, math.exp(-sum(logprobs) / len(logprobs))
