"""The messages between the API processes and the engine-core process (lmforge.inference.engine_core),
as msgpack through msgspec: typed structs, decoded without a Python object per field.

One ZeroMQ ROUTER socket in the engine, one DEALER per API process. An API process says `Hello`
first (the engine then knows it, answers `Ready` and sends it heartbeats), then `Add`s requests,
`Abort`s those whose client went away and asks for `Compute` jobs (scoring, prompt logprobs), which
run between steps. The engine answers with one `Step` per engine step per API process: each of that
process's sequences that produced a token (or finished) in the step, with the engine's counters. A
fault the engine cannot serve on ends it with `Fatal` to every API process.

A request is known by its `key`, unique within its API process (the engine keys by (process, key)).
Timestamps are `time.monotonic()`, which on Linux is one clock for every process of the machine.
"""

from __future__ import annotations

import msgspec

from lmforge.inference.sampling import SamplingParams
from lmforge.inference.stats import EngineStats

# -- API process → engine ------------------------------------------------------------------------


class Hello(msgspec.Struct, tag=True):
    pass


class Add(msgspec.Struct, tag=True):
    key: int
    prompt: list[int]
    params: SamplingParams
    request_id: str | None
    arrived: float


class Abort(msgspec.Struct, tag=True):
    key: int


class Compute(msgspec.Struct, tag=True):
    """Teacher-forced logprobs of `tokens` (kind "score": each token's; "prompt_logprobs": also the
    `top` most likely at each position)."""

    key: int
    kind: str
    tokens: list[int]
    top: int = 0


class Shutdown(msgspec.Struct, tag=True):
    pass


ToEngine = Hello | Add | Abort | Compute | Shutdown

# -- engine → API process ------------------------------------------------------------------------


class EngineInfo(msgspec.Struct):
    """What an API process needs to know of the model the engine serves."""

    vocab_size: int
    context_length: int
    max_waiting: int
    kv_cache_bytes: int
    kv_cache_blocks: int
    parameters: int
    pid: int


class Ready(msgspec.Struct, tag=True):
    info: EngineInfo


class Output(msgspec.Struct, array_like=True):
    """One sequence's news in a step: a token (None when the step failed it), its finish reason once
    finished, the times it was scheduled, gave its first token and finished, and its logprobs when it asked for them."""

    key: int
    token: int | None
    finish_reason: str | None = None
    scheduled_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    logprob: float | None = None
    top_logprobs: dict[int, float] | None = None
    error: str | None = None  # why the engine failed the sequence (finish_reason "error")


class Step(msgspec.Struct, tag=True):
    """One engine step's outputs for one API process (none: a heartbeat), the engine's counters,
    and how many of this process's `Add`s it has taken in (the rest are still in flight)."""

    outputs: list[Output]
    stats: EngineStats
    running: int
    waiting: int
    adds_seen: int


class ComputeResult(msgspec.Struct, tag=True):
    key: int
    logprobs: list[float] = []
    top_logprobs: list[dict[int, float]] = []
    error: str | None = None  # a ValueError's message: the request was bad


class Fatal(msgspec.Struct, tag=True):
    """The engine broke (a fault it cannot serve on) and exits."""

    kind: str
    message: str


FromEngine = Ready | Step | ComputeResult | Fatal


def encoder() -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder()


def engine_decoder() -> msgspec.msgpack.Decoder:
    """Decodes what the API processes send."""
    return msgspec.msgpack.Decoder(ToEngine)


def api_decoder() -> msgspec.msgpack.Decoder:
    """Decodes what the engine sends."""
    return msgspec.msgpack.Decoder(FromEngine)
