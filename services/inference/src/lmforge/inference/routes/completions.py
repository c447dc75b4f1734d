"""POST /v1/completions, OpenAI-compatible: the whole completion as one JSON body, or with
`stream` its deltas as server-sent events ending in `data: [DONE]` (with
`stream_options.include_usage`, a last chunk with empty choices and the usage first).

`prompt` is a string, a batch of strings, token ids or a batch of token-id lists; each prompt
gets `n` choices, choice `prompt_index * n + i`. `echo` puts the prompt before the completion
(token ids as their text, special tokens included), with `logprobs` its tokens' logprobs too
(the first token's null, nothing precedes it); `max_tokens: 0` with `echo` only scores the
prompt (lm-evaluation-harness's loglikelihoods). `logprobs: k` gives each token's top k, and
with 0 the token itself (as OpenAI); `text_offset` is where each token's text starts in the
choice's text.

A prompt with too many characters to fit the context is refused before it is tokenized, and
long text is tokenized off the event loop: one large prompt never stalls the other clients or
the probes."""

from __future__ import annotations

import json
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from lmforge.inference.api_errors import ApiError, not_ready, stream_error_event
from lmforge.inference.engine_client import EngineStopped
from lmforge.inference.routes import generation as gen
from lmforge.inference.routes import trace as tracing
from lmforge.inference.routes.deps import ServiceDep, authorize, ready_model
from lmforge.inference.schemas import Choice, Completion, CompletionRequest, Logprobs
from lmforge.inference.served_model import Lease
from lmforge.inference.service import Delta, NotReady
from lmforge.inference.text import TextOffsets

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


class Echo:
    """Each prompt's text and, with logprobs, its tokens' logprobs (the echoed part of a choice)."""

    def __init__(self, texts: list[str], logprobs: list[Logprobs | None]):
        self.texts, self.logprobs = texts, logprobs


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, service: ServiceDep):
    _refuse(body)
    gen.check_max_tokens(service, body.max_tokens)
    lease = ready_model(service, body.model).lease()
    streaming = False
    try:
        served = lease.model
        gen.check_vocabulary_bounds(served, body, body.logprobs)
        prompts = [await gen.prompt_ids(service, served, p, body.max_tokens) for p in body.prompts()]
        echo = await _echo(service, served, body, prompts) if body.echo else None
        if body.trace:
            tracing.check_trace_request(service, served, body.trace_options)
        job = gen.start(service, served, prompts, body, body.max_tokens, body.logprobs, "cmpl")
        if body.stream:
            streaming = True  # the response returns the lease when it ends
            return LeasedStreamingResponse(_sse(job, body, echo), lease, media_type="text/event-stream",
                                           headers={"Cache-Control": "no-cache"})
        return await _complete(job, request, body, echo)
    finally:
        if not streaming:
            lease.release()


def _refuse(body: CompletionRequest) -> None:
    if body.suffix is not None:
        raise ApiError(400, "suffix: not supported (this server does no fill-in-the-middle)", param="suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise ApiError(400, f"best_of: only equal to n ({body.n}) is supported", param="best_of")
    if body.max_tokens == 0 and not body.echo:
        raise ApiError(400, "max_tokens: 0 only with echo (scoring the prompt)", param="max_tokens")
    gen.refuse_unsupported(body)


async def _echo(service, served, body: CompletionRequest, prompts: list[list[int]]) -> Echo:
    texts = [p if isinstance(p, str) else served.codec.decode(p, skip_special_tokens=False) for p in body.prompts()]
    if body.logprobs is None:
        return Echo(texts, [None] * len(prompts))
    logprobs = []
    for text, ids in zip(texts, prompts, strict=True):
        try:
            chosen, tops = await served.engine.prompt_logprobs(ids, body.logprobs)
        except EngineStopped as exc:
            raise not_ready(NotReady(f"engine stopped: {exc}")) from exc
        tokens = [served.codec.token_text(t) for t in ids]
        top_texts = [{served.codec.token_text(t): lp for t, lp in top.items()} for top in tops]
        offsets = TextOffsets(served.codec, skip_special_tokens=False).feed(ids)
        logprobs.append(Logprobs(tokens=tokens, token_logprobs=[None, *chosen],
                                 top_logprobs=[None, *_tops(body.logprobs, tokens[1:], chosen, top_texts)],
                                 text_offset=[min(o, len(text)) for o in offsets]))
    return Echo(texts, logprobs)


def _tops(k: int, tokens: list[str], chosen: list[float], tops: list[dict[str, float]]) -> list[dict[str, float]]:
    """Each position's top k; with k 0 the chosen token alone (OpenAI's `logprobs: 0`)."""
    return tops if k else [{token: logprob} for token, logprob in zip(tokens, chosen, strict=True)]


def _logprobs(served, deltas: list[Delta], k: int, offsets: TextOffsets, text_length: int) -> Logprobs:
    """Generated tokens' logprobs; their offsets (from `offsets`, fed in order) end at the text so
    far, `text_length` (a token cut off by a stop string starts where the text ends)."""
    tokens, chosen, tops = gen.token_logprobs(served, deltas)
    ids = [t for d in deltas for t in d.token_ids]
    return Logprobs(tokens=tokens, token_logprobs=chosen, top_logprobs=_tops(k, tokens, chosen, tops),
                    text_offset=[min(o, text_length) for o in offsets.feed(ids)])


def _joined(echoed: Logprobs, generated: Logprobs) -> Logprobs:
    return Logprobs(tokens=echoed.tokens + generated.tokens,
                    token_logprobs=echoed.token_logprobs + generated.token_logprobs,
                    top_logprobs=echoed.top_logprobs + generated.top_logprobs,
                    text_offset=echoed.text_offset + generated.text_offset)


async def _complete(job: gen.Job, request: Request, body: CompletionRequest, echo: Echo | None):
    """The whole completion as one body; 499 when the client went away before it ended."""
    deltas = await gen.collect(job, request)
    if deltas is None:
        return JSONResponse({"error": {"message": "client closed the request"}}, status_code=499)
    choices = []
    for generation, choice_deltas in zip(job.generations, deltas, strict=True):
        prefix = echo.texts[generation.prompt] if echo else ""
        text = prefix + "".join(d.text for d in choice_deltas)
        logprobs = None
        if body.logprobs is not None:
            offsets = TextOffsets(job.served.codec, start=len(prefix))
            logprobs = _logprobs(job.served, choice_deltas, body.logprobs, offsets, len(text))
            if echo:
                logprobs = _joined(echo.logprobs[generation.prompt], logprobs)
        choices.append(Choice(index=generation.index, text=text, logprobs=logprobs,
                              finish_reason=generation.finish_reason))
    if body.trace:
        generated = [[t for d in ds for t in d.token_ids] for ds in deltas]
        traces = await tracing.trace_choices(job.service, job.served, generated, body.trace_options)
        for choice, traced in zip(choices, traces, strict=True):
            choice.trace = traced
    return Completion(id=job.request_id, created=job.created, model=job.service.model_name, choices=choices,
                      usage=job.usage())


async def _sse(job: gen.Job, body: CompletionRequest, echo: Echo | None):
    """The choices' deltas as server-sent events (an echoed prompt first, in each choice's first
    chunk); an engine that stops mid-stream ends it with an error event (the 200 status is sent)."""
    lengths = [0] * len(job.generations)  # of each choice's text so far
    generated: list[list[int]] = [[] for _ in job.generations]  # each choice's tokens, to trace at the end

    def chunk(choice: Choice) -> str:
        return sse_event(Completion(id=job.request_id, created=job.created, model=job.service.model_name,
                                 choices=[choice]).model_dump())

    try:
        if echo is not None:
            for generation in job.generations:
                text = echo.texts[generation.prompt]
                lengths[generation.index] = len(text)
                yield chunk(Choice(index=generation.index, text=text, logprobs=echo.logprobs[generation.prompt]))
        offsets = [TextOffsets(job.served.codec, start=length) for length in lengths]
        async with aclosing(gen.merged(job)) as stream:
            async for generation, delta in stream:
                lengths[generation.index] += len(delta.text)
                generated[generation.index] += delta.token_ids
                logprobs = None
                if body.logprobs is not None:
                    logprobs = _logprobs(job.served, [delta], body.logprobs, offsets[generation.index],
                                         lengths[generation.index])
                yield chunk(Choice(index=generation.index, text=delta.text, logprobs=logprobs,
                                   finish_reason=delta.finish_reason))
        if body.trace:  # one chunk with every choice's trace, after their last text and before the usage
            traces = await tracing.trace_choices(job.service, job.served, generated, body.trace_options)
            yield sse_event(Completion(id=job.request_id, created=job.created, model=job.service.model_name,
                                       choices=[Choice(index=i, text="", trace=t) for i, t in enumerate(traces)]
                                       ).model_dump())
        if body.stream_options is not None and body.stream_options.include_usage:
            yield sse_event(Completion(id=job.request_id, created=job.created, model=job.service.model_name,
                                    choices=[], usage=job.usage()).model_dump())
        yield "data: [DONE]\n\n"
    except NotReady as exc:
        yield sse_event(stream_error_event(exc))
    finally:
        job.log_done()


def sse_event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
