"""The one retry policy: every call that may fail for a moment (an object-store request, an
HTTP request, a download, a push to the Pushgateway) is retried through it (tenacity underneath).

    policy = RetryPolicy(attempts=5, backoff_seconds=1.0, backoff_max_seconds=30.0, retryable=is_transient,
                         log=get_logger("dataprep"), event="fetch_retry")
    body = policy.call(f"get {url}", lambda: download(url), url=url)

- Waits: exponential backoff with full jitter. Before retry n the wait is drawn uniformly from
  [0, min(backoff_max_seconds, backoff_seconds * 2**(n-1))]; at least `wait_at_least(error)` when
  given (a server's Retry-After), and never more than backoff_max_seconds.
- Limits: `attempts` tries in all; with max_elapsed_seconds, no retry that would start later than
  that after the first try.
- Which errors: those `retryable(error)` accepts. Any other error, and the last retryable one,
  propagates unchanged.
- Logging: one warning per retry, `event` with what, attempt, attempts, retry_in_seconds and
  error, plus the caller's fields.
- should_stop() is asked before each try; once it is true the call raises Cancelled.

Retry settings have one set of names everywhere: `attempts`, `backoff_seconds`,
`backoff_max_seconds`. A config section that carries them derives from RetrySettings (the
uploader's `transfer`), and a module's fixed ones are a RetrySettings constant (fetch's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import tenacity
from pydantic import Field, model_validator

from lmforge.common.config import StrictModel
from lmforge.common.logging import get_logger

T = TypeVar("T")


class Cancelled(Exception):
    """The operation was stopped on purpose (a shutdown grace period is over)."""


def any_exception(exc: BaseException) -> bool:
    return isinstance(exc, Exception)


def never() -> bool:
    return False


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@dataclass
class RetryPolicy:
    attempts: int = 8
    backoff_seconds: float = 0.2  # the first wait's upper bound; doubles with each retry
    backoff_max_seconds: float = 20.0  # the most one wait can be
    max_elapsed_seconds: float | None = None
    retryable: Callable[[BaseException], bool] = any_exception
    log: Any = None  # a StructLogger (anything with warning(event, **fields)); None: the "lmforge" logger
    event: str = "retrying"
    should_stop: Callable[[], bool] = never
    wait_at_least: Callable[[BaseException], float | None] | None = None

    def call(self, what: str, fn: Callable[[], T], *, retryable: Callable[[BaseException], bool] | None = None,
             **fields: Any) -> T:
        """fn(), retried as the module docstring says; `retryable` replaces the policy's predicate
        for this call (the object-store layer knows which of its errors are transient)."""
        accept = retryable or self.retryable

        def attempt() -> T:
            if self.should_stop():
                raise Cancelled(what)
            return fn()

        stop = tenacity.stop_after_attempt(self.attempts)
        if self.max_elapsed_seconds is not None:
            stop = stop | tenacity.stop_before_delay(self.max_elapsed_seconds)
        retrying = tenacity.Retrying(
            stop=stop,
            wait=self._wait_strategy(),
            retry=tenacity.retry_if_exception(lambda exc: not isinstance(exc, Cancelled) and accept(exc)),
            before_sleep=lambda state: self._log_retry(what, state, fields),
            reraise=True,
        )
        return retrying(attempt)

    def _wait_strategy(self) -> Callable[[tenacity.RetryCallState], float]:
        backoff = tenacity.wait_random_exponential(multiplier=self.backoff_seconds, max=self.backoff_max_seconds)
        if self.wait_at_least is None:
            return backoff
        floor_of = self.wait_at_least

        def wait(state: tenacity.RetryCallState) -> float:
            floor = floor_of(state.outcome.exception()) if state.outcome is not None else None
            return min(self.backoff_max_seconds, max(backoff(state), floor or 0.0))

        return wait

    def _log_retry(self, what: str, state: tenacity.RetryCallState, fields: dict[str, Any]) -> None:
        log = self.log or get_logger("lmforge")
        log.warning(self.event, what=what, attempt=state.attempt_number, attempts=self.attempts,
                    retry_in_seconds=round(state.next_action.sleep if state.next_action else 0.0, 3),
                    error=describe(state.outcome.exception()), **fields)


def reject_renamed(data: Any, renamed: dict[str, str]) -> Any:
    """A config section's input as it is, unless it sets a retry key that was renamed: then an
    error naming the new key (for a model_validator(mode="before"))."""
    if isinstance(data, dict):
        for old, new in renamed.items():
            if old in data:
                raise ValueError(f"{old!r} is now {new!r}")
    return data


class RetrySettings(StrictModel):
    """The retry knobs a config section carries (a subclass sets its own defaults and may list
    keys it renamed in `renamed`: an old key is an error that names the new one)."""

    renamed: ClassVar[dict[str, str]] = {}

    attempts: int = Field(8, ge=1, description="tries per request before it fails")
    backoff_seconds: float = Field(0.2, gt=0, description="first retry delay; doubles, with full jitter")
    backoff_max_seconds: float = Field(20.0, gt=0, description="cap on one retry delay")

    @model_validator(mode="before")
    @classmethod
    def _no_renamed_keys(cls, data: Any) -> Any:
        return reject_renamed(data, cls.renamed)

    def policy(self, **options: Any) -> RetryPolicy:
        """A RetryPolicy with these settings; `options` sets its other fields (log, event, retryable, ...)."""
        return RetryPolicy(attempts=self.attempts, backoff_seconds=self.backoff_seconds,
                           backoff_max_seconds=self.backoff_max_seconds, **options)
