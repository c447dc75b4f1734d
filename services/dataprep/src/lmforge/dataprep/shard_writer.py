"""Shard writing, one independent task per shard partition (a run of consecutive inputs,
`shards.inputs_per_partition` of them): a seeded document-level shuffle of the partition's
tokenized documents, a train/val split, shards of about `shard_tokens` tokens (documents are
never split), each shard's block sidecar (lmforge.common.shards) and their lineage (document →
shard, offset). Each partition's shard entries go to layout.shard_entries, written last;
`write_manifest` then writes one index per split listing every partition's shards in partition
order, and manifest.json naming the indexes (lmforge.common.shard_index: what a trainer's rank
reads stays the size of its split's index, not of every shard's block hashes).

A partition's shards depend only on its inputs, the config and the partition's index, so the
output is the same whatever the number of workers or processes. The global mix across
partitions is the trainer's: its sampler draws sequences from every shard by a keyed
permutation of (seed, epoch, step, rank) (lmforge.trainer.data)."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from lmforge.common.errors import InputError
from lmforge.common.local_store import LocalStore
from lmforge.common.shard_index import ShardEntry, new_manifest, write_split_index
from lmforge.common.shards import HEADER_BYTES, ShardDigest, token_dtype, write_shard
from lmforge.common.store import Store
from lmforge.dataprep import layout
from lmforge.dataprep.config import DataprepConfig
from lmforge.dataprep.document import format_doc_id
from lmforge.dataprep.parquet_io import LINEAGE_SCHEMA, ParquetRowWriter, column_or_default
from lmforge.dataprep.stats import PeakRss
from lmforge.dataprep.tokenize import read_token_index


@dataclass
class _DocTable:
    """Where every tokenized document's tokens are, in input order: 24 bytes a document.
    URLs and hashes stay in the memory-mapped per-input indexes until lineage needs them."""

    input_index: np.ndarray
    row: np.ndarray
    token_start: np.ndarray
    token_count: np.ndarray
    indexes: dict[int, pa.Table]

    def __len__(self) -> int:
        return len(self.row)

    def lineage_columns(self, positions: list[int]) -> tuple[list[int], list[str], list[str], list[str]]:
        """doc_id, url, content_sha256, record_id of the given documents, in the given order (record_id ""
        where an input's index was written before it)."""
        inputs, rows = self.input_index[positions], self.row[positions]
        ids, urls, hashes, records = ([0] * len(positions), [""] * len(positions), [""] * len(positions),
                                      [""] * len(positions))
        for i in np.unique(inputs).tolist():
            where = np.flatnonzero(inputs == i)
            taken = self.indexes[i].take(pa.array(rows[where]))
            columns = [taken.column(name).to_pylist() for name in ("doc_id", "url", "content_sha256")]
            columns.append(column_or_default(taken, "record_id", ""))
            for slot, doc_id, url, digest, record_id in zip(where.tolist(), *columns):
                ids[slot], urls[slot], hashes[slot], records[slot] = doc_id, url, digest, record_id
        return ids, urls, hashes, records


def _load_doc_table(store: Store, inputs_of_partition: range) -> _DocTable:
    inputs, rows, starts, counts, indexes = [], [], [], [], {}
    for i in inputs_of_partition:
        table = read_token_index(store, i)
        indexes[i] = table
        inputs.append(np.full(table.num_rows, i, dtype=np.int32))
        rows.append(np.arange(table.num_rows, dtype=np.int32))
        starts.append(table.column("token_start").to_numpy())
        counts.append(table.column("token_count").to_numpy())

    def cat(parts, dtype):
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

    return _DocTable(cat(inputs, np.int32), cat(rows, np.int32), cat(starts, np.int64), cat(counts, np.int32),
                     indexes)


def split_order(n_docs: int, val_fraction: float, seed) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) document positions, shuffled with `seed`. Val gets round(n·fraction)
    documents, at least one when the fraction is positive and there are ≥ 2 documents."""
    order = np.random.default_rng(seed).permutation(n_docs)
    n_val = int(round(n_docs * val_fraction))
    if val_fraction > 0 and n_docs >= 2:
        n_val = max(n_val, 1)
    return order[n_val:], order[:n_val]


def partitions(n_inputs: int, inputs_per_partition: int) -> list[range]:
    """The inputs of each shard partition, in order."""
    return [range(first, min(first + inputs_per_partition, n_inputs))
            for first in range(0, n_inputs, inputs_per_partition)]


def partition_count(n_inputs: int, inputs_per_partition: int) -> int:
    """len(partitions(...)), without listing them."""
    return -(-n_inputs // inputs_per_partition)


def write_partition_shards(store: Store, config: DataprepConfig, tokenizer_info: dict, partition: int,
                           inputs_of_partition: range) -> dict:
    """Write one partition's shards and lineage, then its manifest entries; return them with stats."""
    if store.exists(layout.shard_entries(partition)):
        return json.loads(store.read_text(layout.shard_entries(partition)))
    started, peak = time.perf_counter(), PeakRss()
    docs = _load_doc_table(store, inputs_of_partition)
    dtype = token_dtype(tokenizer_info["vocab_size"])
    token_maps = {}
    for i in inputs_of_partition:
        path = store.local_path(layout.tokens(i))
        if path.stat().st_size:
            token_maps[i] = np.memmap(path, dtype=dtype, mode="r")
    seed = np.random.SeedSequence([config.shards.seed, partition])
    train, val = split_order(len(docs), config.shards.val_fraction, seed)
    writer = _PartitionWriter(store, config, docs, token_maps, tokenizer_info, partition)
    entries = {split: writer.write_split(split, positions) for split, positions in (("train", train), ("val", val))}
    result = {"partition": partition, "inputs": [inputs_of_partition.start, inputs_of_partition.stop],
              "entries": entries, "documents": len(docs), "tokens": int(docs.token_count.sum(dtype=np.int64)),
              "seconds": round(time.perf_counter() - started, 4), "peak_rss_bytes": peak.bytes()}
    store.write_text(layout.shard_entries(partition), json.dumps(result, indent=1))
    return result


def write_manifest(store: Store, config: DataprepConfig, n_inputs: int, tokenizer_info: dict) -> dict:
    """A split index per split over every partition's shards (each in partition order), then
    manifest.json naming them. The run's inputs stay in layout.INPUTS."""
    started = time.perf_counter()
    n_partitions = partition_count(n_inputs, config.shards.inputs_per_partition)
    missing = [p for p in range(n_partitions) if not store.exists(layout.shard_entries(p))]
    if missing:
        raise InputError(f"{len(missing)} shard partition(s) not written yet (e.g. {missing[:5]}): "
                         "run the shards stage first")
    itemsize = token_dtype(tokenizer_info["vocab_size"]).itemsize
    entries: dict[str, list[ShardEntry]] = {"train": [], "val": []}
    documents = tokens = 0
    task_seconds = 0.0
    for p in range(n_partitions):  # one partition's summary in memory at a time
        result = json.loads(store.read_text(layout.shard_entries(p)))
        for split, listed in entries.items():
            listed.extend(_index_entry(store, raw, itemsize) for raw in result["entries"][split])
        documents, tokens = documents + result["documents"], tokens + result["tokens"]
        task_seconds += result["seconds"]
    splits = {split: write_split_index(store.write_bytes, split, listed) for split, listed in entries.items()}
    manifest = new_manifest(
        {k: tokenizer_info[k] for k in ("path", "sha256", "vocab_size", "eot_token", "eot_id")}, splits,
        totals={"documents": documents, "tokens": tokens, "train_tokens": splits["train"]["tokens"],
                "val_tokens": splits["val"]["tokens"], "shards": sum(s["shards"] for s in splits.values())},
        config=config.model_dump(mode="json"))
    stats = {"seconds": round(task_seconds + time.perf_counter() - started, 4),
             "shards": manifest["totals"]["shards"], "partitions": n_partitions, "documents": documents,
             "tokens": tokens}
    store.write_text(layout.SHARD_STATS, json.dumps(stats, indent=1))
    store.write_text(layout.MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def _index_entry(store: Store, raw: dict, itemsize: int) -> ShardEntry:
    """A partition summary's shard as the split index lists it. A partition written before block
    sidecars lists its block hashes itself: its shards' sidecars are written from them here."""
    blocks_sha256 = raw.get("blocks_sha256")
    if blocks_sha256 is None:
        sidecar = b"".join(bytes.fromhex(block) for block in raw["block_sha256"])
        store.write_bytes(raw["path"].removesuffix(".bin") + ".blocks", sidecar)
        blocks_sha256 = hashlib.sha256(sidecar).hexdigest()
    return ShardEntry(raw["path"], int(raw["tokens"]), int(raw["documents"]), HEADER_BYTES + raw["tokens"] * itemsize,
                      raw["sha256"], int(raw["block_bytes"]), blocks_sha256)


@dataclass
class _PartitionWriter:
    store: Store
    config: DataprepConfig
    docs: _DocTable
    token_maps: dict[int, np.ndarray]
    tokenizer_info: dict
    partition: int

    def write_split(self, split: str, positions: np.ndarray) -> list[dict]:
        entries: list[dict] = []
        batch: list[int] = []
        batch_tokens = 0
        limit = self.config.shards.shard_tokens
        for position in positions.tolist():
            count = int(self.docs.token_count[position])
            if batch and batch_tokens + count > limit:
                entries.append(self._flush(split, len(entries), batch))
                batch, batch_tokens = [], 0
            batch.append(position)
            batch_tokens += count
        if batch:
            entries.append(self._flush(split, len(entries), batch))
        return entries

    def _flush(self, split: str, shard_index: int, batch: list[int]) -> dict:
        docs, info = self.docs, self.tokenizer_info
        counts = docs.token_count[batch]
        ends = np.cumsum(counts)
        tokens = np.empty(int(ends[-1]), dtype=token_dtype(info["vocab_size"]))
        cursor = 0
        rel = layout.shard(split, self.partition, shard_index)
        doc_ids, urls, hashes, record_ids = docs.lineage_columns(batch)
        with ParquetRowWriter(self.store, layout.lineage(split, self.partition, shard_index), LINEAGE_SCHEMA,
                              self.config.parquet_row_group_docs) as lineage:
            for slot, (position, count) in enumerate(zip(batch, counts.tolist())):
                start = int(docs.token_start[position])
                source = self.token_maps[int(docs.input_index[position])]
                tokens[cursor : cursor + count] = source[start : start + count]
                lineage.add({"doc_id": format_doc_id(doc_ids[slot]), "url": urls[slot],
                             "content_sha256": hashes[slot], "shard": rel,
                             "token_offset": cursor, "token_count": count - 1,  # count without end-of-text
                             "record_id": record_ids[slot]})
                cursor += count
        if isinstance(self.store, LocalStore):
            digest = write_shard(self.store.local_path(rel), tokens, ends, eot_id=info["eot_id"],
                                 vocab_size=info["vocab_size"], tokenizer_sha256=info["sha256"])
        else:
            digest = _write_remote_shard(self.store, rel, tokens, ends, info)
        return {"path": rel, "split": split, "tokens": int(len(tokens)), "documents": len(batch),
                **digest.index_fields(), "index": rel.removesuffix(".bin") + ".idx"}


def _write_remote_shard(store: Store, rel: str, tokens, ends, tokenizer_info) -> ShardDigest:
    import shutil
    import tempfile
    from pathlib import Path

    from lmforge.common.shards import blocks_path, index_path

    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / Path(rel).name
        digest = write_shard(local, tokens, ends, eot_id=tokenizer_info["eot_id"],
                             vocab_size=tokenizer_info["vocab_size"], tokenizer_sha256=tokenizer_info["sha256"])
        stem = rel.removesuffix(".bin")
        for source, target in ((local, rel), (index_path(local), stem + ".idx"),
                               (blocks_path(local), stem + ".blocks")):
            with open(source, "rb") as src, store.open_write(target) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    return digest
