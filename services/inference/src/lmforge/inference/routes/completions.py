"""POST /v1/completions, OpenAI-compatible: the whole completion as one JSON body, or with
`stream` its deltas as server-sent events ending in `data: [DONE]`.

A prompt with too many characters to fit the context is refused before it is tokenized, and
long text is tokenized off the event loop: one large prompt never stalls the other clients or
the probes. The request leases the model current when it starts and uses only it (tokenizer,
context length, engine) until its response ends, so a model swap never mixes two models in one
answer. A client that goes away cancels its sequence and frees its engine slot."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from opentelemetry import trace

from lmforge.common.logging import get_logger
from lmforge.inference.api_errors import ApiError, not_ready
from lmforge.inference.engine import QueueFull
from lmforge.inference.routes.deps import ServiceDep, authorize, ready_model
from lmforge.inference.runner import Handle
from lmforge.inference.sampling import SamplingParams
from lmforge.inference.schemas import Choice, Completion, CompletionRequest, Logprobs, Usage
from lmforge.inference.service import Delta, InferenceService, Lease, NotReady, ServedModel
from lmforge.inference.tracing import trace_id_of

log = get_logger("inference")
router = APIRouter(dependencies=[Depends(authorize)])


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


@dataclass
class Generation:
    """One submitted completion: what answering it, streamed or whole, needs."""

    service: InferenceService
    served: ServedModel
    body: CompletionRequest
    handle: Handle
    span: trace.Span
    request_id: str
    started: float  # time.monotonic()
    context: dict  # the fields of its `completion` log line

    def deltas(self):
        return self.service.deltas(self.served, self.handle, self.body.stop, self.span)

    def log_done(self, finish_reason: str, generated: int) -> None:
        log.info("completion", **self.context, finish_reason=finish_reason, completion_tokens=generated,
                 seconds=round(time.monotonic() - self.started, 4))


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, service: ServiceDep):
    lease = ready_model(service, body.model).lease()
    streaming = False
    try:
        generation = await _submit(service, lease.model, body)
        if body.stream:
            streaming = True  # the response returns the lease when it ends
            return LeasedStreamingResponse(_sse(generation), lease, media_type="text/event-stream",
                                           headers={"Cache-Control": "no-cache"})
        return await _complete(generation, request)
    finally:
        if not streaming:
            lease.release()


async def _submit(service: InferenceService, served: ServedModel, body: CompletionRequest) -> Generation:
    """Check that the prompt and max_tokens fit, tokenize, and queue the sequence on the engine."""
    config = service.config
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
        raise not_ready(exc) from exc
    span = trace.get_current_span()
    request_id = f"cmpl-{uuid.uuid4().hex[:24]}"
    context = dict(request_id=request_id, trace_id=trace_id_of(span), prompt_tokens=len(prompt_ids),
                   max_tokens=body.max_tokens, stream=body.stream)
    return Generation(service, served, body, handle, span, request_id, time.monotonic(), context)


async def _complete(generation: Generation, request: Request):
    """The whole completion as one body; 499 when the client went away before it ended."""
    served, handle = generation.served, generation.handle

    async def cancel_on_disconnect():
        while (await request.receive())["type"] != "http.disconnect":
            pass
        served.runner.cancel(handle)

    watcher = asyncio.create_task(cancel_on_disconnect())
    deltas: list[Delta] = []
    try:
        async with aclosing(generation.deltas()) as stream:
            async for delta in stream:
                deltas.append(delta)
    except NotReady as exc:
        raise ApiError(503, str(exc), "service_unavailable") from exc
    finally:
        watcher.cancel()
    finish_reason = deltas[-1].finish_reason if deltas else "cancelled"
    generated = sum(len(d.token_ids) for d in deltas)
    generation.log_done(finish_reason, generated)
    if finish_reason == "cancelled":
        return JSONResponse({"error": {"message": "client closed the request"}}, status_code=499)
    text = "".join(d.text for d in deltas)
    logprobs = _logprobs(served, deltas, 0) if generation.body.logprobs is not None else None
    prompt_tokens = len(handle.seq.prompt)
    return Completion(id=generation.request_id, created=int(time.time()), model=generation.service.model_name,
                      choices=[Choice(text=text, logprobs=logprobs, finish_reason=finish_reason)],
                      usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=generated,
                                  total_tokens=prompt_tokens + generated))


async def _sse(generation: Generation):
    """The completion's deltas as server-sent events; an engine that stops mid-stream ends it
    with an error event (the 200 status is already sent)."""
    served, body = generation.served, generation.body
    created, offset, generated, finish_reason = int(time.time()), 0, 0, "cancelled"
    try:
        async with aclosing(generation.deltas()) as stream:
            async for delta in stream:
                logprobs = _logprobs(served, [delta], offset) if body.logprobs is not None else None
                offset += len(delta.text)
                generated += len(delta.token_ids)
                finish_reason = delta.finish_reason or finish_reason
                choice = Choice(text=delta.text, logprobs=logprobs, finish_reason=delta.finish_reason)
                yield _event(Completion(id=generation.request_id, created=created,
                                        model=generation.service.model_name, choices=[choice]).model_dump())
        yield "data: [DONE]\n\n"
    except NotReady as exc:
        yield _event({"error": {"message": str(exc), "type": "service_unavailable", "code": 503}})
    finally:
        generation.log_done(finish_reason, generated)


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


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
