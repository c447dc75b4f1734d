"""URL and exact-content dedup within one input, and the keys the global stage reuses.

Both keys are stable 64-bit hashes (same in every process). Duplicates across inputs and
workers are removed by the global dedup stage, which groups documents by these keys and
by MinHash LSH bands; the steps here drop what they can early and cheaply.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from lmforge.dataprep.document import Document
from lmforge.dataprep.step_base import BaseFilter
from lmforge.dataprep.step_registry import StepSettings

_TRACKING_PARAM = re.compile(r"^(utm_\w+|fbclid|gclid|mc_cid|mc_eid)$", re.IGNORECASE)
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def stable_hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def normalize_url(url: str) -> str:
    """Lowercase scheme and host, drop `www.`, default ports, fragments, tracking
    parameters and a trailing slash; sort the remaining query parameters."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return url.strip()
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower().removeprefix("www.")
    port = parts.port if _port_ok(parts) else None
    netloc = host if port is None or str(port) == _DEFAULT_PORTS.get(scheme) else f"{host}:{port}"
    query = urlencode(sorted((k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
                             if not _TRACKING_PARAM.match(k)))
    path = parts.path.rstrip("/") or "/"
    return urlunsplit((scheme, netloc, path, query, ""))


def _port_ok(parts) -> bool:
    try:
        return parts.port is not None
    except ValueError:
        return False


def normalize_text(text: str) -> str:
    """Lowercase, whitespace runs collapsed to one space (str.split is ~4x a regex here)."""
    return " ".join(text.lower().split())


def url_key(url: str) -> int:
    return stable_hash64(normalize_url(url).encode("utf-8"))


def content_key(text: str) -> int:
    return stable_hash64(normalize_text(text).encode("utf-8"))


class _SeenKeyFilter(BaseFilter):
    """Drops a document whose key was already seen in this input; records the key in
    `doc.metadata[metadata_key]` for the global stage."""

    metadata_key: str
    reason: str

    Settings = StepSettings

    def __init__(self, settings: StepSettings | None = None, name: str | None = None) -> None:
        super().__init__(name)
        self._seen: set[int] = set()

    def key(self, doc: Document) -> int:
        raise NotImplementedError

    def filter(self, doc: Document) -> tuple[bool, str | None]:
        key = self.key(doc)
        doc.metadata[self.metadata_key] = key
        if key in self._seen:
            return False, self.reason
        self._seen.add(key)
        return True, None


class UrlDedupFilter(_SeenKeyFilter):
    type_name, metadata_key, reason = "url_dedup", "url_key", "duplicate_url"

    def key(self, doc: Document) -> int:
        return url_key(doc.url)


class ExactDedupFilter(_SeenKeyFilter):
    type_name, metadata_key, reason = "exact_dedup", "content_key", "duplicate_content"

    def key(self, doc: Document) -> int:
        return content_key(doc.text)
