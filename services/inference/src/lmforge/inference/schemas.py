"""Request and response bodies of the OpenAI-compatible API. Requests are strict: unknown
fields are errors, and no value changes type on the way in (`true` is not the integer 1, "5"
is not 5); a number must be finite."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    prompt: str = Field(min_length=1)
    max_tokens: int = Field(16, ge=1)  # the upper bound is the server's max_tokens_limit
    temperature: float = Field(1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    stop: str | list[str] | None = Field(None, validate_default=True)  # always a list once validated
    seed: int | None = Field(None, ge=0, lt=2**63)
    stream: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop strings")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops


class ScoreRequest(BaseModel):
    """POST /v1/score: the logprob of every token of `text` after the first (for perplexity)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    text: str = Field(min_length=1)


class Logprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None = None
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
