"""Texts to train a model on (`train-classifier`'s examples, `train-ngram`'s corpus), from a
source the user names: a JSON-lines file (.jsonl, .jsonl.gz, .json.gz: a text field), a Parquet
file (a text column), a text file (.txt: the whole file is one text), a data-prep output (its
documents: work/docs/*.parquet), or a folder or glob of such files. Local paths and s3:// URIs
(http(s):// for a single file)."""

from __future__ import annotations

import glob
import gzip
import io
import json
from collections.abc import Iterator
from pathlib import Path

from lmforge.common.errors import InputError
from lmforge.common.s3 import S3Location
from lmforge.common.storage import open_input, open_store
from lmforge.common.store import scheme_of
from lmforge.dataprep import layout

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json.gz")
FILE_SUFFIXES = (*JSONL_SUFFIXES, ".parquet", ".txt")
_DOCS_DIR = layout.docs(0).rsplit("/", 1)[0] + "/"


def expand(source: str) -> list[str]:
    """The files a source names: itself, a glob's matches, or a local folder's files of the known kinds
    (a data-prep output, local or s3://, stays one source)."""
    if "://" in source:
        return [source]
    if glob.has_magic(source):
        found = sorted(glob.glob(source))
        if not found:
            raise InputError(f"no file matches {source}")
        return [name for match in found for name in expand(match)]
    path = Path(source)
    if path.is_dir() and not (path / _DOCS_DIR).is_dir():
        files = sorted(str(p) for p in path.rglob("*") if p.is_file() and p.name.endswith(FILE_SUFFIXES))
        if not files:
            raise InputError(f"{source}: no {', '.join(FILE_SUFFIXES)} files in it, and not a data-prep output")
        return files
    if not path.exists():
        raise InputError(f"not found: {source}")
    return [source]


def read_texts(source: str, text_field: str = "text") -> Iterator[str]:
    """Every text of one source (see the module's doc); empty texts are left out."""
    for name in expand(source):
        if name.endswith(JSONL_SUFFIXES):
            yield from _jsonl_texts(name, text_field)
        elif name.endswith(".txt"):
            with open_input(name) as raw:
                yield raw.read().decode("utf-8", errors="replace")
        else:  # a data-prep output's documents are in its `text` column
            store, files = _parquet_files(name)
            column = text_field if name.endswith(".parquet") else "text"
            for rel in files:
                yield from _parquet_texts(store, rel, column)


def _jsonl_texts(uri: str, text_field: str) -> Iterator[str]:
    try:
        raw = open_input(uri)
        stream = gzip.GzipFile(fileobj=raw) if uri.endswith(".gz") else raw
        with io.TextIOWrapper(stream, encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InputError(f"{uri}:{number}: not a JSON object: {exc.msg}") from None
                value = row.get(text_field) if isinstance(row, dict) else None
                if not isinstance(value, str):
                    raise InputError(f"{uri}:{number}: no text field {text_field!r} (set --text-field)")
                if value:
                    yield value
    except (UnicodeDecodeError, EOFError, gzip.BadGzipFile) as exc:
        raise InputError(f"{uri}: cannot read: {exc}") from None


def _parquet_texts(store, rel: str, text_field: str) -> Iterator[str]:
    from lmforge.dataprep.parquet_io import iter_batches

    for batch in iter_batches(store, rel, columns=[text_field]):
        if batch.num_columns == 0:  # pyarrow reads a column that is not there as none
            raise InputError(f"{store.join(rel)}: no column {text_field!r}")
        yield from (text for text in batch.column(0).to_pylist() if text)


def _parquet_files(uri: str) -> tuple[object, list[str]]:
    """(store, relative paths) of a single Parquet file or of a data-prep output's docs Parquet files."""
    if uri.endswith(".parquet"):
        if scheme_of(uri) == "s3":
            loc = S3Location.parse(uri)
            parent, _, name = loc.key.rpartition("/")
            return open_store(f"s3://{loc.bucket}/{parent}"), [name]
        path = Path(uri)
        return open_store(path.parent), [path.name]
    if scheme_of(uri) != "s3" and not Path(uri).is_dir():
        raise InputError(f"{uri}: not a {', '.join(FILE_SUFFIXES)} file, a folder of them or a data-prep output")
    store = open_store(uri)
    files = [rel for rel in store.list(_DOCS_DIR) if rel.endswith(".parquet")]
    if not files:
        raise InputError(f"{uri}: no docs Parquet files under {_DOCS_DIR} (not a data-prep output?)")
    return store, files
