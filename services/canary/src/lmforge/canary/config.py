"""Canary configuration (pydantic): defaults < YAML (--config) < env LMFORGE_CANARY__… < --set key=value.

The API key is not configuration: it comes from --api-key-file (a mounted Secret) or the
env var LMFORGE_CANARY_API_KEY, and is never logged."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from lmforge.common.config import StrictModel, load_config
from lmforge.common.retry import RetrySettings

ENV_PREFIX = "LMFORGE_CANARY"
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class ToleranceSection(StrictModel):
    max_perplexity_increase_ratio: float = Field(
        0.10, ge=0, description="regression when perplexity > baseline × (1 + this)")
    max_score_drop: float = Field(
        0.05, ge=0, le=1, description="regression when score < baseline score − this (score: fraction of checks)")
    max_perplexity: float | None = Field(
        None, gt=0, description="optional absolute ceiling, applied with or without a baseline")
    min_score: float | None = Field(
        None, ge=0, le=1, description="optional absolute floor, applied with or without a baseline")


class HttpSection(RetrySettings):
    connect_timeout_seconds: float = Field(5.0, gt=0)
    read_timeout_seconds: float = Field(60.0, gt=0, description="per request (a completion included)")
    attempts: int = Field(4, ge=1, description="tries per request on connection errors, 429 and 5xx")
    backoff_seconds: float = Field(0.5, ge=0, description="first retry delay; doubles, with full jitter")
    backoff_max_seconds: float = Field(10.0, ge=0, description="cap on one retry delay (Retry-After included)")


class PushSection(StrictModel):
    job: str = Field("lmforge-canary", min_length=1, description="the Pushgateway job label")
    grouping: dict[str, str] = Field(
        default_factory=dict, description="extra grouping-key labels besides `model` (e.g. {env: prod})")
    timeout_seconds: float = Field(10.0, gt=0)
    attempts: int = Field(3, ge=1)
    required: bool = Field(
        False, description="a failed push makes a passing run exit 4 (a regression still exits 1)")

    @field_validator("grouping")
    @classmethod
    def _label_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not LABEL_NAME.fullmatch(name) or name.startswith("__"):
                raise ValueError(f"{name!r} is not a Prometheus label name")
            if name in ("job", "model"):
                raise ValueError(f"{name!r} is set by the canary itself")
        return value


class MemorizationSection(StrictModel):
    enabled: bool = Field(
        True, description="trace each check's output through POST /v1/trace and report the share of generated "
        "tokens found verbatim in the training data (a server without a trace index: reported as not traced)")
    min_span_tokens: int = Field(
        32, ge=4, description="a generated token counts as memorized when it lies inside a span of at least this "
        "many tokens found verbatim in the training data (the trace route's minimum is 4)")
    endpoint: str | None = Field(
        None, description="the base URL of the server answering /v1/trace when it is not --endpoint: the trace "
        "service beside a vLLM backend (the chart sets it, http://<release>-inference:8001); default: --endpoint")


class CanaryConfig(StrictModel):
    model: str | None = Field(None, description="the `model` field sent with each request (default: the "
                              "model the endpoint serves)")
    default_max_tokens: int = Field(32, ge=1, description="for checks that do not set max_tokens")
    tolerance: ToleranceSection = Field(default_factory=ToleranceSection)
    http: HttpSection = Field(default_factory=HttpSection)
    push: PushSection = Field(default_factory=PushSection)
    memorization: MemorizationSection = Field(default_factory=MemorizationSection)


def load_canary_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> CanaryConfig:
    return load_config(CanaryConfig, path, overrides, env_prefix=ENV_PREFIX)
