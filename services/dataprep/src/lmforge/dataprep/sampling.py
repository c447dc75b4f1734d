"""`lmforge-dataprep sample`: random kept and dropped documents, for spot checks.

One pass over the Parquet files with a reservoir per side, so memory holds only the
documents shown, whatever the size of the run."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import TextIO

from lmforge.common.storage import Store, open_store
from lmforge.dataprep import layout
from lmforge.dataprep.dedup_global import load_removed
from lmforge.dataprep.parquet_io import iter_batches


def _rows(store: Store, prefix: str, columns: list[str]) -> Iterator[dict]:
    for rel in store.list(prefix):
        if rel.endswith(".parquet"):
            for batch in iter_batches(store, rel, columns):
                yield from batch.to_pylist()


def reservoir(rows: Iterator[dict], k: int, rng: random.Random) -> tuple[list[dict], int]:
    """k rows drawn uniformly from the stream (Algorithm R), and how many rows there were."""
    chosen: list[dict] = []
    seen = 0
    for row in rows:
        seen += 1
        if len(chosen) < k:
            chosen.append(row)
        else:
            slot = rng.randrange(seen)
            if slot < k:
                chosen[slot] = row
    return chosen, seen


def _kept_rows(store: Store, columns: list[str]) -> Iterator[dict]:
    """Documents the filters kept, less those dedup removed (once dedup has run), input by input."""
    deduplicated = store.exists(layout.DEDUP_STATS)
    for i in range(len(json.loads(store.read_text(layout.INPUTS)))):
        if not store.exists(layout.docs(i)):
            continue
        removed = set(load_removed(store, i)[0].tolist()) if deduplicated else set()
        yield from (row for row in _rows(store, layout.docs(i), columns) if row["doc_id"] not in removed)


def print_sample(output: str, n: int, seed: int, chars: int, out: TextIO) -> None:
    store = open_store(output)
    rng = random.Random(seed)
    kept, n_kept_total = reservoir(_kept_rows(store, ["doc_id", "url", "text", "language"]), (n + 1) // 2, rng)
    dropped, n_dropped_total = reservoir(_rows(store, "rejects", ["url", "stage", "reason", "text_preview"]),
                                         n - len(kept), rng)
    for row in kept:
        text = row["text"][:chars].replace("\n", " ")
        out.write(f"KEPT     [{row['language']}] {row['url']}\n    {text}\n\n")
    for row in dropped:
        text = (row["text_preview"] or "")[:chars].replace("\n", " ")
        out.write(f"DROPPED  {row['stage']}/{row['reason']} {row['url']}\n    {text}\n\n")
    out.write(f"# {len(kept)} kept and {len(dropped)} dropped shown, "
              f"of {n_kept_total} kept and {n_dropped_total} dropped\n")
