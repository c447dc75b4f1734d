"""The HTTP message inside a WARC `response` record: status, headers, payload, and whether it is HTML.

Common Crawl's crawler stores payloads already decoded and renames the headers it undid
(`X-Crawler-Content-Encoding`, `X-Crawler-Transfer-Encoding`); other crawlers store the bytes
as received, so chunked transfer coding and gzip/deflate content coding are undone here, with
the output bounded by `max_bytes`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

HTML_TYPES = ("text/html", "application/xhtml+xml")
SNIFF_BYTES = 1024


class PayloadTooLarge(Exception):
    pass


@dataclass(slots=True)
class HttpResponse:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    payload: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")


def parse_http_response(block: bytes) -> HttpResponse | None:
    """None when the block does not start with an HTTP status line and headers."""
    end = block.find(b"\r\n\r\n")
    sep = 4
    if end < 0:
        end, sep = block.find(b"\n\n"), 2
        if end < 0:
            return None
    lines = block[:end].decode("latin-1").splitlines()
    if not lines:
        return None
    parts = lines[0].split(None, 2)
    if len(parts) < 2 or not parts[0].upper().startswith("HTTP/") or not parts[1].isdigit():
        return None
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    return HttpResponse(int(parts[1]), headers, block[end + sep:])


def is_html(response: HttpResponse, identified_type: str | None = None) -> bool:
    """By the declared Content-Type; with none, by WARC-Identified-Payload-Type or by sniffing."""
    declared = response.content_type.split(";", 1)[0].strip().lower()
    if declared:
        return declared in HTML_TYPES
    if identified_type:
        return identified_type.split(";", 1)[0].strip().lower() in HTML_TYPES
    head = response.payload[:SNIFF_BYTES].lstrip().lower()
    return head.startswith((b"<!doctype html", b"<html")) or b"<html" in head


def decoded_payload(response: HttpResponse, max_bytes: int) -> bytes:
    """The payload with transfer and content codings undone; ValueError when they do not decode."""
    payload = response.payload
    if "chunked" in response.headers.get("transfer-encoding", "").lower():
        payload = _dechunk(payload)
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding in {"gzip", "x-gzip", "deflate"}:
        wbits = 47 if encoding != "deflate" else 15  # 47: gzip or zlib header
        try:
            inflater = zlib.decompressobj(wbits)
            payload = inflater.decompress(payload, max_bytes + 1)
        except zlib.error:
            if encoding != "deflate":
                raise ValueError("bad gzip content encoding") from None
            payload = zlib.decompressobj(-15).decompress(response.payload, max_bytes + 1)  # raw deflate
    if len(payload) > max_bytes:
        raise PayloadTooLarge
    return payload


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    pos = 0
    while pos < len(data):
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            break
        size_text = data[pos:eol].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            return data  # not chunked after all (the header stayed, the coding was undone)
        if size == 0:
            break
        out += data[eol + 2: eol + 2 + size]
        pos = eol + 2 + size + 2
    return bytes(out)
