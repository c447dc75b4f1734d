"""The ASGI middleware around the API: the request body limit and the request counter."""

from __future__ import annotations

from lmforge.inference.api_errors import error_response
from lmforge.inference.metrics import ServeMetrics


class BodyLimit:
    """413 for a request body over `limit` bytes, by Content-Length or as it streams in. The
    body is read here first (it is small by then) and replayed to the app, whose own body
    parsing would otherwise turn the refusal into a generic 400."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._reject(scope, receive, send)
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away mid-body
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                return await self._reject(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope, receive, send):
        response = error_response(413, f"request body larger than {self.limit} bytes", "invalid_request_error")
        await response(scope, receive, send)


class CountRequests:
    """lmforge_inference_requests_total{status} for every /v1/ request, whatever answered it (the
    outermost middleware, so the body limit's 413 counts too): an exception is a 500, a request
    that ended with no response at all (its client went away mid-body) a 499."""

    def __init__(self, app, metrics: ServeMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        status: int | None = None

        async def recording_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        except Exception:  # a cancellation (client gone, shutdown) is not a server error: it stays 499
            status = status or 500
            raise
        finally:
            self.metrics.observe_request(status or 499)
