"""The uploader's retries: lmforge.common.retry's one policy, its retry lines logged as the
uploader. Which object-store errors are retried is the object-store layer's call
(lmforge.common.s3.is_transient)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lmforge.common.logging import get_logger
from lmforge.common.retry import Cancelled
from lmforge.common.retry import RetryPolicy as CommonRetryPolicy

__all__ = ["Cancelled", "RetryPolicy"]


@dataclass
class RetryPolicy(CommonRetryPolicy):
    log: Any = field(default_factory=lambda: get_logger("uploader"))
