"""`lmforge-dataprep sample`: random kept and dropped documents, for spot checks."""

from __future__ import annotations

import random
from typing import TextIO

import pyarrow.parquet as pq

from lmforge.common.storage import open_store
from lmforge.dataprep import layout


def _rows(store, prefix: str, columns: list[str]) -> list[dict]:
    rows: list[dict] = []
    for rel in store.list(prefix):
        if rel.endswith(".parquet"):
            rows.extend(pq.read_table(store.local_path(rel), columns=columns).to_pylist())
    return rows


def print_sample(output: str, n: int, seed: int, chars: int, out: TextIO) -> None:
    store = open_store(output)
    rng = random.Random(seed)
    kept = _rows(store, "work/docs", ["doc_id", "url", "text", "language"])
    if store.exists(layout.MANIFEST):
        from lmforge.dataprep.dedup_global import load_removed

        removed = set(load_removed(store)[0].tolist())
        kept = [row for row in kept if row["doc_id"] not in removed]
    dropped = _rows(store, "rejects", ["url", "stage", "reason", "text_preview"])
    n_kept = min(len(kept), (n + 1) // 2)
    n_dropped = min(len(dropped), n - n_kept)
    n_kept = min(len(kept), n - n_dropped)
    for row in rng.sample(kept, n_kept):
        text = row["text"][:chars].replace("\n", " ")
        out.write(f"KEPT     [{row['language']}] {row['url']}\n    {text}\n\n")
    for row in rng.sample(dropped, n_dropped):
        text = (row["text_preview"] or "")[:chars].replace("\n", " ")
        out.write(f"DROPPED  {row['stage']}/{row['reason']} {row['url']}\n    {text}\n\n")
    out.write(f"# {n_kept} kept and {n_dropped} dropped shown, of {len(kept)} kept and {len(dropped)} dropped\n")
