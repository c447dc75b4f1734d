"""The trace-index stage: an exact-match index (lmforge.trace) over the tokens of a group of shard partitions,
and the index.json the report assembles from every index partition's entry.

Index partition i covers shard partitions [i·k, (i+1)·k), k = trace_index.shard_partitions_per_index
(index_partitions declares it; the stage's task list and the report derive from it). A query's cost is
nearly the same per index partition whatever its size, so k trades task time for query latency.

A task reads its shard partitions' shards of the configured splits (trace_index.splits) one document at a time
(memory-mapped shard, its document ends, its lineage file read in row batches), drops each document's
end-of-text token and hands it, with its lineage (doc_id, url, record_id, shard, token_offset), to
lmforge.trace.build.build_partition, which writes the index files into a local scratch directory in parts
of trace_index.part_tokens tokens: a task's memory follows part_tokens, not the index partition. The files are
then uploaded through the run's store, each one's sha256 checked against the entry's, the task's stats
written, and the partition's entry.json last (the task's done marker, and what index.json lists).

The shards' lineage rows are in shard order (shard_writer writes both in one pass), so the n-th row of a
shard's lineage file describes its n-th document; a row whose token_offset disagrees with the shard's
document ends is refused, not indexed under the wrong source.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from lmforge.common.errors import InputError, StorageError
from lmforge.common.shards import open_shard, read_doc_ends
from lmforge.common.store import Store
from lmforge.dataprep import layout
from lmforge.dataprep.config import DataprepConfig
from lmforge.dataprep.parquet_io import column_or_default, iter_batches
from lmforge.dataprep.shard_writer import partition_count
from lmforge.dataprep.stats import PeakRss
from lmforge.trace import format as trace_format

LINEAGE_COLUMNS = ["doc_id", "url", "record_id", "shard", "token_offset"]


def index_partitions(config: DataprepConfig, n_inputs: int) -> list[range]:
    """The shard partitions of each index partition (none when the trace index is disabled)."""
    if not config.trace_index.enabled:
        return []
    shard_partitions = partition_count(n_inputs, config.shards.inputs_per_partition)
    k = config.trace_index.shard_partitions_per_index
    return [range(start, min(start + k, shard_partitions)) for start in range(0, shard_partitions, k)]


def partition_shards(store: Store, splits: list[str], partition: int) -> list[tuple[str, str]]:
    """(shard, lineage file) of each of the partition's shards of `splits`, in split then shard order."""
    if not store.exists(layout.shard_entries(partition)):
        raise InputError(f"shard partition {partition} not written yet: run the shards stage first")
    entries = json.loads(store.read_text(layout.shard_entries(partition)))["entries"]
    found = []
    for split in splits:
        for k, entry in enumerate(entries.get(split, [])):
            if entry["path"] != layout.shard(split, partition, k):
                raise InputError(f"{store.join(layout.shard_entries(partition))}: shard {k} of {split} is "
                                 f"{entry['path']}, expected {layout.shard(split, partition, k)}")
            found.append((entry["path"], layout.lineage(split, partition, k)))
    return found


def shard_documents(store: Store, shard: str, lineage: str, eot_id: int) -> Iterator[tuple[np.ndarray, dict]]:
    """Each document of one shard without its end-of-text token, with its lineage row."""
    path = store.local_path(shard)  # remote: a download beside its .idx, released when the task ends
    store.local_path(shard.removesuffix(".bin") + ".idx")
    _, tokens = open_shard(path)
    ends = read_doc_ends(path)
    doc = 0
    for batch in iter_batches(store, lineage, columns=LINEAGE_COLUMNS, optional=("record_id",)):
        record_ids = column_or_default(batch, "record_id", "")
        offsets = batch.column("token_offset").to_numpy()
        for row, (doc_id, url, source) in enumerate(zip(*(batch.column(c).to_pylist()
                                                           for c in ("doc_id", "url", "shard")))):
            start = int(ends[doc - 1]) if doc else 0
            end = int(ends[doc]) if doc < len(ends) else -1
            if doc >= len(ends) or int(offsets[row]) != start or source != shard or tokens[end - 1] != eot_id:
                raise InputError(f"{store.join(lineage)} row {doc} does not describe document {doc} of "
                                 f"{store.join(shard)}: the lineage and the shard disagree")
            yield tokens[start : end - 1], {"doc_id": doc_id, "url": url, "record_id": record_ids[row],
                                            "shard": shard, "token_offset": start}
            doc += 1
    if doc != len(ends):
        raise InputError(f"{store.join(lineage)} lists {doc} documents, {store.join(shard)} holds {len(ends)}")
    del tokens


def build_trace_partition(store: Store, config: DataprepConfig, tokenizer_info: dict, partition: int,
                          shard_partitions: range) -> dict:
    """Build, upload and verify index partition `partition` (the shards of `shard_partitions`); its entry.json
    last. Returns the task's stats."""
    from lmforge.trace.build import build_partition

    if store.exists(layout.trace_entry(partition)):
        return json.loads(store.read_text(layout.trace_index_stats(partition)))
    started, peak = time.perf_counter(), PeakRss()
    settings = config.trace_index
    eot = tokenizer_info["eot_id"]
    shards = [shard for p in shard_partitions for shard in partition_shards(store, settings.splits, p)]

    def documents() -> Iterator[tuple[np.ndarray, dict]]:
        for shard, lineage in shards:
            yield from shard_documents(store, shard, lineage, eot)

    name = trace_format.partition_dir(partition)
    with tempfile.TemporaryDirectory(prefix="lmforge-trace-index-") as tmp:
        out, scratch = Path(tmp) / name, Path(tmp) / "scratch"
        scratch.mkdir()
        build_started = time.perf_counter()
        entry = build_partition(documents(), out, name, vocab_size=tokenizer_info["vocab_size"], eos_token_id=eot,
                                part_tokens=settings.part_tokens, threads=settings.threads, scratch=scratch)
        build_seconds = time.perf_counter() - build_started
        for file_name in trace_format.PARTITION_FILES:
            rel = layout.trace_partition_file(partition, file_name)
            uploaded = store.upload_file(out / file_name, rel)
            if uploaded != entry["files"][file_name]["sha256"]:
                raise StorageError(f"{store.join(rel)}: uploaded sha256 {uploaded} is not the built file's "
                                   f"{entry['files'][file_name]['sha256']}")
    stats = {"partition": partition, "shard_partitions": [shard_partitions.start, shard_partitions.stop],
             "splits": list(settings.splits), "shards": len(shards),
             "tokens": entry["tokens"], "documents": entry["documents"],
             "bytes": sum(f["bytes"] for f in entry["files"].values()),
             "build_seconds": round(build_seconds, 4), "seconds": round(time.perf_counter() - started, 4),
             "peak_rss_bytes": peak.bytes()}
    store.write_text(layout.trace_index_stats(partition), json.dumps(stats, indent=1))
    store.write_text(layout.trace_entry(partition), json.dumps(entry, indent=1, sort_keys=True))
    return stats


# ------------------------------------------------------------------ the report's part


def trace_partitions(store: Store, n_partitions: int) -> list[dict]:
    """Every partition's entry; a missing one is a one-line InputError."""
    missing = [p for p in range(n_partitions) if not store.exists(layout.trace_entry(p))]
    if missing:
        raise InputError(f"{len(missing)} trace-index partition(s) not built yet (e.g. {missing[:5]}): "
                         "run the trace-index stage first")
    return [json.loads(store.read_text(layout.trace_entry(p))) for p in range(n_partitions)]


def write_index_json(store: Store, n_partitions: int, tokenizer_info: dict, manifest_sha256: str | None) -> dict:
    """trace-index/index.json over every partition's entry, and the run's tokenizer beside it."""
    raw_tokenizer = store.read_bytes(layout.TOKENIZER)
    info = trace_format.index_json(trace_partitions(store, n_partitions), vocab_size=tokenizer_info["vocab_size"],
                                   eos_token_id=tokenizer_info["eot_id"],
                                   tokenizer_sha256=hashlib.sha256(raw_tokenizer).hexdigest(),
                                   data_manifest_sha256=manifest_sha256)
    store.write_bytes(layout.TRACE_INDEX_TOKENIZER, raw_tokenizer)
    store.write_text(layout.TRACE_INDEX_JSON, json.dumps(info, indent=1, sort_keys=True))
    return info


def trace_index_section(store: Store, info: dict | None) -> dict:
    """report.json's trace_index: the index's size and what building it cost."""
    if info is None:
        return {"enabled": False}
    seconds, peaks = 0.0, []
    for p in range(len(info["partitions"])):
        stats = json.loads(store.read_text(layout.trace_index_stats(p)))
        seconds += stats["seconds"]
        peaks.append(stats["peak_rss_bytes"])
    tokens = info["tokens"]
    return {"enabled": True, "path": layout.TRACE_INDEX, "engine": f"{info['engine']} {info['engine_version']}",
            "tokens": tokens, "documents": info["documents"], "bytes": info["bytes"],
            "bytes_per_token": round(info["bytes"] / tokens, 3) if tokens else 0.0,
            "partitions": len(info["partitions"]), "task_seconds": round(seconds, 4),
            "max_peak_rss_bytes": max(peaks, default=0)}
