"""Shared helpers of the data-prep tests: split a generated WET file into several inputs,
run the CLI in-process, and read back what a run wrote."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from warcio.archiveiterator import ArchiveIterator

from lmforge.common.shards import open_shard
from lmforge.dataprep import cli
from lmforge.dataprep.document import make_doc_id
from tests.dataprep.wet_records import gz_member, wet_record
from tests.shard_listing import local_shards


def split_wet(source: Path, targets: list[Path]) -> dict[int, int]:
    """Deal the conversion records of `source` round-robin into `targets` (gzip per record).
    Returns {record index in source: doc id it gets in the run}."""
    chunks: list[list[bytes]] = [[] for _ in targets]
    doc_ids: dict[int, int] = {}
    index = 0
    with open(source, "rb") as fh:
        for record in ArchiveIterator(fh):
            if record.rec_type != "conversion":
                continue
            url = record.rec_headers.get_header("WARC-Target-URI")
            body = record.content_stream().read()
            slot = index % len(targets)
            doc_ids[index] = make_doc_id(slot, len(chunks[slot]))
            chunks[slot].append(gz_member(wet_record(url, body)))
            index += 1
    for target, chunk in zip(targets, chunks):
        target.write_bytes(b"".join(chunk))
    return doc_ids


def run_cli(*args: str) -> int:
    return cli.main([str(a) for a in args])


def doc_ids_in(out: Path, prefix: str) -> set[int]:
    ids: set[int] = set()
    for path in sorted((out / prefix).glob("*.parquet")):
        ids.update(pq.read_table(path, columns=["doc_id"]).column("doc_id").to_pylist())
    return ids


def lineage_rows(out: Path) -> list[dict]:
    rows = []
    for path in sorted((out / "lineage").glob("*.parquet")):
        rows.extend(pq.read_table(path).to_pylist())
    return rows


def kept_doc_ids(out: Path) -> set[int]:
    """Doc ids that made it into the shards (lineage ids are 'IIIIII-RRRRRRRR')."""
    kept = set()
    for row in lineage_rows(out):
        input_index, record_index = row["doc_id"].split("-")
        kept.add(make_doc_id(int(input_index), int(record_index)))
    return kept


def manifest(out: Path) -> dict:
    """manifest.json, with every split's shards (read through the split indexes) under "shards"."""
    return {**json.loads((out / "manifest.json").read_text()), "shards": local_shards(out)}


def shard_tokens(out: Path, rel: str) -> np.ndarray:
    _, tokens = open_shard(out / rel)
    return np.asarray(tokens)
