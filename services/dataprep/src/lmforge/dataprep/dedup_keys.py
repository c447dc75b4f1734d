"""One input's dedup keys in one file, cut into a section per dedup partition, so the task of a
partition reads its own section of every input with one ranged read and nothing else.

File layout (layout.dedup_keys(i)), little-endian uint64 throughout:

    P                      the number of dedup partitions
    offsets[0 … P + 1]     byte offset of each section from the start of the file; offsets[P + 1]
                           is the end of the file
    section p < P          (n_p, 2) (doc id, key) pairs of partition p, in doc-id order
    section P              every doc id of the input, in order: the row of each document's
                           signature in layout.signatures(i), read only by a partition that
                           has to verify a candidate of this input

Partition p is key column p // partitions_per_band (LSH bands, then URL, then content) cut by
key range: the keys with key % partitions_per_band == p % partitions_per_band. With N documents
in the corpus a dedup task holds about 16·N / partitions_per_band bytes of keys.
"""

from __future__ import annotations

import io

import numpy as np

from lmforge.common.errors import InputError
from lmforge.common.storage import Store
from lmforge.dataprep import layout

_WORD = 8


def encode_keys(doc_ids: np.ndarray, keys: np.ndarray, sections: list[tuple[int, int]], slices: int) -> bytes:
    """The key file of one input. `keys`: (n, columns) uint64; `sections`: (column, slice) of each
    partition in partition order; `slices`: partitions per key column."""
    doc_ids = np.asarray(doc_ids, dtype="<u8")
    bodies = []
    for column, key_slice in sections:
        column_keys = keys[:, column] if len(doc_ids) else np.zeros(0, np.uint64)
        mine = column_keys % np.uint64(slices) == key_slice if slices > 1 else slice(None)
        pairs = np.empty((len(doc_ids[mine]), 2), dtype="<u8")
        pairs[:, 0], pairs[:, 1] = doc_ids[mine], column_keys[mine]
        bodies.append(pairs.tobytes())
    bodies.append(doc_ids.tobytes())
    header_words = 1 + len(bodies) + 1
    offsets = np.cumsum([header_words * _WORD, *(len(b) for b in bodies)])
    out = io.BytesIO()
    out.write(np.asarray([len(sections), *offsets], dtype="<u8").tobytes())
    for body in bodies:
        out.write(body)
    return out.getvalue()


class KeyFile:
    """Reads sections of one input's key file, the header once."""

    def __init__(self, store: Store, i: int, partitions: int):
        self.store, self.rel = store, layout.dedup_keys(i)
        raw = store.read_range(self.rel, 0, (partitions + 3) * _WORD)
        header = np.frombuffer(raw, dtype="<u8")
        if len(header) != partitions + 3 or int(header[0]) != partitions:
            raise InputError(f"{store.join(self.rel)}: written for {int(header[0]) if len(header) else '?'} dedup "
                             f"partitions, the config makes {partitions}; use a fresh output directory")
        self.offsets = header[1:].astype(np.int64)

    def _section(self, k: int) -> np.ndarray:
        start, end = int(self.offsets[k]), int(self.offsets[k + 1])
        raw = self.store.read_range(self.rel, start, end - start)
        if len(raw) != end - start:
            raise InputError(f"{self.store.join(self.rel)}: truncated (section {k})")
        return np.frombuffer(raw, dtype="<u8")

    def partition(self, p: int) -> tuple[np.ndarray, np.ndarray]:
        """(doc ids, keys) of partition p, in doc-id order."""
        pairs = self._section(p).reshape(-1, 2)
        return pairs[:, 0], pairs[:, 1]

    def doc_ids(self) -> np.ndarray:
        return self._section(len(self.offsets) - 2)
