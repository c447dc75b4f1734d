"""The serving core between the HTTP layer and the engine: loads the model package (in the
background, so /healthz answers while a large model downloads), runs the engine thread, and
turns one request into a stream of text deltas with metrics and spans when it ends."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from opentelemetry import trace

from lmforge.common.logging import get_logger
from lmforge.common.model_package import TOKENIZER, fetch_package, load_package
from lmforge.inference.config import ServeConfig
from lmforge.inference.engine import Engine
from lmforge.inference.metrics import ServeMetrics
from lmforge.inference.runner import EngineRunner, Handle
from lmforge.inference.sampling import SamplingParams
from lmforge.inference.text import Codec, TextStream
from lmforge.inference.tracing import MonotonicClock, record_generation_spans, tracer_provider

log = get_logger("inference")

INLINE_TEXT_CHARS = 4096  # tokenized on the event loop (microseconds), never queued behind a long text
TEXT_THREADS = 4


class NotReady(Exception):
    """The model is still loading, failed to load, or the engine stopped."""


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


def default_model_name(uri: str) -> str:
    return Path(uri.rstrip("/")).name or "model"


class InferenceService:
    def __init__(self, config: ServeConfig, span_exporter=None):
        self.config = config
        self.model_name = config.model_name or default_model_name(config.model)
        self.device = resolve_device(config.device)
        self.runner: EngineRunner | None = None
        self.codec: Codec | None = None
        self.context_length = 0
        self.load_error: BaseException | None = None
        self.loaded = threading.Event()
        self.created = int(time.time())
        self.metrics = ServeMetrics(self.model_name, self.device, self._counts, self._kv_cache_usage)
        self._text_pool = ThreadPoolExecutor(TEXT_THREADS, thread_name_prefix="lmforge-text")
        self.tracer_provider = tracer_provider("lmforge-inference", span_exporter)
        self.tracer = self.tracer_provider.get_tracer("lmforge.inference")
        self.clock = MonotonicClock()

    # -- lifecycle -----------------------------------------------------------------------------

    def load(self) -> None:
        """Fetch and load the package, start the engine; errors are kept for /readyz and the CLI."""
        try:
            started = time.monotonic()
            path = fetch_package(self.config.model, self.config.cache_dir)
            model, meta = load_package(path, device=self.device)
            if self.device == "cuda":
                model = model.to(torch.bfloat16)
            self.codec = Codec(path / TOKENIZER)
            engine = Engine(model, max_running=self.config.engine.max_running,
                            max_waiting=self.config.engine.max_waiting, eos_id=self.codec.eos_id,
                            step_delay_seconds=self.config.engine.step_delay_seconds)
            self.context_length = model.config.context_length
            self.runner = EngineRunner(engine)
            self.runner.start()
            self.metrics.set_model_info(default_model_name(self.config.model), meta.get("step"))
            self.loaded.set()
            log.info("model_loaded", model=self.config.model, model_name=self.model_name, step=meta.get("step"),
                     device=self.device, parameters=sum(p.numel() for p in model.parameters()),
                     kv_cache_bytes=engine.cache.bytes, max_chars_per_token=self.codec.max_chars_per_token,
                     seconds=round(time.monotonic() - started, 2))
        except BaseException as exc:  # noqa: BLE001 - reported by /readyz; the CLI exits non-zero
            self.load_error = exc
            log.error("model_load_failed", model=self.config.model, error=str(exc), kind=type(exc).__name__)

    def load_in_background(self) -> threading.Thread:
        thread = threading.Thread(target=self.load, name="lmforge-model-load", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.stop()
        self._text_pool.shutdown(wait=False, cancel_futures=True)
        self.tracer_provider.shutdown()

    def readiness(self) -> str | None:
        """None when ready to serve, else why not."""
        if self.load_error is not None:
            return f"model failed to load: {self.load_error}"
        if not self.loaded.is_set():
            return "model loading"
        if not self.runner.alive:
            return f"engine stopped: {self.runner.error}"
        return None

    def _counts(self) -> tuple[int, int] | None:
        return self.runner.counts() if self.runner else None  # no engine yet: no value, not 0

    def _kv_cache_usage(self) -> float | None:
        return self.runner.engine.kv_cache_usage if self.runner else None

    # -- requests ------------------------------------------------------------------------------

    def ensure_ready(self) -> None:
        reason = self.readiness()
        if reason is not None:
            raise NotReady(reason)

    async def encode(self, text: str) -> list[int]:
        """The token ids of `text`. A long text is tokenized on a worker thread: it takes seconds
        at a megabyte, while the event loop goes on answering every other client and the probes."""
        if len(text) <= INLINE_TEXT_CHARS:
            return self.codec.encode(text)
        return await asyncio.get_running_loop().run_in_executor(self._text_pool, self.codec.encode, text)

    async def token_texts(self, ids: list[int]) -> list[str]:
        """Each token's text (a whole context's worth is done on a worker thread)."""
        return await asyncio.get_running_loop().run_in_executor(
            self._text_pool, lambda: [self.codec.token_text(t) for t in ids])

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Handle:
        """Raises QueueFull when the waiting queue is at capacity."""
        return self.runner.submit(prompt_ids, params)

    async def deltas(self, handle: Handle, stop: list[str], span: trace.Span) -> AsyncIterator[Delta]:
        """Text deltas as tokens arrive; the last one carries the finish reason. If the consumer
        stops early (the client went away), the sequence is cancelled and its slot freed."""
        seq, stream = handle.seq, TextStream(self.codec, stop)
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
            if reason == "error":
                raise NotReady(f"engine stopped: {self.runner.error}")
            pending.finish_reason = reason
            yield pending
        finally:
            ended_at = time.monotonic()
            if not seq.finished:
                self.runner.cancel(handle)
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

    async def score(self, ids: list[int]) -> tuple[list[float], float]:
        """(logprob of each token after the first, perplexity over them)."""
        logprobs = await self.runner.score(ids)
        return logprobs, math.exp(-sum(logprobs) / len(logprobs))
