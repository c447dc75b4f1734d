"""A fault-injecting HTTP reverse proxy for S3 fault tests (stdlib only).

    with FaultProxy(s3_endpoint, slow_down=0.2, reset=0.05, methods={"PUT", "POST"}) as proxy:
        client = boto3.client("s3", endpoint_url=proxy.url, ...)

Every request is read in full (body included), then one fault is drawn for it from a seeded RNG:

- ``reset``: the client connection is aborted with a TCP RST and no response;
- ``error_500``: a 500 with an S3 ``InternalError`` XML body;
- ``slow_down``: a 503 with an S3 ``SlowDown`` XML body;
- ``delay``: forwarded normally, but the response is held back ``delay_seconds``;
- otherwise the request is forwarded untouched.

Reset, 500 and 503 requests never reach the target, so a faulted upload_part really did not happen. The client's
Host header is forwarded as is (it is part of the SigV4 signature, and moto reads path-style addressing from an IP
host). Client connections are kept alive, and each one keeps its own keep-alive connection to the target.
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import sys
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit
from xml.sax.saxutils import escape

FAULTS = ("reset", "error_500", "slow_down", "delay")
KINDS = ("forwarded", *FAULTS)

# Connection-level headers that a proxy must not pass on (RFC 9110 section 7.6.1). Expect is answered here.
_HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
    "te", "trailer", "transfer-encoding", "upgrade", "expect",
}
_ERRORS = {
    "error_500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "slow_down": (503, "SlowDown", "Please reduce your request rate."),
}
_STALE_UPSTREAM = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class FaultProxy:
    """Reverse proxy on a free 127.0.0.1 port in front of ``target`` (``http://host:port``)."""

    def __init__(self, target: str, *, reset: float = 0.0, error_500: float = 0.0, slow_down: float = 0.0,
                 delay: float = 0.0, delay_seconds: float = 0.5, seed: int = 0,
                 methods: Iterable[str] | None = None, upstream_timeout: float = 60.0, port: int = 0):
        parts = urlsplit(target)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"FaultProxy needs an http://host:port target, got {target!r}")
        self.target = target
        self.target_address = (parts.hostname, parts.port or 80)
        self.upstream_timeout = upstream_timeout
        self.port = port  # 0: a free one; another proxy's port brings a stopped proxy's endpoint back
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._stats = dict.fromkeys(KINDS, 0)
        self._connections: dict[socket.socket, threading.Thread] = {}
        self.accepted_connections = 0  # client connections so far: with keep-alive, far fewer than requests
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.set_faults(reset=reset, error_500=error_500, slow_down=slow_down, delay=delay,
                        delay_seconds=delay_seconds, methods=methods)

    def set_faults(self, *, reset: float = 0.0, error_500: float = 0.0, slow_down: float = 0.0, delay: float = 0.0,
                   delay_seconds: float = 0.5, methods: Iterable[str] | None = None) -> None:
        """Replace the whole fault configuration (same defaults as the constructor: ``set_faults()`` = no faults)."""
        fractions = {"reset": reset, "error_500": error_500, "slow_down": slow_down, "delay": delay}
        if any(not 0.0 <= f <= 1.0 for f in fractions.values()) or sum(fractions.values()) > 1.0 + 1e-9:
            raise ValueError(f"fault fractions must be in [0, 1] and sum to at most 1: {fractions}")
        with self._lock:
            self._fractions = fractions
            self.delay_seconds = delay_seconds
            self._methods = None if methods is None else frozenset(m.upper() for m in methods)

    @property
    def stats(self) -> dict[str, int]:
        """Counts per kind: ``forwarded`` (reached the target, delayed ones included), reset, error_500, ..."""
        with self._lock:
            return dict(self._stats)

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("FaultProxy is not running")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FaultProxy:
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.proxy = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"fault-proxy-{server.server_address[1]}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        self._thread.join()
        # Wake handler threads parked on idle keep-alive connections, then wait for them to finish.
        with self._lock:
            connections = list(self._connections.items())
        for sock, _ in connections:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for _, thread in connections:
            thread.join(timeout=5 + self.delay_seconds)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _draw(self, method: str) -> str | None:
        """The fault for one request (None: forward it), counted in the stats."""
        with self._lock:
            kind = None
            if self._methods is None or method in self._methods:
                u, cumulative = self._rng.random(), 0.0
                for name in FAULTS:
                    cumulative += self._fractions[name]
                    if u < cumulative:
                        kind = name
                        break
            if kind in (None, "delay"):
                self._stats["forwarded"] += 1
            if kind is not None:
                self._stats[kind] += 1
            return kind

    def _track(self, sock: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._connections[sock] = threading.current_thread()
                self.accepted_connections += 1
            else:
                self._connections.pop(sock, None)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # listen backlog: the default of 5 drops SYNs under a burst of parallel clients
    proxy: FaultProxy

    def handle_error(self, request, client_address) -> None:
        # Clients dropping their end (or a reset we injected) are routine here.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    disable_nagle_algorithm = True  # headers and body go out in separate writes: no 40 ms delayed-ACK stalls
    timeout = 300  # an idle client connection is dropped after this long

    server: _Server

    def setup(self) -> None:
        super().setup()
        self.proxy = self.server.proxy
        threading.current_thread().name = f"fault-proxy-{self.server.server_address[1]}-connection"
        self.upstream: http.client.HTTPConnection | None = None
        self.proxy._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            if self.upstream is not None:
                self.upstream.close()
            self.proxy._track(self.connection, add=False)

    def log_message(self, format, *args) -> None:
        pass

    def handle_request(self) -> None:
        body, chunked = self._read_body()
        fault = self.proxy._draw(self.command)
        if fault == "reset":
            self._reset()
        elif fault in _ERRORS:
            self._send_error(*_ERRORS[fault])
        else:
            try:
                response = self._forward(body, chunked)
            except (OSError, http.client.HTTPException) as exc:
                self._send_error(502, "BadGateway", f"fault proxy could not reach {self.proxy.target}: {exc}")
                return
            if fault == "delay":
                threading.Event().wait(self.proxy.delay_seconds)
            self._relay(*response)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_OPTIONS = do_PATCH = handle_request

    def _read_body(self) -> tuple[bytes, bool]:
        """The request body as received: Content-Length bytes, or the raw chunked stream (framing and trailers
        kept, so an aws-chunked body with a trailing checksum reaches the target intact)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raw = bytearray()
            while True:
                line = self.rfile.readline(65537)
                if not line.endswith(b"\n"):
                    raise ConnectionError("truncated chunked request body")
                raw += line
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise ConnectionError(f"bad chunk size line {line!r}") from None
                if size == 0:
                    break
                chunk = self.rfile.read(size + 2)  # data + CRLF
                if len(chunk) != size + 2:
                    raise ConnectionError("truncated chunked request body")
                raw += chunk
            while True:  # trailers, up to the blank line
                line = self.rfile.readline(65537)
                if not line.endswith(b"\n"):
                    raise ConnectionError("truncated chunked request trailers")
                raw += line
                if line in (b"\r\n", b"\n"):
                    return bytes(raw), True
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if len(body) != length:
            raise ConnectionError("truncated request body")
        return body, False

    def _forward(self, body: bytes, chunked: bool) -> tuple[int, str, list[tuple[str, str]], bytes]:
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP]
        if chunked:
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"] + [("Transfer-Encoding", "chunked")]
        for attempt in range(2):
            reused = self.upstream is not None and self.upstream.sock is not None
            if self.upstream is None:
                self.upstream = http.client.HTTPConnection(*self.proxy.target_address,
                                                           timeout=self.proxy.upstream_timeout)
            try:
                self.upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for key, value in headers:
                    self.upstream.putheader(key, value)
                self.upstream.endheaders(body or None)
                response = self.upstream.getresponse()
                payload = response.read()  # http.client reconnects next time if the target closed the connection
                return response.status, response.reason, response.getheaders(), payload
            except _STALE_UPSTREAM:
                # The target closed an idle keep-alive connection under us: retry once on a fresh one.
                self.upstream.close()
                self.upstream = None
                if not reused or attempt:
                    raise
        raise AssertionError("unreachable")

    def _relay(self, status: int, reason: str, headers: list[tuple[str, str]], payload: bytes) -> None:
        self.send_response_only(status, reason)
        for key, value in headers:
            lowered = key.lower()
            if lowered in _HOP_BY_HOP or (lowered == "content-length" and self.command != "HEAD"):
                continue
            self.send_header(key, value)
        if self.command != "HEAD" and status >= 200 and status not in (204, 304):
            self.send_header("Content-Length", str(len(payload)))
        self._end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _send_error(self, status: int, code: str, message: str) -> None:
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{escape(message)}</Message>"
            f"<Resource>{escape(self.path)}</Resource><RequestId>fault-proxy</RequestId></Error>"
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self._end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _end_headers(self) -> None:
        if self.close_connection:  # the client asked for Connection: close
            self.send_header("Connection", "close")
        self.end_headers()

    def _reset(self) -> None:
        # SO_LINGER with a zero timeout makes close() send RST instead of FIN; the real close happens when the
        # handler's file objects are closed in finish(), and the server's shutdown(SHUT_WR) then finds it closed.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True
