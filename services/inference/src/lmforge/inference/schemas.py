"""Request and response bodies of the OpenAI-compatible API. Requests are strict: unknown
fields are errors, and no value changes type on the way in (`true` is not the integer 1, "5"
is not 5); a number must be finite."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_N = 16  # choices per prompt (OpenAI allows up to 128; every one holds an engine slot)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False  # a last chunk with empty choices and the request's usage


class SamplingFields(BaseModel):
    """The fields /v1/completions and /v1/chat/completions share. `frequency_penalty`,
    `presence_penalty`, `logit_bias` and `best_of` are accepted at their neutral values only (the
    official clients send them when a caller sets them), `user` is accepted and ignored."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=0)  # the upper bound is the server's max_tokens_limit
    temperature: float = Field(1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int = Field(-1, ge=-1)  # vLLM's extension (-1 or 0: off), which its clients send in extra_body
    n: int = Field(1, ge=1, le=MAX_N)
    stop: str | list[str] | None = Field(None, validate_default=True)  # always a list once validated
    seed: int | None = Field(None, ge=0, lt=2**63)
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = Field(None, allow_inf_nan=False)
    presence_penalty: float | None = Field(None, allow_inf_nan=False)
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop strings")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    def unsupported(self) -> tuple[str, str] | None:
        """(param, why) of a field set to a value this server does not implement."""
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name):
                return name, f"{name}: only 0 is supported"
        if self.logit_bias:
            return "logit_bias", "logit_bias: not supported"
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options: only allowed when stream is true"
        return None


Prompt = str | list[str] | list[int] | list[list[int]]


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


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: str = Field(min_length=1)
    content: str | list[dict] | None = None  # a list: content parts; only {"type": "text", "text"} ones
    name: str | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)


class ChatRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name of max_tokens
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=5)


class ScoreRequest(BaseModel):
    """POST /v1/score: the logprob of every token of `text` after the first (for perplexity)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    text: str = Field(min_length=1)


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


class Score(BaseModel):
    model: str
    tokens: list[str]
    token_ids: list[int]
    token_logprobs: list[float | None]  # None for the first token (nothing before it)
    total_logprob: float
    perplexity: float
