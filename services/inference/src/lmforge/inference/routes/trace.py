"""POST /v1/trace: the spans of a text (or of token ids) found verbatim in the training data, each with how often
it occurs there and up to `max_documents` of the documents it comes from (URL, WARC record id, a snippet);
OLMoTrace's search (lmforge.trace.query) over the index data prep built (trace_runner.py).

The text is tokenized with the served model's tokenizer, which must be the one the index was built with (its
sha256 is in the index's manifest): otherwise the route answers 503 and says so. The standalone trace service
beside vLLM (trace_service.py) serves this same router over the index's own tokenizer: the app says where the
tokenizer comes from as `app.state.trace_tokenizer`, a context manager factory taking the request's `model`.

Statuses: 404 `trace_not_enabled` (the server has no trace.index), 503 while the index loads, when it failed to
or on a tokenizer mismatch, 413 for more than trace.max_tokens tokens, 400 for invalid fields (token ids outside
the vocabulary, max_documents over trace.max_documents: as every route of this API), 429 when
trace.max_concurrent searches are running, 504 after trace.timeout_s.

`traced()` is also what `trace: true` on completions calls for each choice's generated tokens."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from fastapi import APIRouter, Depends, Request

from lmforge.common.logging import get_logger
from lmforge.inference.api_errors import ApiError, error_body
from lmforge.inference.routes.deps import authorize, ready_model
from lmforge.inference.schemas import TraceOptions, TraceRequest, TraceResponse
from lmforge.inference.service import INLINE_TEXT_CHARS, InferenceService, ServedModel
from lmforge.inference.text import Codec
from lmforge.inference.trace_runner import TraceBusy, TraceRunner, TraceTimeout
from lmforge.trace.query import trace_tokens

router = APIRouter(dependencies=[Depends(authorize)])
DEFAULT_DOCUMENTS = 10  # per span, when the request does not say (at most trace.max_documents)
log = get_logger("inference")

# the trace latency histogram's `outcome` of a refused trace, by status ("ok" when answered; anything else "error")
OUTCOMES = {400: "invalid", 413: "too_long", 429: "busy", 503: "unavailable", 504: "timeout"}


@dataclass(frozen=True)
class TraceTokenizer:
    """The tokenizer a request's text is traced with, and the model name the answer carries."""

    codec: Codec
    sha256: str | None
    model_name: str


TokenizerSource = Callable[[str | None], contextlib.AbstractContextManager[TraceTokenizer]]


def served_tokenizer(service: InferenceService) -> TokenizerSource:
    """The inference server's: the served model's tokenizer (the model leased for the request's length)."""

    @contextlib.contextmanager
    def lease(model: str | None) -> Iterator[TraceTokenizer]:
        with ready_model(service, model).lease() as served:
            yield TraceTokenizer(served.codec, served.tokenizer_sha256, service.model_name)

    return lease


def not_enabled() -> ApiError:
    return ApiError(404, "this server traces nothing: it has no trace index (trace.index)", code="trace_not_enabled")


def unavailable(runner: TraceRunner, tokenizer: TraceTokenizer) -> ApiError | None:
    """503 while the index cannot serve this model's traces, with the reason."""
    reason = runner.readiness(tokenizer.sha256)
    if reason is None:
        return None
    loading = runner.index is None and runner.load_error is None
    return ApiError(503, reason, "service_unavailable", headers={"Retry-After": "5"} if loading else None,
                    code="trace_index_loading" if loading else "trace_index_unavailable")


@router.post("/v1/trace", response_model=TraceResponse)
async def trace(body: TraceRequest, request: Request) -> TraceResponse:
    runner: TraceRunner | None = request.app.state.trace
    if runner is None:
        raise not_enabled()
    started = time.monotonic()
    try:
        with request.app.state.trace_tokenizer(body.model) as tokenizer:
            ids = await _input_ids(runner, tokenizer, body)
            result = await traced(runner, tokenizer, ids, body, started=started)
    except Exception as error:  # counted, then answered as always (api_errors)
        outcome = OUTCOMES.get(error.status, "error") if isinstance(error, ApiError) else "error"
        runner.metrics.observe(outcome, time.monotonic() - started)
        raise
    return TraceResponse.model_validate({**result, "object": "trace", "model": tokenizer.model_name})


async def _input_ids(runner: TraceRunner, tokenizer: TraceTokenizer, body: TraceRequest) -> list[int]:
    limit = runner.config.max_tokens
    if body.token_ids is not None:
        ids = body.token_ids
    else:
        codec = tokenizer.codec
        if not codec.may_fit(body.text, limit):
            raise ApiError(413, f"text: {len(body.text)} characters make more than trace.max_tokens {limit} tokens (a "
                                f"token spans at most {codec.max_chars_per_token} characters)", param="text",
                           code="trace_input_too_long")
        long = len(body.text) > INLINE_TEXT_CHARS  # tokenized off the event loop, as completions' prompts are
        ids = await asyncio.to_thread(codec.encode, body.text) if long else codec.encode(body.text)
    if len(ids) > limit:
        param = "text" if body.token_ids is None else "token_ids"
        raise ApiError(413, f"{param}: {len(ids)} tokens; a trace takes at most trace.max_tokens {limit}", param=param,
                       code="trace_input_too_long")
    return ids


async def traced(runner: TraceRunner, tokenizer: TraceTokenizer, ids: list[int], options: TraceOptions,
                 started: float | None = None) -> dict:
    """The trace of `ids` (lmforge.trace's TraceResult.to_dict()), or the ApiError that says why not (the caller
    counts it in the metrics: OUTCOMES)."""
    started = time.monotonic() if started is None else started
    config = runner.config
    error = unavailable(runner, tokenizer)
    if error is not None:
        raise error
    index = runner.index
    documents = min(DEFAULT_DOCUMENTS, config.max_documents) if options.max_documents is None else options.max_documents
    if documents > config.max_documents:
        raise ApiError(400, f"max_documents: at most trace.max_documents {config.max_documents}",
                       param="max_documents")
    bad = next((t for t in ids if t >= index.vocab_size), None)
    if bad is not None:
        raise ApiError(400, f"token_ids: token id {bad} is outside the vocabulary (0 to {index.vocab_size - 1})",
                       param="token_ids")

    def search():
        return trace_tokens(index, ids, min_span_tokens=options.min_span_tokens or config.min_span_tokens,
                            max_documents=documents, span_density=options.span_density,
                            max_count=config.max_count, snippet_tokens=config.snippet_tokens,
                            decode=tokenizer.codec.decode)

    try:
        result = await runner.run(search)
    except TraceBusy as exc:
        raise ApiError(429, f"trace busy: {exc}; retry later", "rate_limit_error", headers={"Retry-After": "1"},
                       code="trace_busy") from exc
    except TraceTimeout as exc:
        raise ApiError(504, f"{exc}; trace a shorter text", "timeout_error", code="trace_timeout") from exc
    runner.metrics.observe("ok", time.monotonic() - started, spans=len(result.spans))
    return result.to_dict()


# -- `trace: true` on /v1/completions and /v1/chat/completions -----------------------------------------------------


def check_trace_request(service: InferenceService, served: ServedModel, options: TraceOptions | None) -> None:
    """Before generating for a request with `trace: true`: the errors /v1/trace would give for any text (no index,
    the index not ready or built for another tokenizer, too many documents asked for), so no generation is wasted."""
    runner = service.trace
    if runner is None:
        raise not_enabled()
    error = unavailable(runner, TraceTokenizer(served.codec, served.tokenizer_sha256, service.model_name))
    if error is not None:
        raise error
    options = options or TraceOptions()
    if options.max_documents is not None and options.max_documents > runner.config.max_documents:
        raise ApiError(400, f"trace_options.max_documents: at most trace.max_documents {runner.config.max_documents}",
                       param="trace_options.max_documents")


async def trace_choices(service: InferenceService, served: ServedModel, generated: list[list[int]],
                        options: TraceOptions | None) -> list[dict]:
    """Each choice's trace, of its generated tokens (the first trace.max_tokens of them: the trace's `tokens`):
    span positions count the choice's generated tokens, an echoed prompt not included. A trace that cannot be
    made now (busy, too slow) is that choice's `{"error": …}`; the completion itself stands."""
    runner = service.trace
    tokenizer = TraceTokenizer(served.codec, served.tokenizer_sha256, service.model_name)
    traces = []
    for ids in generated:
        started = time.monotonic()
        try:
            traces.append(await traced(runner, tokenizer, ids[:runner.config.max_tokens], options or TraceOptions()))
        except ApiError as error:
            runner.metrics.observe(OUTCOMES.get(error.status, "error"), time.monotonic() - started)
            traces.append(error_body(error.message, error.type, code=error.code))
        except Exception as exc:  # noqa: BLE001 - an engine failure after generation: the completion stands
            log.error("trace_failed", error=str(exc), kind=type(exc).__name__, exc_info=True)
            runner.metrics.observe("error", time.monotonic() - started)
            traces.append(error_body(f"the trace failed: {exc}", "server_error", code="trace_failed"))
    return traces
