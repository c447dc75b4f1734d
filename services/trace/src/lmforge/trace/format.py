"""The trace index's layout and manifest, declared once: every writer (data prep's trace-index stage, the
report that assembles index.json) and every reader (the engine, the cache, the contamination report) derives
file names and checks from here.

    <index root>/index.json                  the manifest (index_json): engine, token width, tokenizer, every
                                             partition's entry
    <index root>/tokenizer.json              the data's tokenizer (the standalone trace service and the
                                             contamination report tokenize with it)
    <index root>/partition-000003/           one index partition (data prep: a group of shard partitions), an
                                             infini-gram v4 index directory:
        tokenized.0  table.0  offset.0         the engine's files (tokens with a separator before each document,
        metadata.0  metaoff.0                  the suffix array, document offsets, one JSON line of lineage per
        unigram.npy                            document and its offsets), and our unigram counts per token id
        entry.json                           the partition's entry, written last: its presence marks it complete

An index built by one infini-gram version is read only by the same version: the on-disk format is the
engine's, and nothing else guards it.
"""

from __future__ import annotations

import importlib.metadata
import json

from lmforge.common.errors import InputError

ENGINE, ENGINE_VERSION, INDEX_VERSION = "infini-gram", "2.6.0", 4
FORMAT_VERSION = 1
INDEX_JSON = "index.json"
TOKENIZER = "tokenizer.json"
PARTITION_FILES = ("tokenized.0", "table.0", "offset.0", "metadata.0", "metaoff.0", "unigram.npy")
ENTRY = "entry.json"
METADATA_KEYS = ("doc_id", "url", "record_id", "shard", "token_offset")  # one metadata.0 line per document

_REQUIRED = ("format_version", "engine", "engine_version", "index_version", "token_dtype", "vocab_size",
             "eos_token_id", "tokenizer_sha256", "tokens", "documents", "bytes", "partitions")


def partition_dir(partition: int) -> str:
    return f"partition-{partition:06d}"


def index_token_dtype(vocab_size: int) -> str:
    """u16 while every token id and the all-ones document separator fit in 16 bits, else u32."""
    return "u16" if vocab_size < 0xFFFF else "u32"


def installed_engine_version() -> str:
    return importlib.metadata.version("infini-gram")


def index_json(entries: list[dict], *, vocab_size: int, eos_token_id: int, tokenizer_sha256: str,
               data_manifest_sha256: str | None = None) -> dict:
    """index.json's content for these partition entries (each as build.build_partition returns it)."""
    entries = sorted(entries, key=lambda e: e["name"])
    return {"format_version": FORMAT_VERSION, "engine": ENGINE, "engine_version": ENGINE_VERSION,
            "index_version": INDEX_VERSION, "token_dtype": index_token_dtype(vocab_size), "vocab_size": vocab_size,
            "eos_token_id": eos_token_id, "tokenizer_sha256": tokenizer_sha256,
            "data_manifest_sha256": data_manifest_sha256,
            "tokens": sum(e["tokens"] for e in entries), "documents": sum(e["documents"] for e in entries),
            "bytes": sum(f["bytes"] for e in entries for f in e["files"].values()), "partitions": entries}


def read_index_json(text: str, source: str = INDEX_JSON) -> dict:
    """index.json parsed and checked: its format, and that the installed engine reads its index files."""
    try:
        info = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{source} is not JSON ({exc})") from None
    if not isinstance(info, dict):
        raise InputError(f"{source} is not a trace index manifest (not a JSON object)")
    missing = [key for key in _REQUIRED if key not in info]
    if missing:
        raise InputError(f"{source} is not a trace index manifest (missing {', '.join(missing)})")
    if info["format_version"] != FORMAT_VERSION:
        raise InputError(f"{source} has format_version {info['format_version']}; this lmforge reads {FORMAT_VERSION}")
    installed = installed_engine_version()
    if (info["engine"], info["engine_version"], info["index_version"]) != (ENGINE, installed, INDEX_VERSION):
        raise InputError(f"{source} was built by {info['engine']} {info['engine_version']} (index v"
                         f"{info['index_version']}); the installed engine is {ENGINE} {installed} (v{INDEX_VERSION}): "
                         "rebuild the index with this version")
    if info["token_dtype"] != index_token_dtype(info["vocab_size"]):
        raise InputError(f"{source}: token_dtype {info['token_dtype']} does not fit vocab_size {info['vocab_size']}")
    if not isinstance(info["partitions"], list):
        raise InputError(f"{source}: partitions is not a list")
    for entry in info["partitions"]:
        if not isinstance(entry, dict) or set(entry.get("files", {})) != set(PARTITION_FILES):
            raise InputError(f"{source}: partition {entry!r:.80} does not list exactly {', '.join(PARTITION_FILES)}")
        if not {"name", "tokens", "documents"} <= set(entry):
            raise InputError(f"{source}: partition {entry.get('name', entry)!r:.80} lacks name, tokens or documents")
    return info
