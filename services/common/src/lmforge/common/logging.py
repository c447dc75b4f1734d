"""JSON-lines structured logging: one object per line on stdout.

    log = get_logger("dataprep").bind(rank=0)
    log.info("stage_done", stage="langid", docs=120)
"""

from __future__ import annotations

import datetime as _dt
import json
import logging as _logging
import math
import os
import sys
from typing import Any

_CONFIGURED = False


def _json_safe(value: Any) -> Any:
    """NaN and infinities as strings: a bare NaN is not JSON, and strict log pipelines drop the line."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class JsonLineFormatter(_logging.Formatter):
    def format(self, record: _logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": _dt.datetime.fromtimestamp(record.created, _dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "service": getattr(record, "service", record.name),
            "event": record.getMessage(),
        }
        payload.update({key: _json_safe(value) for key, value in getattr(record, "fields", {}).items()})
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str, ensure_ascii=False)


def configure_logging(level: str | None = None, stream=None) -> None:
    """Install the JSON formatter on the `lmforge` logger (idempotent)."""
    global _CONFIGURED
    root = _logging.getLogger("lmforge")
    if _CONFIGURED and stream is None:
        return
    handler = _logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(JsonLineFormatter())
    root.handlers[:] = [handler]
    root.setLevel((level or os.environ.get("LMFORGE_LOG_LEVEL", "INFO")).upper())
    root.propagate = False
    _CONFIGURED = True


class StructLogger:
    """A thin wrapper that turns keyword arguments into JSON fields."""

    def __init__(self, service: str, context: dict[str, Any] | None = None):
        self._logger = _logging.getLogger(f"lmforge.{service}")
        self._service = service
        self._context = dict(context or {})

    def bind(self, **fields: Any) -> StructLogger:
        return StructLogger(self._service, {**self._context, **fields})

    def _log(self, level: int, event: str, exc_info: bool, fields: dict[str, Any]) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(
                level,
                event,
                exc_info=exc_info,
                extra={"service": self._service, "fields": {**self._context, **fields}},
            )

    def debug(self, event: str, **fields: Any) -> None:
        self._log(_logging.DEBUG, event, False, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(_logging.INFO, event, False, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(_logging.WARNING, event, False, fields)

    def error(self, event: str, exc_info: bool = False, **fields: Any) -> None:
        self._log(_logging.ERROR, event, exc_info, fields)


def get_logger(service: str, **context: Any) -> StructLogger:
    configure_logging()
    return StructLogger(service, context)
