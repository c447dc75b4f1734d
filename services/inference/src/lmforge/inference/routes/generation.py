"""What /v1/completions and /v1/chat/completions share: a request's prompts (text or token ids)
checked and tokenized, its choices (n per prompt) queued on the engine, and their deltas
gathered whole or merged as they arrive for a stream.

A request uses the model it leased when it started (tokenizer, context length, engine) until its
response ends. A client that goes away cancels every sequence of its request."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

from fastapi import Request
from opentelemetry import trace

from lmforge.common.logging import get_logger
from lmforge.inference.api_errors import ApiError, not_ready
from lmforge.inference.engine import QueueFull
from lmforge.inference.engine_client import Handle
from lmforge.inference.sampling import SamplingParams
from lmforge.inference.schemas import SamplingFields, Usage
from lmforge.inference.service import Delta, InferenceService, NotReady, ServedModel
from lmforge.inference.tracing import trace_id_of

log = get_logger("inference")


def refuse_unsupported(body: SamplingFields) -> None:
    problem = body.unsupported()
    if problem is not None:
        raise ApiError(400, problem[1], param=problem[0])


def check_max_tokens(service: InferenceService, max_tokens: int) -> None:
    limit = service.config.max_tokens_limit
    if max_tokens > limit:
        raise ApiError(400, f"max_tokens: at most {limit} (got {max_tokens})", param="max_tokens")


def vocabulary(served: ServedModel) -> int:
    """How many token ids both the tokenizer and the model know (ids 0 to this - 1)."""
    return min(served.codec.vocab_size, served.engine.info.vocab_size)


def check_vocabulary_bounds(served: ServedModel, body: SamplingFields, logprobs: int | None,
                            logprobs_param: str = "logprobs") -> None:
    """The bounds that depend on the model, checked before anything reaches its engine: top_k,
    the top logprobs asked for and logit_bias's token ids within the vocabulary."""
    vocab = vocabulary(served)
    if body.top_k > vocab:
        raise ApiError(400, f"top_k: at most the vocabulary's {vocab} tokens (got {body.top_k}; -1 or 0: off)",
                       param="top_k")
    if logprobs is not None and logprobs > vocab:
        raise ApiError(400, f"{logprobs_param}: at most the vocabulary's {vocab} tokens (got {logprobs})",
                       param=logprobs_param)
    bad = next((token for token, _ in body.biases() if token >= vocab), None)
    if bad is not None:
        raise ApiError(400, f"logit_bias: token id {bad} is outside the vocabulary (0 to {vocab - 1})",
                       param="logit_bias")


async def prompt_ids(service: InferenceService, served: ServedModel, prompt: str | list[int], max_tokens: int,
                     param: str = "prompt") -> list[int]:
    """The prompt's token ids, checked against the vocabulary and the context: with max_tokens
    0 (scoring an echoed prompt) it may fill the context, else it must leave max_tokens."""
    room = served.context_length - max_tokens
    if isinstance(prompt, str):
        if not served.codec.may_fit(prompt, room):
            raise ApiError(400, f"{param}: {len(prompt)} characters make more than {max(room, 0)} tokens (a "
                                f"token spans at most {served.codec.max_chars_per_token} characters), all that "
                                f"max_tokens {max_tokens} leaves of the model's context of "
                                f"{served.context_length} tokens", param=param)
        ids = await service.encode(served, prompt)
        if not ids:
            raise ApiError(400, f"{param}: makes no tokens", param=param)
    else:
        vocab = vocabulary(served)
        bad = next((t for t in prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise ApiError(400, f"{param}: token id {bad} is outside the vocabulary (0 to {vocab - 1})", param=param)
        ids = list(prompt)
    if len(ids) + max_tokens > served.context_length:
        raise ApiError(400, f"{param}: {len(ids)} prompt tokens + max_tokens {max_tokens} exceed the model's "
                            f"context of {served.context_length} tokens", param=param)
    return ids


@dataclass
class Generation:
    """One choice: a prompt's continuation (none with max_tokens 0)."""

    index: int
    prompt: int  # which prompt of the request
    handle: Handle | None
    finish_reason: str = "cancelled"
    generated: int = 0


@dataclass
class Job:
    """One request's choices, in order: prompt 0's n choices, then prompt 1's, …"""

    service: InferenceService
    served: ServedModel
    prompts: list[list[int]]
    generations: list[Generation]
    stop: list[str]
    span: trace.Span
    request_id: str
    started: float  # time.monotonic()
    context: dict  # the fields of its `completion` log line
    created: int = field(default_factory=lambda: int(time.time()))

    def deltas(self, generation: Generation) -> AsyncIterator[Delta]:
        if generation.handle is None:
            return _nothing_generated()
        return self.service.deltas(self.served, generation.handle, self.stop, self.span)

    def count(self, generation: Generation, delta: Delta) -> None:
        generation.generated += len(delta.token_ids)
        generation.finish_reason = delta.finish_reason or generation.finish_reason

    def usage(self) -> Usage:
        prompt_tokens = sum(len(ids) for ids in self.prompts)  # each prompt once, whatever n
        completion_tokens = sum(g.generated for g in self.generations)
        return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                     total_tokens=prompt_tokens + completion_tokens)

    def cancel(self) -> None:
        for generation in self.generations:
            if generation.handle is not None:
                self.served.engine.cancel(generation.handle)

    def log_done(self) -> None:
        log.info("completion", **self.context, finish_reason=",".join(g.finish_reason for g in self.generations),
                 completion_tokens=sum(g.generated for g in self.generations),
                 seconds=round(time.monotonic() - self.started, 4))


async def _nothing_generated() -> AsyncIterator[Delta]:
    yield Delta("", finish_reason="length")


def start(service: InferenceService, served: ServedModel, prompts: list[list[int]], body: SamplingFields,
          max_tokens: int, logprobs: int | None, prefix: str) -> Job:
    """Queue n choices per prompt (none to generate with max_tokens 0). With a seed, choice i
    of a prompt samples with seed + i (modulo 2**64, so a negative seed is one too):
    reproducible, and the n choices differ."""
    choices = len(prompts) * body.n
    if max_tokens and choices > service.config.engine.max_waiting:
        raise ApiError(400, f"n: {choices} choices (prompts × n) exceed the server's queue of "
                            f"{service.config.engine.max_waiting}", param="n")
    generations: list[Generation] = []
    request_id = f"{prefix}-{uuid.uuid4().hex[:24]}"
    try:
        for p, ids in enumerate(prompts):
            for i in range(body.n):
                handle = None
                if max_tokens:
                    seed = None if body.seed is None else (body.seed + i) % 2**64
                    params = SamplingParams(max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
                                            top_k=max(body.top_k, 0), seed=seed, logprobs=logprobs,
                                            logit_bias=body.biases())
                    handle = service.submit(served, ids, params, request_id)
                generations.append(Generation(len(generations), p, handle))
    except BaseException as exc:
        for generation in generations:
            if generation.handle is not None:
                served.engine.cancel(generation.handle)
        if isinstance(exc, QueueFull):
            raise ApiError(429, f"server busy: {exc}; retry later", "rate_limit_error",
                           headers={"Retry-After": str(service.config.retry_after_seconds)}) from exc
        if isinstance(exc, NotReady):
            raise not_ready(exc) from exc
        raise
    span = trace.get_current_span()
    context = dict(request_id=request_id, trace_id=trace_id_of(span), prompt_tokens=sum(map(len, prompts)),
                   max_tokens=max_tokens, choices=len(generations), stream=body.stream)
    return Job(service, served, prompts, generations, body.stop, span, request_id, time.monotonic(), context)


async def merged(job: Job) -> AsyncIterator[tuple[Generation, Delta]]:
    """Every choice's deltas as they arrive (each choice's in order). Closing this ends every
    choice's stream, which cancels its sequence."""
    if len(job.generations) == 1:
        generation = job.generations[0]
        async with aclosing(job.deltas(generation)) as stream:
            async for delta in stream:
                job.count(generation, delta)
                yield generation, delta
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(generation: Generation):
        try:
            async with aclosing(job.deltas(generation)) as stream:
                async for delta in stream:
                    queue.put_nowait((generation, delta, None))
        except Exception as exc:  # noqa: BLE001 - raised to the consumer
            queue.put_nowait((generation, None, exc))
            return
        queue.put_nowait((generation, None, None))

    tasks = [asyncio.create_task(pump(g)) for g in job.generations]
    try:
        running = len(tasks)
        while running:
            generation, delta, error = await queue.get()
            if error is not None:
                raise error
            if delta is None:
                running -= 1
                continue
            job.count(generation, delta)
            yield generation, delta
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def collect(job: Job, request: Request) -> list[list[Delta]] | None:
    """Every choice's deltas, whole; None when the client went away before the end."""
    async def cancel_on_disconnect():
        while (await request.receive())["type"] != "http.disconnect":
            pass
        job.cancel()

    watcher = asyncio.create_task(cancel_on_disconnect())
    deltas: list[list[Delta]] = [[] for _ in job.generations]
    try:
        async with aclosing(merged(job)) as stream:
            async for generation, delta in stream:
                deltas[generation.index].append(delta)
    except NotReady as exc:
        raise not_ready(exc) from exc
    finally:
        watcher.cancel()
        job.log_done()
    if any(g.finish_reason == "cancelled" for g in job.generations):
        return None
    return deltas


def token_logprobs(served: ServedModel, deltas: list[Delta]) -> tuple[list[str], list[float], list[dict[str, float]]]:
    """(token texts, their logprobs, the top logprobs at each) of generated deltas."""
    tokens = [served.codec.token_text(t) for d in deltas for t in d.token_ids]
    tops = [{served.codec.token_text(t): lp for t, lp in top.items()} for d in deltas for top in d.top_logprobs]
    return tokens, [lp for d in deltas for lp in d.logprobs], tops
