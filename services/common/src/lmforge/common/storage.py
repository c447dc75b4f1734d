"""Where bytes live: local paths, http(s) URLs and s3:// URIs. The one storage layer's front door:

- `open_store(uri)` gives the Store (lmforge.common.store) for a local directory or an s3://
  prefix: atomic writes, verified uploads, downloads, ranged reads, listings with ages, and
  one error mapping (LocalStore in local_store.py, S3Store in s3_store.py);
- `open_input(uri)` streams one input (WET file, listing) from any of the three kinds of place;
- the inputs' expansion (globs, s3:// globs) and sizes, and files' sha256.

Each name is imported from its home (the Store and its errors from store.py, the atomic local
writes from atomic_files.py), never through here.

Every s3:// request goes through lmforge.common.s3 (verified multipart uploads, parallel ranged
downloads, the one retry policy).
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import http.client
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, BinaryIO

from lmforge.common.errors import InputError, StorageError
from lmforge.common.local_store import LocalStore
from lmforge.common.s3 import S3Bucket, S3Location
from lmforge.common.s3_store import S3Store
from lmforge.common.store import Store, local_path_of, scheme_of

HTTP_TIMEOUT_S = 60


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------- inputs


def expand_inputs(patterns: list[str]) -> list[str]:
    """Expand local globs and s3:// globs into a sorted, de-duplicated list of URIs.
    http(s) URLs are taken as they are. A pattern that matches nothing is an error."""
    return [uri for uri, _ in expand_inputs_with_sizes(patterns)]


def expand_inputs_with_sizes(patterns: list[str]) -> list[tuple[str, int | None]]:
    """expand_inputs, each URI with its size in bytes where the expansion learns it (a local file,
    an object an s3:// glob listed), else None (http(s) URLs, s3:// URIs without a glob)."""
    found: dict[str, int | None] = {}
    for pattern in patterns:
        scheme = scheme_of(pattern)
        if scheme in {"http", "https"}:
            found.setdefault(pattern, None)
        elif scheme == "s3":
            for uri, size in _expand_s3(pattern):
                found[uri] = size if size is not None else found.get(uri)
        else:
            path = str(local_path_of(pattern))
            if not glob.has_magic(path) and not os.path.exists(path):
                raise InputError(f"input not found: {pattern}")
            matches = sorted(glob.glob(path, recursive=True)) if glob.has_magic(path) else [path]
            matches = [m for m in matches if not os.path.isdir(m)]
            if not matches:
                raise InputError(f"input pattern matched no files: {pattern}")
            found.update((m, input_size(m)) for m in matches)
    return sorted(found.items())


def _expand_s3(pattern: str) -> list[tuple[str, int | None]]:
    loc = S3Location.parse(pattern)
    if not glob.has_magic(loc.key):
        return [(pattern, None)]
    prefix = loc.key[: min(loc.key.index(c) for c in "*?[" if c in loc.key)]
    listed = S3Bucket(loc.bucket).listing(prefix)
    matches = [(f"s3://{loc.bucket}/{k}", listed[k].size) for k in sorted(listed) if fnmatch.fnmatchcase(k, loc.key)]
    if not matches:
        raise InputError(f"input pattern matched no objects: {pattern}")
    return matches


def open_input(uri: str) -> BinaryIO:
    """Open an input for streaming reads. Raises InputError when it cannot be opened."""
    scheme = scheme_of(uri)
    try:
        if scheme in {"http", "https"}:
            request = urllib.request.Request(uri, headers={"User-Agent": "lmforge/0.1"})  # noqa: S310
            return urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S)  # noqa: S310 - http(s) only here
        if scheme == "s3":
            loc = S3Location.parse(uri)
            return S3Bucket(loc.bucket).open_stream(loc.key)  # botocore StreamingBody: read(n), close()
        return open(local_path_of(uri), "rb")
    except (OSError, ValueError, http.client.HTTPException) as exc:  # ValueError: a malformed URL or path
        raise InputError(f"cannot open input {uri}: {exc}") from exc
    except Exception as exc:  # botocore ClientError, EndpointConnectionError, ...
        if type(exc).__module__.startswith("botocore"):
            raise InputError(f"cannot open input {uri}: {exc}") from exc
        raise


def input_size(uri: str) -> int | None:
    """Size in bytes when it is cheap to know (local files), else None."""
    if scheme_of(uri) == "file":
        try:
            return local_path_of(uri).stat().st_size
        except OSError:
            return None
    return None


# ---------------------------------------------------------------- output stores


def open_store(uri: str | Path, **s3_options: Any) -> Store:
    """The store at `uri`: an s3:// prefix, a file:// URI (the store keeps that name) or a local
    path. `s3_options`: S3Bucket's (endpoint_url, part_size, concurrency, timeouts, retry,
    credentials), for an s3:// store only."""
    uri = str(uri)
    if scheme_of(uri) == "s3":
        return S3Store(uri, **s3_options)
    if scheme_of(uri) in {"http", "https"}:
        raise StorageError(f"cannot write output to an http(s) URL: {uri}")
    return LocalStore(local_path_of(uri), uri if uri.startswith("file://") else None)
