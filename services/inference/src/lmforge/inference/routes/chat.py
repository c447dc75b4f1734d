"""POST /v1/chat/completions, OpenAI-compatible: the messages rendered into one prompt by the
model package's chat template (tokenizer_config.json's `chat_template`, rendered as transformers
does, ending where the assistant's answer begins), then generated as /v1/completions does. A
package without a template is answered 400. `stream` sends `chat.completion.chunk` events with
a `delta`: the role first, then the content as it arrives, the finish reason last."""

from __future__ import annotations

from contextlib import aclosing

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from lmforge.inference.api_errors import ApiError, stream_error_event
from lmforge.inference.chat_template import ChatTemplateError
from lmforge.inference.routes import generation as gen
from lmforge.inference.routes import trace as tracing
from lmforge.inference.routes.completions import LeasedStreamingResponse, sse_event
from lmforge.inference.routes.deps import ServiceDep, authorize, ready_model
from lmforge.inference.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    ChatRequest,
    ChosenTokenLogprob,
    TokenLogprob,
    Usage,
)
from lmforge.inference.service import Delta, NotReady, ServedModel

router = APIRouter(dependencies=[Depends(authorize)])


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatRequest, request: Request, service: ServiceDep):
    gen.refuse_unsupported(body)
    if body.max_tokens == 0:
        raise ApiError(400, "max_tokens: at least 1", param="max_tokens")
    requested = body.max_completion_tokens or body.max_tokens
    if requested is not None:
        gen.check_max_tokens(service, requested)
    lease = ready_model(service, body.model).lease()
    streaming = False
    try:
        served = lease.model
        top = (body.top_logprobs or 0) if body.logprobs else None
        gen.check_vocabulary_bounds(served, body, top, "top_logprobs")
        ids = await gen.prompt_ids(service, served, _prompt(served, body), requested or 0, param="messages")
        # Without a max_tokens: as much as the context leaves, up to the server's limit.
        max_tokens = requested or min(service.config.max_tokens_limit, served.context_length - len(ids))
        if max_tokens < 1:
            raise ApiError(400, f"messages: {len(ids)} prompt tokens leave no room in the model's context of "
                                f"{served.context_length} tokens", param="messages")
        if body.trace:
            tracing.check_trace_request(service, served, body.trace_options)
        job = gen.start(service, served, [ids], body, max_tokens, top, "chatcmpl")
        if body.stream:
            streaming = True  # the response returns the lease when it ends
            return LeasedStreamingResponse(_sse(job, body), lease, media_type="text/event-stream",
                                           headers={"Cache-Control": "no-cache"})
        return await _complete(job, request, body)
    finally:
        if not streaming:
            lease.release()


def _prompt(served: ServedModel, body: ChatRequest) -> str:
    template = served.codec.chat_template
    if template is None:
        raise ApiError(400, "messages: this model has no chat template (its tokenizer_config.json has no "
                            "chat_template); use /v1/completions", param="messages")
    try:
        messages = [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})}
                    for m in body.messages]
        return template.render(messages)
    except (ValueError, ChatTemplateError) as exc:  # ChatTemplateError is a ValueError
        raise ApiError(400, f"messages: {exc}", param="messages") from exc


def _logprobs(served: ServedModel, deltas: list[Delta], body: ChatRequest) -> ChatLogprobs | None:
    if not body.logprobs:
        return None
    tokens, chosen, tops = gen.token_logprobs(served, deltas)
    tops = tops or [{}] * len(tokens)
    return ChatLogprobs(content=[
        ChosenTokenLogprob(token=token, logprob=logprob, bytes=_utf8(token),
                           top_logprobs=[TokenLogprob(token=t, logprob=lp, bytes=_utf8(t)) for t, lp in top.items()])
        for token, logprob, top in zip(tokens, chosen, tops, strict=True)])


def _utf8(token: str) -> list[int]:
    return list(token.encode("utf-8"))


def _chunk(job: gen.Job, choices: list[ChatChunkChoice], usage: Usage | None = None) -> str:
    return sse_event(ChatCompletionChunk(id=job.request_id, created=job.created, model=job.service.model_name,
                                         choices=choices, usage=usage).model_dump())


async def _complete(job: gen.Job, request: Request, body: ChatRequest):
    deltas = await gen.collect(job, request)
    if deltas is None:
        return JSONResponse({"error": {"message": "client closed the request"}}, status_code=499)
    choices = [ChatChoice(index=g.index, message=AssistantMessage(content="".join(d.text for d in ds)),
                          logprobs=_logprobs(job.served, ds, body), finish_reason=g.finish_reason)
               for g, ds in zip(job.generations, deltas, strict=True)]
    if body.trace:
        generated = [[t for d in ds for t in d.token_ids] for ds in deltas]
        traces = await tracing.trace_choices(job.service, job.served, generated, body.trace_options)
        for choice, traced in zip(choices, traces, strict=True):
            choice.trace = traced
    return ChatCompletion(id=job.request_id, created=job.created, model=job.service.model_name, choices=choices,
                          usage=job.usage())


async def _sse(job: gen.Job, body: ChatRequest):
    generated: list[list[int]] = [[] for _ in job.generations]  # each choice's tokens, to trace at the end
    try:
        for generation in job.generations:
            yield _chunk(job, [ChatChunkChoice(index=generation.index, delta=ChatDelta(role="assistant", content=""))])
        async with aclosing(gen.merged(job)) as stream:
            async for generation, delta in stream:
                generated[generation.index] += delta.token_ids
                yield _chunk(job, [ChatChunkChoice(index=generation.index, delta=ChatDelta(content=delta.text or None),
                                                   logprobs=_logprobs(job.served, [delta], body),
                                                   finish_reason=delta.finish_reason)])
        if body.trace:  # one chunk with every choice's trace, after their last content and before the usage
            traces = await tracing.trace_choices(job.service, job.served, generated, body.trace_options)
            yield _chunk(job, [ChatChunkChoice(index=i, delta=ChatDelta(), trace=t) for i, t in enumerate(traces)])
        if body.stream_options is not None and body.stream_options.include_usage:
            yield _chunk(job, [], job.usage())
        yield "data: [DONE]\n\n"
    except NotReady as exc:
        yield sse_event(stream_error_event(exc))
    finally:
        job.log_done()

