"""Shard writing: a seeded document-level shuffle over every tokenized document, a
train/val split, shards of about `shard_tokens` tokens (documents are never split), the
lineage index (document → shard, offset) and manifest.json, written last."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np

from lmforge.common.shards import token_dtype, write_shard
from lmforge.common.storage import LocalStore, Store
from lmforge.dataprep import layout
from lmforge.dataprep.config import DataprepConfig
from lmforge.dataprep.document import format_doc_id
from lmforge.dataprep.parquet_io import LINEAGE_SCHEMA, ParquetRowWriter
from lmforge.dataprep.tokenize import read_token_index

MANIFEST_FORMAT = "lmforge-shards"
MANIFEST_VERSION = 1


@dataclass
class _DocTable:
    """Every tokenized document: where its tokens are, in input order."""

    input_index: np.ndarray
    token_start: np.ndarray
    token_count: np.ndarray
    doc_id: np.ndarray
    url: list[str]
    content_sha256: list[str]

    def __len__(self) -> int:
        return len(self.doc_id)


def _load_doc_table(store: Store, n_inputs: int) -> _DocTable:
    inputs, starts, counts, ids, urls, hashes = [], [], [], [], [], []
    for i in range(n_inputs):
        table = read_token_index(store, i)
        inputs.append(np.full(table.num_rows, i, dtype=np.int64))
        starts.append(table.column("token_start").to_numpy())
        counts.append(table.column("token_count").to_numpy())
        ids.append(table.column("doc_id").to_numpy())
        urls.extend(table.column("url").to_pylist())
        hashes.extend(table.column("content_sha256").to_pylist())
    def cat(parts, dtype):
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

    return _DocTable(cat(inputs, np.int64), cat(starts, np.int64), cat(counts, np.int64),
                     cat(ids, np.uint64), urls, hashes)


def split_order(n_docs: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) document positions, shuffled with `seed`. Val gets round(n·fraction)
    documents, at least one when the fraction is positive and there are ≥ 2 documents."""
    order = np.random.default_rng(seed).permutation(n_docs)
    n_val = int(round(n_docs * val_fraction))
    if val_fraction > 0 and n_docs >= 2:
        n_val = max(n_val, 1)
    return order[n_val:], order[:n_val]


def write_shards(store: Store, config: DataprepConfig, n_inputs: int, tokenizer_info: dict,
                 inputs: list[str]) -> dict:
    """Write all shards, lineage and finally manifest.json; return the manifest."""
    started = time.perf_counter()
    docs = _load_doc_table(store, n_inputs)
    token_maps = {i: np.memmap(store.local_path(layout.tokens(i)), dtype=token_dtype(tokenizer_info["vocab_size"]),
                               mode="r")
                  for i in range(n_inputs) if store.local_path(layout.tokens(i)).stat().st_size}
    train, val = split_order(len(docs), config.shards.val_fraction, config.shards.seed)
    entries = []
    for split, positions in (("train", train), ("val", val)):
        entries.extend(_write_split(store, config, docs, token_maps, tokenizer_info, split, positions))
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "dtype": token_dtype(tokenizer_info["vocab_size"]).name,
        "shards": entries,
        "tokenizer": {k: tokenizer_info[k] for k in ("path", "sha256", "vocab_size", "eot_token", "eot_id")},
        "totals": {
            "documents": len(docs),
            "tokens": int(docs.token_count.sum()),
            "train_tokens": int(sum(e["tokens"] for e in entries if e["split"] == "train")),
            "val_tokens": int(sum(e["tokens"] for e in entries if e["split"] == "val")),
        },
        "config": config.model_dump(mode="json"),
        "inputs": inputs,
    }
    stats = {"seconds": round(time.perf_counter() - started, 4), "shards": len(entries),
             "documents": len(docs), "tokens": manifest["totals"]["tokens"]}
    store.write_text(layout.SHARD_STATS, json.dumps(stats, indent=1))
    store.write_text(layout.MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def _write_split(store, config, docs: _DocTable, token_maps, tokenizer_info, split, positions) -> list[dict]:
    entries = []
    shard_index = 0
    batch: list[int] = []
    batch_tokens = 0
    limit = config.shards.shard_tokens
    for position in positions.tolist():
        count = int(docs.token_count[position])
        if batch and batch_tokens + count > limit:
            entries.append(_flush_shard(store, config, docs, token_maps, tokenizer_info, split, shard_index, batch))
            shard_index += 1
            batch, batch_tokens = [], 0
        batch.append(position)
        batch_tokens += count
    if batch:
        entries.append(_flush_shard(store, config, docs, token_maps, tokenizer_info, split, shard_index, batch))
    return entries


def _flush_shard(store, config, docs: _DocTable, token_maps, tokenizer_info, split, shard_index, batch) -> dict:
    counts = docs.token_count[batch]
    ends = np.cumsum(counts)
    tokens = np.empty(int(ends[-1]), dtype=token_dtype(tokenizer_info["vocab_size"]))
    cursor = 0
    rel = layout.shard(split, shard_index)
    with ParquetRowWriter(store, layout.lineage(split, shard_index), LINEAGE_SCHEMA,
                          config.parquet_row_group_docs) as lineage:
        for position, count in zip(batch, counts.tolist()):
            start = int(docs.token_start[position])
            tokens[cursor : cursor + count] = token_maps[int(docs.input_index[position])][start : start + count]
            lineage.add({"doc_id": format_doc_id(int(docs.doc_id[position])), "url": docs.url[position],
                         "content_sha256": docs.content_sha256[position], "shard": rel,
                         "token_offset": cursor, "token_count": count - 1})  # count without end-of-text
            cursor += count
    if isinstance(store, LocalStore):
        digest = write_shard(store.local_path(rel), tokens, ends, eot_id=tokenizer_info["eot_id"],
                             vocab_size=tokenizer_info["vocab_size"], tokenizer_sha256=tokenizer_info["sha256"])
    else:
        digest = _write_remote_shard(store, rel, tokens, ends, tokenizer_info)
    return {"path": rel, "split": split, "tokens": int(len(tokens)), "documents": len(batch), "sha256": digest,
            "index": rel.removesuffix(".bin") + ".idx"}


def _write_remote_shard(store: Store, rel: str, tokens, ends, tokenizer_info) -> str:
    import tempfile
    from pathlib import Path

    from lmforge.common.shards import index_path

    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / Path(rel).name
        digest = write_shard(local, tokens, ends, eot_id=tokenizer_info["eot_id"],
                             vocab_size=tokenizer_info["vocab_size"], tokenizer_sha256=tokenizer_info["sha256"])
        store.write_bytes(rel, local.read_bytes())
        store.write_bytes(rel.removesuffix(".bin") + ".idx", index_path(local).read_bytes())
    return digest
