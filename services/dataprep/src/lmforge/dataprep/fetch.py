"""Download the first N WET (or WARC) files of a Common Crawl crawl, resumably.

    paths = fetch_crawl("CC-MAIN-2024-22", shards=2, output=Path("data/wet"))
    paths = fetch_crawl("CC-MAIN-2024-22", shards=1, output=Path("data/warc"), kind="warc")

The crawl's listing `crawl-data/<crawl>/<kind>.paths.gz` (wet.paths.gz, warc.paths.gz) is saved
as `<output>/<kind>.paths.gz`, then its first N files as `<output>/<basename>`. From https:// (the default,
data.commoncrawl.org) a transfer cut short stays in `<name>.part` and the next attempt,
or the next run, continues it with an HTTP Range request. A file only gets its final
name once its gzip stream reads through to the end (and its size matches Content-Length),
so a rerun skips every finished file and downloads nothing twice. From s3:// the object
is downloaded by the Store over the base URL (lmforge.common.storage: parallel ranged GETs,
each retried) into `.part`, then checked and renamed the same way; the store says what an
error means (no such object, access denied, or worth another attempt). A failed attempt at a
file is retried by the one retry policy (lmforge.common.retry) with FETCH_RETRY's settings:
5 tries, waits of full jitter under a doubling cap.
"""

from __future__ import annotations

import gzip
import http.client
import os
import re
import urllib.error
import urllib.request
import zlib
from pathlib import Path, PurePosixPath
from time import monotonic

from lmforge.common.errors import InputError
from lmforge.common.logging import StructLogger, get_logger
from lmforge.common.retry import RetrySettings
from lmforge.common.storage import HTTP_TIMEOUT_S, open_store
from lmforge.common.store import AccessDenied, ObjectMissing, Store

DEFAULT_BASE_URL = "https://data.commoncrawl.org"
KINDS = ("wet", "warc")  # Common Crawl's listings <kind>.paths.gz; WARC files hold the HTML responses
CRAWL_ID = re.compile(r"CC-MAIN-\d{4}-\d{2}")
USER_AGENT = "lmforge-dataprep/0.1 (fetch)"
CHUNK_BYTES = 1 << 20

FETCH_RETRY = RetrySettings(attempts=5, backoff_seconds=1.0, backoff_max_seconds=30.0)  # waits of at most 1, 2, 4, 8 s
RETRYABLE_HTTP_STATUS = frozenset({408, 425, 429})
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class _TransientError(Exception):
    """A failure worth another attempt: connection trouble, 5xx, a short or corrupt transfer."""


class _RangeNotSatisfiable(Exception):
    """HTTP 416 to a Range request: the partial file already reaches (or passes) the end."""

    def __init__(self, content_range: str):
        super().__init__(content_range)
        self.content_range = content_range


def fetch_crawl(
    crawl: str,
    shards: int,
    output: Path,
    *,
    base_url: str = DEFAULT_BASE_URL,
    log: StructLogger | None = None,
    kind: str = "wet",
) -> list[Path]:
    """Download the first `shards` files of `kind` (wet, warc) of `crawl` into `output`; return their local paths."""
    if not CRAWL_ID.fullmatch(crawl or ""):
        raise InputError(f"crawl id must look like CC-MAIN-YYYY-WW (e.g. CC-MAIN-2024-22), got {crawl!r}")
    if shards < 1:
        raise InputError(f"shards must be at least 1, got {shards}")
    if kind not in KINDS:
        raise InputError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    log = log or get_logger("dataprep")
    source = _source_for(base_url)
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)

    listing = output / f"{kind}.paths.gz"
    if listing.exists() and not _listing_is_for(listing, crawl):
        log.info("fetch_listing_replaced", file=str(listing), crawl=crawl)
        listing.unlink()
    _fetch_file(source, f"crawl-data/{crawl}/{kind}.paths.gz", listing, log)
    paths = _first_paths(listing, shards, crawl, kind)

    targets = []
    for rel in paths:
        target = output / PurePosixPath(rel).name
        _fetch_file(source, rel, target, log)
        targets.append(target)
    return targets


# ---------------------------------------------------------------- listing


def _read_listing(listing: Path) -> list[str]:
    with gzip.open(listing, "rt", encoding="utf-8") as fh:
        return [line.strip() for line in fh if line.strip()]


def _listing_is_for(listing: Path, crawl: str) -> bool:
    try:
        paths = _read_listing(listing)
    except (OSError, EOFError, UnicodeDecodeError, zlib.error):
        return False
    return bool(paths) and paths[0].startswith(f"crawl-data/{crawl}/")


def _first_paths(listing: Path, shards: int, crawl: str, kind: str = "wet") -> list[str]:
    paths = _read_listing(listing)
    if len(paths) < shards:
        raise InputError(f"{crawl} lists {len(paths)} {kind.upper()} files, fewer than the {shards} asked for")
    for rel in paths[:shards]:
        if not rel.startswith("crawl-data/") or ".." in PurePosixPath(rel).parts:
            raise InputError(f"unexpected path in the {crawl} listing: {rel!r}")
    return paths[:shards]


# ---------------------------------------------------------------- one file


def _part_path(target: Path) -> Path:
    return target.with_name(target.name + ".part")


def _fetch_file(source, rel: str, target: Path, log: StructLogger) -> None:
    """Download `rel` to `target` unless it is already there, retrying transient failures."""
    url = source.url_of(rel)
    if target.exists():
        log.info("fetch_skipped", url=url, file=str(target), bytes=target.stat().st_size)
        return
    part = _part_path(target)
    resume_from = part.stat().st_size if part.exists() else 0
    log.info("fetch_started", url=url, file=str(target), resume_from=resume_from)
    started = monotonic()
    retry = FETCH_RETRY.policy(log=log, event="fetch_retry", retryable=lambda exc: isinstance(exc, _TransientError))

    def attempt() -> None:
        source.download(rel, part, log)
        _verify_gzip(part)

    try:
        retry.call(f"download {url}", attempt, url=url)
    except _TransientError as exc:
        raise InputError(f"cannot download {url} after {FETCH_RETRY.attempts} attempts: {exc}") from exc
    os.replace(part, target)
    log.info(
        "fetch_finished",
        url=url,
        file=str(target),
        bytes=target.stat().st_size,
        seconds=round(monotonic() - started, 3),
    )


def _verify_gzip(path: Path) -> None:
    """Read the whole (multi-member) gzip stream. A stream that just stops early is kept to be
    continued; one that does not decode is deleted so that the next attempt starts over."""
    if path.stat().st_size == 0:
        path.unlink()
        raise _TransientError("empty download")
    try:
        with gzip.open(path, "rb") as fh:
            while fh.read(CHUNK_BYTES):
                pass
    except EOFError as exc:
        raise _TransientError(f"gzip stream ends early ({exc})") from exc
    except (OSError, zlib.error) as exc:
        path.unlink(missing_ok=True)
        raise _TransientError(f"corrupt gzip stream ({exc}); starting over") from exc


def _source_for(base_url: str):
    scheme = base_url.split("://", 1)[0].lower() if "://" in base_url else ""
    if scheme in {"http", "https"}:
        return _HttpSource(base_url)
    if scheme == "s3":
        return _StoreSource(base_url)
    raise InputError(f"base_url must be an http(s):// URL or an s3:// bucket, got {base_url!r}")


# ---------------------------------------------------------------- http(s)


class _HttpSource:
    def __init__(self, base_url: str):
        self.base_url = base_url.rstrip("/")

    def url_of(self, rel: str) -> str:
        return f"{self.base_url}/{rel}"

    def download(self, rel: str, part: Path, log: StructLogger) -> None:
        """Bring `part` up to the full file, continuing from its current size when the server allows."""
        url = self.url_of(rel)
        offset = part.stat().st_size if part.exists() else 0
        try:
            response = _open(url, offset)
        except _RangeNotSatisfiable as exc:
            _accept_range_end(url, part, offset, exc.content_range)
            return
        with response:
            if offset and response.status != 206:
                log.info("fetch_restart", url=url, reason=f"server answered {response.status} to a Range request")
                offset = 0
            try:
                total = _expected_total(url, response, offset)
            except _TransientError:
                part.unlink(missing_ok=True)
                raise
            _copy_body(response, part, append=offset > 0)
        size = part.stat().st_size
        if total is not None and size != total:
            raise _TransientError(f"transfer ended at {size} of {total} bytes")


def _open(url: str, offset: int) -> http.client.HTTPResponse:
    headers = {"User-Agent": USER_AGENT}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - scheme checked in _source_for
    try:
        return urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S)  # noqa: S310
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 404:
            raise InputError(f"not found (HTTP 404): {url}") from exc
        if exc.code == 416 and offset:
            raise _RangeNotSatisfiable(exc.headers.get("Content-Range", "")) from exc
        if exc.code >= 500 or exc.code in RETRYABLE_HTTP_STATUS:
            raise _TransientError(f"HTTP {exc.code} from {url}") from exc
        raise InputError(f"HTTP {exc.code} from {url}: {exc.reason}") from exc
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise _TransientError(f"cannot connect to {url}: {exc}") from exc


def _accept_range_end(url: str, part: Path, offset: int, content_range: str) -> None:
    """After a 416, keep `part` only if it is exactly as long as the file ("bytes */<size>")."""
    match = re.fullmatch(r"bytes \*/(\d+)", content_range.strip())
    if match and int(match.group(1)) == offset:
        return
    part.unlink(missing_ok=True)
    raise _TransientError(f"the partial download of {url} does not fit the file on the server")


def _expected_total(url: str, response: http.client.HTTPResponse, offset: int) -> int | None:
    """The full file size the transfer should end at, when the server says."""
    if response.status == 206:
        match = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
        if not match or int(match.group(1)) != offset:
            raise _TransientError(f"unexpected Content-Range from {url}: {response.headers.get('Content-Range')!r}")
        return None if match.group(3) == "*" else int(match.group(3))
    length = response.headers.get("Content-Length")
    return int(length) if length and length.isdigit() else None


def _copy_body(response: http.client.HTTPResponse, part: Path, *, append: bool) -> None:
    """Stream the body into `part`; what arrived before a failure stays there for the next attempt."""
    with open(part, "ab" if append else "wb") as fh:
        try:
            while block := response.read(CHUNK_BYTES):
                fh.write(block)
        except (OSError, http.client.HTTPException) as exc:
            raise _TransientError(f"transfer interrupted: {exc}") from exc
        finally:
            fh.flush()
            os.fsync(fh.fileno())


# ---------------------------------------------------------------- s3


class _StoreSource:
    """An s3:// base URL, read through its Store (made on first use)."""

    def __init__(self, base_url: str):
        self.base_url = base_url.rstrip("/")
        self._store: Store | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = open_store(self.base_url)
        return self._store

    def url_of(self, rel: str) -> str:
        return f"{self.base_url}/{rel}"

    def download(self, rel: str, part: Path, log: StructLogger) -> None:
        try:
            self.store.download(rel, part)
        except Exception as exc:
            failure = self.store.failure(exc, "download", rel)
            if failure is None:  # not the store's: the local disk's, say
                raise
            if isinstance(failure, ObjectMissing):
                raise InputError(f"not found: {self.url_of(rel)}") from exc
            if isinstance(failure, AccessDenied):
                raise InputError(f"access denied: {self.url_of(rel)}") from exc
            raise _TransientError(f"S3 error for {self.url_of(rel)}: {exc}") from exc
