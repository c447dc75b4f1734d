"""Read WET `conversion` records and WARC `response` records (HTML) with warcio, surviving bad input.

A WET record's text is the document. A WARC response is a document when it is an HTTP 2xx
answer with HTML (Content-Type, else WARC-Identified-Payload-Type, else sniffed): its payload
is decoded with the declared or detected charset and its main text extracted
(lmforge.dataprep.html_text; `ReaderConfig.extractor`). `ReaderConfig.format` picks which
record types are documents (auto: both, so one reader takes WET and WARC inputs alike).

Every record is accounted for in the `read` step's stats: `docs_in` counts every document
record met (kept: `docs_out`; rejected: `dropped` by reason, also those dropped while the
reader resynchronises), and the counters add `records_read` (WARC records of any type),
`records_not_conversion` (warcinfo, request, metadata and the like: skipped, not documents;
also per type as `skipped:<type>`), `skipped:non_html` / `skipped:http_status` /
`skipped:response_not_http` (responses that are not pages), `input_files`,
`unreadable_inputs` (could not be opened) and `unparseable_inputs` (opened, but not one WARC
record in them). An HTML page that yields no text is dropped with its reason, also counted as
`html:<reason>`: `html_too_large` (over max_html_bytes), `bad_content_encoding`,
`undecodable_html`, `extractor_error`; `charset_from:<http|meta|bom|detected|default>`
counts where each page's charset came from. A document record whose block (Content-Length) is
over `max_record_bytes` is dropped as `record_too_large` (when it is all there) without being
held: it is read through a MiB at a time, and warcio inflates 16 KiB of gzip at a time (16 MiB
at zlib's highest ratio), so a worker's memory does not grow with a record's size.

Bad input is counted per kind in the `read` step's counters (`bad_input:<kind>`) and the
rest of the file is still processed:
- `unreadable`: the input cannot be opened (after retries) or the stream breaks;
- `empty_file`: no bytes, or no records at all;
- `not_gzip` / `not_warc`: not one WARC record in it: text that is not gzip although named
  .gz, or not WARC (warcio would take a line of it for an old ARC record);
- `truncated_gzip` / `truncated_record`: the body is shorter than its Content-Length;
- `bad_content_length`: a record not followed by the blank lines its Content-Length
  promises (warcio then loses sync); the record is dropped and, on seekable inputs, reading
  resumes at the next record (`WARC/1.` line, or gzip member for .gz); what follows it is read
  in lines of at most MAX_LINE_BYTES, however long its lines are;
- `corrupt_gzip`: undecodable compressed data; resync as above;
- `non_utf8`: a body that is not UTF-8 (dropped, never replaced with U+FFFD).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from warcio.archiveiterator import ArchiveIterator
from warcio.bufferedreaders import DecompressingBufferedReader
from warcio.exceptions import ArchiveLoadFailed

from lmforge.common.errors import InputError
from lmforge.common.logging import get_logger
from lmforge.common.retry import RetryPolicy
from lmforge.common.storage import open_input
from lmforge.dataprep.config import ReaderConfig
from lmforge.dataprep.document import Document, make_doc_id
from lmforge.dataprep.html_text import decode_html, make_extractor
from lmforge.dataprep.step_base import PipelineStep
from lmforge.dataprep.warc_http import HttpResponse, PayloadTooLarge, decoded_payload, is_html, parse_http_response

BAD_INPUT_PREFIX = "bad_input:"  # counters of the read step: bad_input:<kind>
SKIPPED_PREFIX = "skipped:"  # records that are not documents: skipped:<record type or reason>
# The records read as documents, per ReaderConfig.format: WET holds `conversion` records (text),
# WARC `response` records (HTTP + HTML); `auto` reads whichever the input holds.
DOCUMENT_RECORD_TYPES = {"wet": {"conversion"}, "warc": {"response"}, "auto": {"conversion", "response"}}
GZIP_MAGIC = b"\x1f\x8b\x08"
WARC_LINE = b"WARC/1."
SCAN_CHUNK = 1 << 20
MAX_LINE_BYTES = 1 << 20  # a WARC header line, or the line after a record, read longer is cut into pieces
OPEN_BACKOFF_SECONDS = 0.2  # the first retry's wait at most; doubles, with full jitter
OPEN_BACKOFF_MAX_SECONDS = 5.0


class _NotWarc(Exception):
    """warcio parsed something that is not a WARC record (it reads ARC too, and takes almost
    any line of text for an ARC header)."""


class _LineBoundedReader(DecompressingBufferedReader):
    """warcio's reader with lines cut at MAX_LINE_BYTES: after a wrong Content-Length, warcio reads
    the next line whole (a 50 MB one-line body: held, and joined 16 KiB at a time); in pieces,
    they fail to parse as a record and the reader resynchronises past them."""

    def readline(self, length=None):
        return super().readline(MAX_LINE_BYTES if length is None else min(length, MAX_LINE_BYTES))


class _QuietArchiveIterator(ArchiveIterator):
    # warcio writes a warning to stderr for a record not followed by blank lines; we count
    # the same event through err_count instead.
    INC_RECORD = ""
    # warcio ends silently on a gzip member cut short; remember whether the last one ended.
    truncated_member = False

    def __init__(self, fileobj, **kwargs):
        super().__init__(fileobj, **kwargs)
        self.reader = _LineBoundedReader(self.fh, block_size=self.reader.block_size)

    def close(self):
        decompressor = self.reader.decompressor if self.reader else None
        if decompressor is not None and not decompressor.eof:
            self.truncated_member = True
        super().close()


@dataclass(slots=True)
class _Record:
    index: int
    start: int
    url: str
    body: bytes
    size: int  # of the block as read: the body's, or what was read through of one too large to keep
    content_length: int
    headers: dict[str, str]
    rec_type: str = "conversion"
    followed: bool = False  # another record was parsed after this one
    too_large: bool = False  # over max_record_bytes: its body was not kept


class WetReader(PipelineStep):
    """Source step: yields one Document per WET `conversion` record of one input."""

    type_name = "read"

    def __init__(self, config: ReaderConfig | None = None):
        super().__init__()
        self.config = config or ReaderConfig()
        self._document_types = DOCUMENT_RECORD_TYPES[self.config.format]
        self._extractor = None  # built at the first HTML page: WET input never imports an extractor

    def run(self, docs=None, rank: int = 0, world_size: int = 1) -> Iterator[Document]:
        raise TypeError("WetReader is a source: use read(uri, input_index)")

    def count_bad(self, kind: str, n: int = 1) -> None:
        self.stats.counters[BAD_INPUT_PREFIX + kind] += n

    def read(self, uri: str, input_index: int) -> Iterator[Document]:
        """Yield the documents of one input; time spent downstream is not counted here."""
        stats = self.stats
        start = time.perf_counter()
        stats.counters["input_files"] += 1
        fh = self._open(uri)
        if fh is None:
            stats.seconds += time.perf_counter() - start
            return
        gz = uri.endswith(".gz")
        try:
            for record in self._records(fh, gz, input_index):
                http = None
                if record.rec_type == "response" and not record.too_large:
                    http = parse_http_response(record.body)
                    skip = self._response_skip(record, http)
                    if skip:
                        stats.counters[SKIPPED_PREFIX + skip] += 1
                        continue
                stats.docs_in += 1
                stats.bytes_in += record.size
                doc = Document(make_doc_id(input_index, record.index), record.url, "", {})
                if record.size < record.content_length:
                    # Short with records after it: its Content-Length is wrong; at the end: cut off.
                    kind = "bad_content_length" if record.followed else ("truncated_gzip" if gz else "truncated_record")
                    self.count_bad(kind)
                    self.drop(doc, "bad_content_length" if record.followed else "truncated")
                    continue
                if record.too_large:
                    self.drop(doc, "record_too_large")
                    continue
                if http is not None:
                    text, reason = self._html_text(http, doc)
                    if reason:
                        self.drop(doc, reason)
                        continue
                else:
                    try:
                        text = record.body.decode("utf-8")
                    except UnicodeDecodeError:
                        self.count_bad("non_utf8")
                        self.drop(doc, "non_utf8")
                        continue
                text = text.strip()
                if len(text) < self.config.min_text_chars:
                    self.drop(doc, "empty_text")
                    continue
                doc.text = text
                doc.metadata["warc_date"] = record.headers.get("WARC-Date", "")
                doc.metadata["warc_record_id"] = record.headers.get("WARC-Record-ID", "")
                if record.headers.get("WARC-Truncated"):  # the crawler cut the payload (Common Crawl: at 1 MiB)
                    doc.metadata["warc_truncated"] = record.headers["WARC-Truncated"]
                stats.docs_out += 1
                stats.bytes_out += doc.nbytes
                stats.seconds += time.perf_counter() - start
                yield doc
                start = time.perf_counter()
        finally:
            stats.counters["input_bytes"] += getattr(fh, "_lmforge_bytes_read", 0)
            fh.close()
            stats.seconds += time.perf_counter() - start

    def _response_skip(self, record: _Record, http: HttpResponse | None) -> str | None:
        """Why a response record is not a document (None: it is an HTML page)."""
        if http is None:
            return "response_not_http"
        if not 200 <= http.status < 300:
            return "http_status"
        if not is_html(http, record.headers.get("WARC-Identified-Payload-Type")):
            return "non_html"
        return None

    def _html_text(self, http: HttpResponse, doc: Document) -> tuple[str, str | None]:
        """The page's main text, or a drop reason (counted under `html:<reason>`)."""
        counters = self.stats.counters
        try:
            payload = decoded_payload(http, self.config.max_html_bytes)
        except PayloadTooLarge:
            reason = "html_too_large"
        except ValueError:
            reason = "bad_content_encoding"
        else:
            decoded = decode_html(payload, http.content_type)
            if decoded is None:
                reason = "undecodable_html"
            else:
                counters["charset_from:" + decoded.charset_source] += 1
                if decoded.replaced:
                    counters["html_chars_replaced"] += decoded.replaced
                doc.metadata["content_type"] = http.content_type
                doc.metadata["charset"] = decoded.charset
                try:
                    return self._extract(decoded.html), None
                except Exception as exc:  # noqa: BLE001 - one page's extractor failure must not end the input
                    counters["extractor_errors"] += 1
                    self.last_error = f"extractor failed on {doc.url}: {exc!r}"[:500]
                    reason = "extractor_error"
        counters["html:" + reason] += 1
        return "", reason

    @property
    def _extract(self):
        if self._extractor is None:
            config = self.config
            self._extractor = make_extractor(config.extractor, main_content=config.main_content,
                                             prune_boilerplate=config.prune_boilerplate,
                                             trafilatura_mode=config.trafilatura_mode)
        return self._extractor

    def _drop_record(self, input_index: int, record: _Record, reason: str) -> None:
        """Reject a record that was never yielded; it is counted in like every other."""
        self.stats.docs_in += 1
        self.stats.bytes_in += record.size
        self.drop(Document(make_doc_id(input_index, record.index), record.url, ""), reason)

    def _open(self, uri: str) -> BinaryIO | None:
        remote = "://" in uri  # a local file will not appear by retrying
        retry = RetryPolicy(self.config.open_attempts, OPEN_BACKOFF_SECONDS, OPEN_BACKOFF_MAX_SECONDS,
                            retryable=lambda exc: remote and isinstance(exc, InputError),
                            log=get_logger("dataprep"), event="input_open_retry")
        try:
            return _CountingReader(retry.call(f"open {uri}", lambda: open_input(uri), uri=uri))
        except InputError as exc:
            self.count_bad("unreadable")
            self.stats.counters["unreadable_inputs"] += 1
            self.last_error = str(exc)
            return None

    def _records(self, fh: _CountingReader, gz: bool, input_index: int) -> Iterator[_Record]:
        """Conversion records in order; drops a record whose length turned out wrong."""
        counters = self.stats.counters
        index = 0
        position = 0
        saw_any = False  # a WARC record was parsed in this input
        first_attempt = True
        seekable = fh.seekable()
        while True:
            iterator = _QuietArchiveIterator(fh, no_record_parse=True)
            pending: _Record | None = None
            errors_at_pending = 0
            failure: str | None = None
            last_start: int | None = None  # of the last record parsed in this attempt
            try:
                for record in iterator:
                    if record.format != "warc":
                        raise _NotWarc
                    saw_any = True
                    last_start = iterator.offset
                    counters["records_read"] += 1
                    if pending is not None:
                        pending.followed = True
                        if iterator.err_count > errors_at_pending:
                            self.count_bad("bad_content_length")
                            self._drop_record(input_index, pending, "bad_content_length")
                        else:
                            yield pending
                        pending = None
                    if record.rec_type not in self._document_types:
                        counters["records_not_conversion"] += 1
                        counters[SKIPPED_PREFIX + (record.rec_type or "unknown")] += 1
                        continue
                    length = _content_length(record.rec_headers.get_header("Content-Length"))
                    too_large = length is not None and length > self.config.max_record_bytes
                    # the whole block (HTTP headers too: no_record_parse), never more than the bound
                    # (warcio reads a record without a Content-Length to the end of the input)
                    body = b"" if too_large else record.raw_stream.read(self.config.max_record_bytes)
                    current = _Record(
                        index=index,
                        start=iterator.offset,
                        url=record.rec_headers.get_header("WARC-Target-URI") or "",
                        body=body,
                        size=_read_through(record.raw_stream) if too_large else len(body),
                        content_length=length or 0,
                        headers=dict(record.rec_headers.headers),
                        rec_type=record.rec_type,
                        too_large=too_large,
                    )
                    index += 1
                    if length is None:  # not a number: whatever warcio read as its body is a guess
                        self.count_bad("bad_content_length")
                        self._drop_record(input_index, current, "bad_content_length")
                        continue
                    pending = current
                    errors_at_pending = iterator.err_count
            except (ArchiveLoadFailed, _NotWarc):
                failure = "bad_content_length" if pending is not None else "corrupt_record"
            except (zlib.error, EOFError):
                failure = "corrupt_gzip" if gz else "bad_content_length"
            except OSError:
                failure = "unreadable"
            if failure is None:
                if pending is not None and iterator.truncated_member:
                    self._drop_record(input_index, pending, "truncated")
                    pending = None
                if pending is not None:
                    if iterator.err_count > errors_at_pending:
                        self.count_bad("bad_content_length")
                        self._drop_record(input_index, pending, "bad_content_length")
                    else:
                        yield pending
                if not saw_any and fh.bytes_read == 0:
                    self.count_bad("empty_file")
                elif iterator.truncated_member:
                    self.count_bad("truncated_gzip")
                elif not saw_any and first_attempt:  # (after a failure, that one was counted)
                    self.count_bad("empty_file")
                if not saw_any:
                    counters["unparseable_inputs"] += 1
                return
            # The record before the failure is suspect: its length made the parser lose sync. Else
            # resume after the last record parsed (never before it: that would read it twice).
            if pending is not None:
                self._drop_record(input_index, pending, failure)
                position = pending.start
            elif last_start is not None:
                position = last_start
            # A retry that fails again at once is still in the same bad stretch: counted once.
            counted = first_attempt or last_start is not None
            first_attempt = False
            resume_at = None
            if seekable and failure != "unreadable":
                resume_at = _find_next_record(fh, position + 1, gz)
            if resume_at is None and not saw_any:
                counters["unparseable_inputs"] += 1
                if failure == "corrupt_record":  # nothing in it was WARC
                    failure = "not_gzip" if gz and not fh.head.startswith(GZIP_MAGIC[:2]) else "not_warc"
                    counted = True
            if counted:
                self.count_bad(failure)
            if resume_at is None:
                return
            position = resume_at
            fh.seek(resume_at)


def _content_length(header: str | None) -> int | None:
    try:
        return int(header or 0)
    except ValueError:
        return None


def _read_through(stream) -> int:
    """Bytes left in a record's block, read and let go a MiB at a time."""
    size = 0
    while chunk := stream.read(SCAN_CHUNK):
        size += len(chunk)
    return size


def _find_next_record(fh: BinaryIO, start: int, gz: bool) -> int | None:
    """Offset of the next gzip member (gz) or `WARC/1.` line (plain) at or after `start`."""
    needle = GZIP_MAGIC if gz else b"\n" + WARC_LINE
    fh.seek(start)
    offset = start
    carry = b""
    while True:
        chunk = fh.read(SCAN_CHUNK)
        if not chunk:
            return None
        data = carry + chunk
        hit = data.find(needle)
        if hit >= 0:
            found = offset - len(carry) + hit
            return found if gz else found + 1
        carry = data[-(len(needle) - 1) :]
        offset += len(chunk)


class _CountingReader:
    """Wraps a binary stream, counting bytes read (for MB/s figures) and exposing seek
    only when the underlying stream supports it."""

    def __init__(self, raw):
        self._raw = raw
        self._position = 0
        self._lmforge_bytes_read = 0  # high-water mark: bytes of the input covered
        self.head = b""  # the input's first bytes (is it gzip?)

    @property
    def bytes_read(self) -> int:
        return self._lmforge_bytes_read

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size) if size is not None and size >= 0 else self._raw.read()
        if self._position == 0 and not self.head:
            self.head = data[:4]
        self._position += len(data)
        self._lmforge_bytes_read = max(self._lmforge_bytes_read, self._position)
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seekable(self) -> bool:
        try:
            return bool(self._raw.seekable())
        except AttributeError:
            return False

    def tell(self) -> int:
        if not self.seekable():
            raise OSError("not seekable")
        return self._raw.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        self._position = self._raw.seek(offset, whence)
        return self._position

    def close(self) -> None:
        self._raw.close()
