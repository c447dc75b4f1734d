"""The baseline file: the eval result of a known-good deployment, as JSON, at a local path or an
s3:// URI (lmforge.common.storage; credentials and endpoint from the standard AWS chain).

    {"format_version": 1, "kind": "lmforge-canary-baseline", "recorded": "2025-…Z",
     "model": "…", "endpoint": "…", "eval_set": {"name": "…", "sha256": "…"},
     "perplexity": 1.04, "tokens": 278, "score": 1.0, "checks_passed": 10, "checks_total": 10,
     "held_out": [{"id", "tokens", "total_logprob", "perplexity"}, …],
     "checks": [{"id", "passed", "output", "finish_reason"}, …], "started": "…", "seconds": 1.2}

Writes are atomic (temp file + rename; a single PUT on S3). A missing baseline is not an
error (`read_baseline` returns None); an unreadable store is StorageError (exit 4), a file
that is not a baseline is InputError (exit 3)."""

from __future__ import annotations

import datetime as dt
import json
import posixpath
from typing import Literal

from pydantic import ValidationError

from lmforge.canary.evalset import EvalSet
from lmforge.canary.evaluate import EvalResult
from lmforge.common.config import format_validation_error
from lmforge.common.errors import InputError, LmforgeError, StorageError
from lmforge.common.local_store import LocalStore
from lmforge.common.s3 import S3Location
from lmforge.common.storage import open_store
from lmforge.common.store import Store, local_path_of, scheme_of

FORMAT_VERSION = 1
KIND = "lmforge-canary-baseline"


class Baseline(EvalResult):
    format_version: Literal[1] = FORMAT_VERSION
    kind: Literal["lmforge-canary-baseline"] = KIND
    recorded: str


def _split(uri: str) -> tuple[Store, str]:
    """(the store holding `uri`, the file's name in it)."""
    scheme = scheme_of(uri)
    if scheme in ("http", "https"):
        raise InputError(f"baseline {uri}: expected a local path or an s3:// URI")
    if scheme == "s3":
        loc = S3Location.parse(uri)
        if not loc.key or loc.key.endswith("/"):
            raise InputError(f"baseline {uri}: expected s3://BUCKET/KEY (a file, not a prefix)")
        parent, name = posixpath.split(loc.key)
        return open_store(f"s3://{loc.bucket}/{parent}"), name
    path = local_path_of(uri)
    if not path.name or path.is_dir():
        raise InputError(f"baseline {uri}: is a directory; expected a file path")
    return LocalStore(path.parent), path.name


def _store_error(uri: str, exc: Exception) -> StorageError:
    return StorageError(f"baseline {uri}: {type(exc).__name__}: {exc}")


def read_baseline(uri: str) -> Baseline | None:
    """The baseline at `uri`, or None when there is none there."""
    store, name = _split(uri)
    try:
        if not store.exists(name):
            return None
        data = store.read_bytes(name)
    except LmforgeError:
        raise
    except Exception as exc:  # botocore connection errors and the like
        raise _store_error(uri, exc) from exc
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"baseline {uri}: not valid JSON: {exc}") from exc
    if not isinstance(body, dict) or body.get("kind") != KIND:
        raise InputError(f"baseline {uri}: not an lmforge canary baseline (no \"kind\": \"{KIND}\")")
    try:
        return Baseline.model_validate(body)
    except ValidationError as exc:
        raise InputError(format_validation_error(exc, f"baseline {uri}")) from exc


def write_baseline(uri: str, result: EvalResult) -> Baseline:
    baseline = Baseline(**result.model_dump(), recorded=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
    body = {"format_version": baseline.format_version, "kind": baseline.kind, "recorded": baseline.recorded,
            **baseline.model_dump(mode="json", exclude={"format_version", "kind", "recorded"})}
    store, name = _split(uri)
    try:
        store.write_text(name, json.dumps(body, indent=1, ensure_ascii=False) + "\n")
    except LmforgeError:
        raise
    except OSError as exc:
        raise StorageError(f"baseline {uri}: cannot write: {exc}") from exc
    except Exception as exc:
        raise _store_error(uri, exc) from exc
    return baseline


def ensure_comparable(baseline: Baseline, evalset: EvalSet, uri: str, evalset_path: str) -> None:
    """A baseline is only comparable with a run of the same texts and checks."""
    if baseline.eval_set.sha256 != evalset.sha256:
        raise InputError(
            f"baseline {uri} was recorded with a different eval set (name {baseline.eval_set.name!r}, sha256 "
            f"{baseline.eval_set.sha256[:12]}…) than {evalset_path} (sha256 {evalset.sha256[:12]}…): re-record it "
            "with `lmforge-canary make-baseline` against a known-good deployment")
