"""The HTTP layer (FastAPI): OpenAI-compatible completions with SSE streaming, scoring, model
list, health, readiness and metrics. It validates, authenticates and translates; generation
itself is the service's and the engine's business.

Errors are OpenAI-shaped, `{"error": {"message", "type", "param", "code"}}`, and never carry
a stack trace: 400 bad JSON or a prompt that does not fit, 401 no valid key, 404 unknown
model, 413 body too large, 422 invalid fields, 429 queue full (with Retry-After), 503 not
ready; anything unexpected is logged with its trace id and answered 500.

A prompt with too many characters to fit the context is refused before it is tokenized, and
long text is tokenized off the event loop: one large prompt never stalls the other clients or
the probes.

Each request leases the model that is current when it starts and uses only it (its tokenizer,
context length and engine) until its response ends, so a model swap (model_swap) never mixes
two models in one answer."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import aclosing
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from opentelemetry import trace
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from lmforge.common.logging import get_logger
from lmforge.inference.auth import ApiKeys
from lmforge.inference.engine import QueueFull
from lmforge.inference.sampling import SamplingParams
from lmforge.inference.schemas import Choice, Completion, CompletionRequest, Logprobs, Score, ScoreRequest, Usage
from lmforge.inference.service import Delta, InferenceService, Lease, NotReady, ServedModel
from lmforge.inference.tracing import trace_id_of

log = get_logger("inference")


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.headers = status, message, type_, param, headers


def error_response(status: int, message: str, type_: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": param, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


class BodyLimit:
    """413 for a request body over `limit` bytes, by Content-Length or as it streams in. The
    body is read here first (it is small by then) and replayed to the app, whose own body
    parsing would otherwise turn the refusal into a generic 400."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._reject(scope, receive, send)
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away mid-body
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                return await self._reject(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope, receive, send):
        response = error_response(413, f"request body larger than {self.limit} bytes", "invalid_request_error")
        await response(scope, receive, send)


class LeasedStreamingResponse(StreamingResponse):
    """A stream that returns its request's model lease when it ends, however it ends (a client
    gone before the first byte included)."""

    def __init__(self, content, lease: Lease, **kwargs):
        super().__init__(content, **kwargs)
        self.lease = lease

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.lease.release()


class CountRequests:
    """lmforge_inference_requests_total{status} for every /v1/ request, whatever answered it (the
    outermost middleware, so the body limit's 413 counts too): an exception is a 500, a request
    that ended with no response at all (its client went away mid-body) a 499."""

    def __init__(self, app, service: InferenceService):
        self.app, self.service = app, service

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        status: int | None = None

        async def recording_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        except Exception:  # a cancellation (client gone, shutdown) is not a server error: it stays 499
            status = status or 500
            raise
        finally:
            self.service.metrics.observe_request(status or 499)


def create_app(service: InferenceService) -> FastAPI:
    config = service.config
    docs = config.api_docs  # the API's description, served without authentication when on
    app = FastAPI(title="lmforge inference", version="0.1.0", openapi_url="/openapi.json" if docs else None,
                  docs_url="/docs" if docs else None, redoc_url="/redoc" if docs else None)
    api_keys = ApiKeys(config.api_keys_file) if config.api_keys_file else None

    def authorize(request: Request) -> None:
        if api_keys is not None and not api_keys.check(request.headers.get("authorization")):
            raise ApiError(401, "a valid API key is required: Authorization: Bearer <key>",
                           "authentication_error", headers={"WWW-Authenticate": "Bearer"})

    def ready_model(model: str | None) -> ServedModel:
        """The current model, if it is ready and `model` (when given) is its name."""
        try:
            served = service.ensure_ready()
        except NotReady as exc:
            raise ApiError(503, str(exc), "service_unavailable", headers={"Retry-After": "5"}) from exc
        if model is not None and model != service.model_name:
            raise ApiError(404, f"model {model!r} not found; this server serves {service.model_name!r}",
                           "not_found_error", "model")
        return served

    # -- errors --------------------------------------------------------------------------------

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return error_response(exc.status, exc.message, exc.type, exc.param, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        if any(e["type"] == "json_invalid" for e in errors):
            return error_response(400, "the request body is not valid JSON: " + errors[0].get("msg", ""),
                                  "invalid_request_error")
        problems = []
        for e in errors:
            where = ".".join(str(p) for p in e["loc"] if p != "body") or "body"
            problems.append(f"{where}: {e['msg']}")
        first = [str(p) for p in errors[0]["loc"] if p != "body"] if errors else []
        return error_response(422, "; ".join(problems), "invalid_request_error", ".".join(first) or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail), "invalid_request_error")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        trace_id = trace_id_of(trace.get_current_span())
        log.error("request_failed", path=request.url.path, trace_id=trace_id, error=repr(exc), exc_info=True)
        return error_response(500, f"internal error (trace id {trace_id})", "server_error")

    # -- health and metrics ---------------------------------------------------------------------

    @app.get("/healthz")
    def healthz():
        return {"status": "alive"}

    @app.get("/readyz")
    def readyz():
        served = service.model
        reason = service.readiness(served)
        if reason is not None:
            return JSONResponse({"status": "not ready", "reason": reason}, status_code=503)
        return {"status": "ready", "model": service.model_name, "package": served.package}

    if config.metrics_port is None:
        @app.get("/metrics")
        def metrics():
            return PlainTextResponse(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # -- the API --------------------------------------------------------------------------------

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    def models():
        served = ready_model(None)
        return {"object": "list", "data": [{
            "id": service.model_name, "object": "model", "created": int(served.loaded_at), "owned_by": "lmforge",
            "root": served.package, "max_model_len": served.context_length}]}

    @app.post("/v1/completions", dependencies=[Depends(authorize)])
    async def completions(body: CompletionRequest, request: Request):
        lease = ready_model(body.model).lease()
        streaming = False
        try:
            response = await _completion(lease, body, request)
            streaming = isinstance(response, LeasedStreamingResponse)  # it returns the lease when it ends
            return response
        finally:
            if not streaming:
                lease.release()

    async def _completion(lease: Lease, body: CompletionRequest, request: Request):
        served = lease.model
        if body.max_tokens > config.max_tokens_limit:
            raise ApiError(422, f"max_tokens: at most {config.max_tokens_limit} (got {body.max_tokens})",
                           param="max_tokens")
        room = served.context_length - body.max_tokens
        if not served.codec.may_fit(body.prompt, room):
            raise ApiError(400, f"prompt: {len(body.prompt)} characters make more than {max(room, 0)} tokens (a token "
                                f"spans at most {served.codec.max_chars_per_token} characters), all that max_tokens "
                                f"{body.max_tokens} leaves of the model's context of {served.context_length} tokens",
                           param="prompt")
        prompt_ids = await service.encode(served, body.prompt)
        if len(prompt_ids) + body.max_tokens > served.context_length:
            raise ApiError(400, f"prompt: {len(prompt_ids)} prompt tokens + max_tokens {body.max_tokens} exceed "
                                f"the model's context of {served.context_length} tokens", param="prompt")
        params = SamplingParams(max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p,
                                seed=body.seed, logprobs=body.logprobs)
        try:
            handle = service.submit(served, prompt_ids, params)
        except QueueFull as exc:
            raise ApiError(429, f"server busy: {exc}; retry later", "rate_limit_error",
                           headers={"Retry-After": str(config.retry_after_seconds)}) from exc
        except NotReady as exc:
            raise ApiError(503, str(exc), "service_unavailable", headers={"Retry-After": "5"}) from exc
        span = trace.get_current_span()
        request_id = f"cmpl-{uuid.uuid4().hex[:24]}"
        started = time.monotonic()
        context = dict(request_id=request_id, trace_id=trace_id_of(span), prompt_tokens=len(prompt_ids),
                       max_tokens=body.max_tokens, stream=body.stream)
        if body.stream:
            return LeasedStreamingResponse(_sse(service, served, body, handle, span, request_id, started, context),
                                           lease, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return await _complete(service, served, body, handle, span, request, request_id, started, context)

    @app.post("/v1/score", dependencies=[Depends(authorize)])
    async def score(body: ScoreRequest):
        with ready_model(body.model).lease() as served:
            if not served.codec.may_fit(body.text, served.context_length):
                raise ApiError(400, f"text: {len(body.text)} characters make more than {served.context_length} "
                                    f"tokens (a token spans at most {served.codec.max_chars_per_token} characters); "
                                    f"scoring needs 2 to {served.context_length}", param="text")
            ids = await service.encode(served, body.text)
            if not 2 <= len(ids) <= served.context_length:
                raise ApiError(400, f"text: has {len(ids)} tokens; scoring needs 2 to {served.context_length}",
                               param="text")
            try:
                logprobs, perplexity = await service.score(served, ids)
            except NotReady as exc:
                raise ApiError(503, str(exc), "service_unavailable", headers={"Retry-After": "5"}) from exc
            return Score(model=service.model_name, tokens=await service.token_texts(served, ids), token_ids=ids,
                         token_logprobs=[None, *logprobs], total_logprob=sum(logprobs), perplexity=perplexity)

    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    app.add_middleware(CountRequests, service=service)  # added last: the outermost
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(app, tracer_provider=service.tracer_provider,
                                       excluded_urls="healthz,readyz,metrics", exclude_spans=["receive", "send"])
    return app


def _logprobs(served: ServedModel, deltas: list[Delta], offset: int) -> Logprobs:
    tokens, offsets = [], []
    for delta in deltas:
        for token in delta.token_ids:
            tokens.append(served.codec.token_text(token))
            offsets.append(offset)
            offset += len(tokens[-1])
    tops = [{served.codec.token_text(t): lp for t, lp in top.items()} for d in deltas for top in d.top_logprobs]
    return Logprobs(tokens=tokens, token_logprobs=[lp for d in deltas for lp in d.logprobs],
                    top_logprobs=tops or None, text_offset=offsets)


async def _complete(service, served, body, handle, span, request: Request, request_id, started, context):
    async def cancel_on_disconnect():
        while (await request.receive())["type"] != "http.disconnect":
            pass
        served.runner.cancel(handle)

    watcher = asyncio.create_task(cancel_on_disconnect())
    deltas: list[Delta] = []
    try:
        async with aclosing(service.deltas(served, handle, body.stop, span)) as stream:
            async for delta in stream:
                deltas.append(delta)
    except NotReady as exc:
        raise ApiError(503, str(exc), "service_unavailable") from exc
    finally:
        watcher.cancel()
    finish_reason = deltas[-1].finish_reason if deltas else "cancelled"
    generated = sum(len(d.token_ids) for d in deltas)
    _log_done(context, finish_reason, generated, started)
    if finish_reason == "cancelled":
        return JSONResponse({"error": {"message": "client closed the request"}}, status_code=499)
    text = "".join(d.text for d in deltas)
    logprobs = _logprobs(served, deltas, 0) if body.logprobs is not None else None
    return Completion(id=request_id, created=int(time.time()), model=service.model_name,
                      choices=[Choice(text=text, logprobs=logprobs, finish_reason=finish_reason)],
                      usage=Usage(prompt_tokens=len(handle.seq.prompt), completion_tokens=generated,
                                  total_tokens=len(handle.seq.prompt) + generated))


async def _sse(service, served, body, handle, span, request_id, started, context):
    created, offset, generated, finish_reason = int(time.time()), 0, 0, "cancelled"
    try:
        async with aclosing(service.deltas(served, handle, body.stop, span)) as stream:
            async for delta in stream:
                logprobs = _logprobs(served, [delta], offset) if body.logprobs is not None else None
                offset += len(delta.text)
                generated += len(delta.token_ids)
                finish_reason = delta.finish_reason or finish_reason
                choice = Choice(text=delta.text, logprobs=logprobs, finish_reason=delta.finish_reason)
                yield _event(Completion(id=request_id, created=created, model=service.model_name,
                                        choices=[choice]).model_dump())
        yield "data: [DONE]\n\n"
    except NotReady as exc:
        yield _event({"error": {"message": str(exc), "type": "service_unavailable", "code": 503}})
    finally:
        _log_done(context, finish_reason, generated, started)


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _log_done(context: dict, finish_reason: str, generated: int, started: float) -> None:
    log.info("completion", **context, finish_reason=finish_reason, completion_tokens=generated,
             seconds=round(time.monotonic() - started, 4))
