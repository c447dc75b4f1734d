"""One input's dedup keys in one file, cut into a section per dedup partition, so the task of a
partition reads its own section of every input with one ranged read and nothing else.

File layout (layout.dedup_keys(i)), little-endian uint64 throughout:

    P                      the number of dedup partitions
    offsets[0 … P]         byte offset of each section from the start of the file; offsets[P]
                           is the end of the file
    section p < P          (n_p, 3) (doc id, key, signature row) of partition p, in doc-id order;
                           the row is the document's in layout.signatures(i)

A task reads offsets[p] and offsets[p + 1] (one 16-byte ranged read) and then its section.

Partition p is key column p // partitions_per_band (LSH bands, then URL, then content) cut by
key range: the keys with key % partitions_per_band == p % partitions_per_band. With N documents
in the corpus a dedup task holds about 24·N / partitions_per_band bytes of keys.
"""

from __future__ import annotations

import io

import numpy as np

from lmforge.common.errors import InputError
from lmforge.common.storage import Store
from lmforge.dataprep import layout

_WORD = 8


def encode_keys(doc_ids: np.ndarray, keys: np.ndarray, sections: list[tuple[int, int]], slices: int) -> bytes:
    """The key file of one input. `doc_ids`: the input's kept documents in signature-row order
    (ascending); `keys`: (n, columns) uint64; `sections`: (column, slice) of each partition in
    partition order; `slices`: partitions per key column."""
    doc_ids = np.asarray(doc_ids, dtype="<u8")
    rows = np.arange(len(doc_ids), dtype="<u8")
    bodies = []
    for column, key_slice in sections:
        column_keys = keys[:, column] if len(doc_ids) else np.zeros(0, np.uint64)
        mine = column_keys % np.uint64(slices) == key_slice if slices > 1 else slice(None)
        triples = np.empty((len(doc_ids[mine]), 3), dtype="<u8")
        triples[:, 0], triples[:, 1], triples[:, 2] = doc_ids[mine], column_keys[mine], rows[mine]
        bodies.append(triples.tobytes())
    header_words = 1 + len(bodies) + 1
    offsets = np.cumsum([header_words * _WORD, *(len(b) for b in bodies)])
    out = io.BytesIO()
    out.write(np.asarray([len(sections), *offsets], dtype="<u8").tobytes())
    for body in bodies:
        out.write(body)
    return out.getvalue()


def read_partition(store: Store, i: int, partition: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(doc ids, keys, signature rows) of one partition in input i's key file: two ranged reads
    (its two offsets, then its section), whatever the number of partitions."""
    rel = layout.dedup_keys(i)
    raw = store.read_range(rel, (1 + partition) * _WORD, 2 * _WORD)
    start, end = np.frombuffer(raw, dtype="<u8").tolist() if len(raw) == 2 * _WORD else (1, 0)
    if end < start or (end - start) % (3 * _WORD):
        raise InputError(f"{store.join(rel)}: not a key file of {partition + 1}+ dedup partitions; "
                         "use a fresh output directory")
    raw = store.read_range(rel, start, end - start)
    if len(raw) != end - start:
        raise InputError(f"{store.join(rel)}: truncated (partition {partition})")
    triples = np.frombuffer(raw, dtype="<u8").reshape(-1, 3)
    return triples[:, 0], triples[:, 1], triples[:, 2]
