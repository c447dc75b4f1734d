"""The API's errors, OpenAI-shaped: `{"error": {"message", "type", "param", "code"}}`, never with
a stack trace; `code` is OpenAI's string code where it has one (`invalid_api_key`,
`model_not_found`), else null. `ERROR_HANDLERS` turns every exception a
request can raise into one: ApiError as it says, invalid JSON and invalid fields 400 (as OpenAI
and vLLM answer, so clients raise BadRequestError), Starlette's own errors (404 no route, 405)
with their status, and anything unexpected 500, logged with its trace id."""

from __future__ import annotations

import re

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from opentelemetry import trace
from starlette.exceptions import HTTPException as StarletteHTTPException

from lmforge.common.logging import get_logger
from lmforge.inference.service import NotReady, RequestFailed
from lmforge.inference.tracing import trace_id_of

log = get_logger("inference")

# pydantic names a type with a validator, in a union, as "function-before[_valid_unicode(), str]": "str" will do
_VALIDATOR_LABEL = re.compile(r"function-\w+\[\w+\(\), ([^\[\]]+)\]")


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 headers: dict[str, str] | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.headers = status, message, type_, param, headers
        self.code = code


def not_ready(exc: NotReady) -> ApiError:
    """503 for a model that is loading, failed to load, or whose engine stopped; 500 for a request
    the engine failed alone (it serves the others on)."""
    if isinstance(exc, RequestFailed):
        return ApiError(500, str(exc), "server_error")
    return ApiError(503, str(exc), "service_unavailable", headers={"Retry-After": "5"})


def stream_error_event(exc: NotReady) -> dict:
    """The error event that ends a stream the engine could not finish (not_ready's error)."""
    error = not_ready(exc)
    return error_body(error.message, error.type)


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    """The error object of a response body or of a stream's error event."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, type_: str, param: str | None = None,
                   headers: dict[str, str] | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param, code), status_code=status, headers=headers)


async def _api_error(request: Request, exc: ApiError):
    return error_response(exc.status, exc.message, exc.type, exc.param, exc.headers, exc.code)


async def _invalid(request: Request, exc: RequestValidationError):
    errors = exc.errors()
    if any(e["type"] == "json_invalid" for e in errors):
        return error_response(400, "the request body is not valid JSON: " + errors[0].get("msg", ""),
                              "invalid_request_error")
    where = [".".join(_VALIDATOR_LABEL.sub(r"\1", str(p)) for p in e["loc"] if p != "body") for e in errors]
    problems = [f"{field or 'body'}: {e['msg']}" for field, e in zip(where, errors, strict=True)]
    return error_response(400, "; ".join(problems), "invalid_request_error", where[0] if where and where[0] else None)


async def _http_error(request: Request, exc: StarletteHTTPException):
    return error_response(exc.status_code, str(exc.detail), "invalid_request_error")


async def _unexpected(request: Request, exc: Exception):
    trace_id = trace_id_of(trace.get_current_span())
    log.error("request_failed", path=request.url.path, trace_id=trace_id, error=repr(exc), exc_info=True)
    return error_response(500, f"internal error (trace id {trace_id})", "server_error")


ERROR_HANDLERS = {ApiError: _api_error, RequestValidationError: _invalid, StarletteHTTPException: _http_error,
                  Exception: _unexpected}
