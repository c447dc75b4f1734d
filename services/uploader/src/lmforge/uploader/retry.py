"""Retries with exponential backoff and full jitter for object-store requests.

Retried: throttling (503 SlowDown and friends), 5xx, timeouts and dropped connections.
Not retried: everything that will not get better by waiting (missing bucket, denied
access, bad credentials, a malformed request): those fail at once with a clear error.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from lmforge.common.logging import get_logger

T = TypeVar("T")
RETRYABLE_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeTooSkewed",
                             "InternalError", "ServiceUnavailable", "503", "500", "502", "504"})


class Cancelled(Exception):
    """The operation was stopped on purpose (shutdown grace period over)."""


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return True  # connection reset/closed, read timeout, endpoint briefly unreachable
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return error.get("Code") in RETRYABLE_CODES or status >= 500
    return False


@dataclass
class RetryPolicy:
    attempts: int = 8
    base_seconds: float = 0.2
    max_seconds: float = 20.0
    on_retry: Callable[[str, BaseException], None] | None = None
    should_stop: Callable[[], bool] = lambda: False

    def call(self, what: str, fn: Callable[[], T]) -> T:
        for attempt in range(1, self.attempts + 1):
            if self.should_stop():
                raise Cancelled(what)
            try:
                return fn()
            except Exception as exc:  # classified below; non-retryable ones propagate unchanged
                if not is_retryable(exc) or attempt == self.attempts:
                    raise
                delay = random.uniform(0, min(self.max_seconds, self.base_seconds * 2 ** (attempt - 1)))
                get_logger("uploader").warning("retrying", what=what, attempt=attempt, delay=round(delay, 3),
                                               error=f"{type(exc).__name__}: {exc}")
                if self.on_retry:
                    self.on_retry(what, exc)
                time.sleep(delay)
        raise AssertionError("unreachable")
