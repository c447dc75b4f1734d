"""The API's errors, OpenAI-shaped: `{"error": {"message", "type", "param", "code"}}`, never with
a stack trace. `ERROR_HANDLERS` turns every exception a request can raise into one: ApiError as
it says, invalid JSON 400, invalid fields 422, Starlette's own errors (404 no route, 405) with
their status, and anything unexpected 500, logged with its trace id."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from opentelemetry import trace
from starlette.exceptions import HTTPException as StarletteHTTPException

from lmforge.common.logging import get_logger
from lmforge.inference.service import NotReady
from lmforge.inference.tracing import trace_id_of

log = get_logger("inference")


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.headers = status, message, type_, param, headers


def not_ready(exc: NotReady) -> ApiError:
    """503 for a model that is loading, failed to load, or whose engine stopped."""
    return ApiError(503, str(exc), "service_unavailable", headers={"Retry-After": "5"})


def error_response(status: int, message: str, type_: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": param, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


async def _api_error(request: Request, exc: ApiError):
    return error_response(exc.status, exc.message, exc.type, exc.param, exc.headers)


async def _invalid(request: Request, exc: RequestValidationError):
    errors = exc.errors()
    if any(e["type"] == "json_invalid" for e in errors):
        return error_response(400, "the request body is not valid JSON: " + errors[0].get("msg", ""),
                              "invalid_request_error")
    problems = []
    for e in errors:
        where = ".".join(str(p) for p in e["loc"] if p != "body") or "body"
        problems.append(f"{where}: {e['msg']}")
    first = [str(p) for p in errors[0]["loc"] if p != "body"] if errors else []
    return error_response(422, "; ".join(problems), "invalid_request_error", ".".join(first) or None)


async def _http_error(request: Request, exc: StarletteHTTPException):
    return error_response(exc.status_code, str(exc.detail), "invalid_request_error")


async def _unexpected(request: Request, exc: Exception):
    trace_id = trace_id_of(trace.get_current_span())
    log.error("request_failed", path=request.url.path, trace_id=trace_id, error=repr(exc), exc_info=True)
    return error_response(500, f"internal error (trace id {trace_id})", "server_error")


ERROR_HANDLERS = {ApiError: _api_error, RequestValidationError: _invalid, StarletteHTTPException: _http_error,
                  Exception: _unexpected}
