"""Request and response bodies of the OpenAI-compatible API. Requests are strict: unknown
fields are errors, and no value changes type on the way in (`true` is not the integer 1, "5"
is not 5); a number must be finite and within a bound the engine can represent (the bounds that
depend on the model, top_k and logit_bias's token ids against its vocabulary, max_tokens against
the server's limit, are the routes' to check). An explicit null is the field's default, as
OpenAI takes it, and text must be valid Unicode (a lone surrogate is not)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from lmforge.inference.sampling import MAX_BIAS

MAX_N = 16  # choices per prompt (OpenAI allows up to 128; every one holds an engine slot)
TOKEN_ID_KEY = re.compile(r"0|[1-9][0-9]{0,18}")  # a logit_bias key: a token id in decimal, at most 19 digits


def _valid_unicode(value):
    if not isinstance(value, str):
        return value  # the type's own validation refuses it
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"not valid Unicode: a lone surrogate (U+{ord(value[exc.start]):04X}) at character "
                         f"{exc.start}") from None
    return value


Text = Annotated[str, BeforeValidator(_valid_unicode)]  # a string that may reach the tokenizer or a response


class RequestModel(BaseModel):
    """A request body or a part of one: strict, unknown fields refused, null meaning the default."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data):
        if not isinstance(data, dict):
            return data
        optional = {name for name, field in cls.model_fields.items() if not field.is_required()}
        return {key: value for key, value in data.items() if value is not None or key not in optional}


class StreamOptions(RequestModel):
    include_usage: bool = False  # a last chunk with empty choices and the request's usage


class TraceOptions(RequestModel):
    """How a text is traced (POST /v1/trace, and `trace_options` beside `trace: true` on completions)."""

    min_span_tokens: int | None = Field(None, ge=4)  # None: the server's trace.min_span_tokens
    max_documents: int | None = Field(None, ge=0)  # per span; None: 10, or trace.max_documents if lower
    span_density: float = Field(0.05, gt=0, allow_inf_nan=False)  # >= 1: every maximal span


class SamplingFields(RequestModel):
    """The fields /v1/completions and /v1/chat/completions share. `frequency_penalty` and
    `presence_penalty` are accepted at their neutral value only (the official clients send them
    when a caller sets them), `user` is accepted and ignored."""

    model: str | None = None  # None or "": the served model
    max_tokens: int | None = Field(None, ge=0)  # the upper bound is the server's max_tokens_limit
    temperature: float = Field(1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int = Field(-1, ge=-1)  # vLLM's extension (-1 or 0: off; at most the vocabulary), sent in extra_body
    n: int = Field(1, ge=1, le=MAX_N)
    stop: Text | list[Text] | None = Field(None, validate_default=True)  # always a list once validated
    seed: int | None = Field(None, ge=-2**63, lt=2**63)  # OpenAI: any 64-bit integer
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)
    presence_penalty: float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)
    # Token id (a decimal string) -> a value added to its logit before sampling (ids: within the vocabulary).
    logit_bias: dict[str, Annotated[float, Field(ge=-MAX_BIAS, le=MAX_BIAS, allow_inf_nan=False)]] | None = None
    user: str | None = None
    trace: bool = False  # lmforge's extension: each choice gets the spans of its text found in the training data
    trace_options: TraceOptions | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop strings")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, value):
        bad = next((key for key in value or {} if not TOKEN_ID_KEY.fullmatch(key)), None)
        if bad is not None:
            raise ValueError(f'keys are token ids written in decimal ("50256"), not {bad!r}')
        return value

    def biases(self) -> tuple[tuple[int, float], ...]:
        """logit_bias as (token id, bias) pairs, the zero ones left out."""
        return tuple((int(key), bias) for key, bias in (self.logit_bias or {}).items() if bias)

    def unsupported(self) -> tuple[str, str] | None:
        """(param, why) of a field set to a value this server does not implement."""
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name):
                return name, f"{name}: only 0 is supported"
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options: only allowed when stream is true"
        if self.trace_options is not None and not self.trace:
            return "trace_options", "trace_options: only allowed when trace is true"
        return None


Prompt = Text | list[Text] | list[int] | list[list[int]]


class CompletionRequest(SamplingFields):
    """POST /v1/completions. `prompt`: a string, a batch of strings, token ids, or a batch of
    token-id lists (lm-evaluation-harness sends token ids)."""

    prompt: Prompt
    max_tokens: int = Field(16, ge=0)  # 0 only with echo (scoring: the prompt's logprobs)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)
    best_of: int | None = Field(None, ge=1, le=MAX_N)  # only equal to n: no server-side ranking
    suffix: str | None = None  # refused when set (no fill-in-the-middle)

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, value):
        if isinstance(value, str):
            if not value:
                raise ValueError("must not be empty")
            return value
        if not value:
            raise ValueError("must not be an empty list")
        if any(not isinstance(p, int) and not p for p in value):
            raise ValueError("no prompt of the batch may be empty")
        return value

    def prompts(self) -> list[str | list[int]]:
        """The batch: each prompt a string or a list of token ids."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if all(isinstance(p, int) for p in self.prompt):
            return [self.prompt]
        return list(self.prompt)


class ContentPart(RequestModel):
    """A part of a message's content; only text parts are supported (others are refused by name)."""

    model_config = ConfigDict(extra="allow", strict=True)

    type: str
    text: Text | None = None


class ChatMessage(RequestModel):
    """A message, also as the openai client dumps an answer to send it back (`model_dump()`):
    the answer's fields this server never sets are accepted empty (null, []), refused when set."""

    role: Text = Field(min_length=1)
    content: Text | list[ContentPart] | None = None  # a list: content parts; only {"type": "text", "text"} ones
    name: Text | None = None
    refusal: str | None = None
    audio: dict | None = None
    function_call: dict | None = None
    tool_calls: list[dict] | None = None
    annotations: list[dict] | None = None  # about the content (citations): ignored

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise ValueError("only text content parts are supported")
            parts.append(part.text)
        return "".join(parts)

    def unsupported(self) -> str | None:
        """The name of a field set that the prompt would need and this server cannot render."""
        return next((name for name in ("refusal", "audio", "function_call", "tool_calls") if getattr(self, name)),
                    None)


class ChatRequest(SamplingFields):
    """POST /v1/chat/completions. OpenAI's fields that do not change the output are accepted
    and ignored; those that would are accepted at their neutral values only."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name of max_tokens
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    store: bool | None = None  # ignored, as the next four
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None
    tools: list[dict] | None = None  # only empty
    tool_choice: str | dict | None = None  # only "none", or "auto" (no tools: none)
    response_format: dict | None = None  # only {"type": "text"}

    def unsupported(self) -> tuple[str, str] | None:
        problem = super().unsupported()
        if problem is not None:
            return problem
        if self.tools:
            return "tools", "tools: not supported (this server calls no tools)"
        if self.tool_choice not in (None, "none", "auto"):
            return "tool_choice", 'tool_choice: only "none" or "auto" is supported (this server calls no tools)'
        if self.response_format is not None and self.response_format.get("type") != "text":
            return "response_format", 'response_format: only {"type": "text"} is supported'
        for index, message in enumerate(self.messages):
            name = message.unsupported()
            if name is not None:
                return f"messages.{index}.{name}", f"messages.{index}.{name}: not supported (only null or empty)"
        return None


class ScoreRequest(RequestModel):
    """POST /v1/score: the logprob of every token of `text` after the first (for perplexity)."""

    model: str | None = None
    text: Text = Field(min_length=1)


class TraceRequest(TraceOptions):
    """POST /v1/trace: the spans of `text` (or of `token_ids`, in the served model's vocabulary) found verbatim
    in the training data, each with its count and source documents."""

    model: str | None = None  # None or "": the served model
    text: Text | None = Field(None, min_length=1)
    token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one_input(self):
        if (self.text is None) == (self.token_ids is None):
            raise ValueError("give exactly one of text and token_ids")
        return self


class Loose(BaseModel):
    """A response part built from lmforge.trace's own dict: fields it adds later are passed on, not dropped."""

    model_config = ConfigDict(extra="allow")


class TraceDocument(Loose):
    url: str | None = None
    record_id: str | None = None
    doc_id: str | None = None
    shard: str | None = None
    token_offset: int | None = None  # where the document starts in its shard
    snippet: str | None = None  # the document's text around the span
    match_start: int | None = None  # where the span is in the snippet, in characters
    match_end: int | None = None


class TraceSpan(Loose):
    start: int  # token positions in the traced text, [start, end)
    end: int
    length: int
    count: int  # occurrences in the training data
    unigram_logprob: float  # under the training data's unigram model: the lower, the more telling the span
    text: str | None
    documents: list[TraceDocument]


class TraceIndexInfo(Loose):
    tokens: int
    documents: int
    partitions: int
    engine: str


class TraceBody(Loose):
    """A trace: what /v1/trace answers and what `trace: true` adds to a choice."""

    tokens: int
    truncated: bool
    index: TraceIndexInfo
    spans: list[TraceSpan]


class TraceResponse(TraceBody):
    object: str = "trace"
    model: str


def _unset(value) -> bool:
    return value is None


class Logprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]  # None for an echoed prompt's first token
    top_logprobs: list[dict[str, float] | None] | None = None
    text_offset: list[int]


class Choice(BaseModel):
    index: int = 0
    text: str
    logprobs: Logprobs | None = None
    finish_reason: str | None = None
    trace: TraceBody | dict | None = Field(None, exclude_if=_unset)  # with `trace: true` (a dict: its error)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Completion(BaseModel):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None


class TokenLogprob(BaseModel):
    """A token's logprob in a chat answer, with the token's UTF-8 bytes (as OpenAI sends them)."""

    token: str
    logprob: float
    bytes: list[int]


class ChosenTokenLogprob(TokenLogprob):
    top_logprobs: list[TokenLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChosenTokenLogprob]


class AssistantMessage(BaseModel):
    role: str = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    trace: TraceBody | dict | None = Field(None, exclude_if=_unset)


class ChatCompletion(BaseModel):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class ChatDelta(BaseModel):
    """What a chunk adds to a choice's message: the role first (with empty content), then content;
    a field not set is left out of the JSON ({} for a chunk that only ends the choice)."""

    role: str | None = Field(None, exclude_if=_unset)
    content: str | None = Field(None, exclude_if=_unset)


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    trace: TraceBody | dict | None = Field(None, exclude_if=_unset)


class ChatCompletionChunk(BaseModel):
    """A streamed chat event: one choice's delta, or (the usage chunk) no choice and the usage."""

    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class Score(BaseModel):
    model: str
    tokens: list[str]
    token_ids: list[int]
    token_logprobs: list[float | None]  # None for the first token (nothing before it)
    total_logprob: float
    perplexity: float
