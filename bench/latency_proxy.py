#!/usr/bin/env python3
"""An HTTP proxy that adds a fixed latency to every request: put it in front of a local S3
server (moto) to see how a client behaves against a distant object store.

    python bench/latency_proxy.py --target http://127.0.0.1:5000 --delay-ms 20 --port 5001

Each request waits `delay` before it is forwarded (one connection to the target per proxy
thread, kept alive), then the target's whole response is sent back. Bodies are read by
Content-Length (S3's GETs, HEADs, PUTs of small objects; no chunked uploads).
"""

from __future__ import annotations

import argparse
import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "te", "trailer"}


def make_handler(target: str, delay_s: float) -> type[BaseHTTPRequestHandler]:
    parsed = urlparse(target)
    upstream = threading.local()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            time.sleep(delay_s)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            for attempt in range(2):  # a kept-alive connection the target closed: one new one
                connection = getattr(upstream, "connection", None)
                if connection is None:
                    connection = upstream.connection = http.client.HTTPConnection(parsed.hostname, parsed.port,
                                                                                  timeout=60)
                try:
                    connection.request(self.command, self.path, body=body, headers=headers)
                    response = connection.getresponse()
                    data = response.read()
                    break
                except (ConnectionError, http.client.HTTPException):
                    connection.close()
                    upstream.connection = None
                    if attempt:
                        raise
            self.send_response(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                    self.send_header(key, value)
            length_header = response.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
            self.send_header("Content-Length", length_header or "0")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's signature
            pass

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="the server to forward to, e.g. http://127.0.0.1:5000")
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(args.target, args.delay_ms / 1000))
    server.daemon_threads = True
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
