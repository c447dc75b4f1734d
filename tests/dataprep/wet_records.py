"""Build WET files record by record for tests (plain and gzip-per-record)."""

from __future__ import annotations

import gzip


def wet_record(url: str, body: bytes, *, content_length: int | None = None, rec_type: str = "conversion") -> bytes:
    length = len(body) if content_length is None else content_length
    headers = [
        "WARC/1.0",
        f"WARC-Type: {rec_type}",
        f"WARC-Target-URI: {url}",
        "WARC-Date: 2024-05-18T01:58:10Z",
        f"WARC-Record-ID: <urn:uuid:{abs(hash(url)) % 10**12:012d}-0000-0000-0000-000000000000>",
        "Content-Type: text/plain",
        f"Content-Length: {length}",
    ]
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body + b"\r\n\r\n"


def gz_member(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def english(i: int) -> bytes:
    return (f"Document number {i} talks about the weather and the garden. " * 12).encode()
