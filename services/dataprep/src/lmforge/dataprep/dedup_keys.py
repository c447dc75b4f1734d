"""Sectioned key objects: an input's dedup keys (layout.dedup_keys) and a combined object of an
input group's keys for a range of partitions (layout.combined_keys, combine.py) share one layout,
cut into a section per dedup partition, so a reader gets any run of sections with two ranged reads.

Layout, little-endian throughout:

    P                      uint64: the number of sections (partitions) in the object
    offsets[0 … P]         uint64: byte offset of each section from the start; offsets[P] is the end
    section k < P          n_k (doc id, key, signature row) uint64 triples, in doc-id order; in a
                           band partition's section (the first `signed` partitions of the run)
                           followed by the same documents' signatures, uint32 × num_perm each, in
                           the same order, so signatures travel with the keys

The row is the document's index among its input's kept documents. Sections are in partition
order: a combine task reads its range of every input's sections as one body (read_sections), a
dedup task reads its section's triples from each combined object (read_key_part) and then only
the signature rows of its candidates (read_signature_rows: a few coalesced ranges per object).
Which partitions are band partitions and num_perm come from the run's MinHash config, which every
stage checks against work/minhash_config.json.

Partition p is key column p // partitions_per_band (LSH bands, then URL, then content) cut by
key range: the keys with key % partitions_per_band == p % partitions_per_band.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from lmforge.common.errors import InputError
from lmforge.common.store import Store

_WORD = 8
TRIPLE_BYTES = 3 * _WORD
SIGNATURE_DTYPE = np.dtype("<u4")
COALESCE_GAP_BYTES = 1 << 20  # candidate rows this close share one ranged read
MAX_READ_BYTES = 8 << 20  # one signature read at most: a dedup task's reads in flight stay bounded


@dataclass(frozen=True)
class KeyFormat:
    """What a section's rows hold: partitions below `signed` carry signatures of num_perm uint32."""

    signed: int
    num_perm: int

    @property
    def signature_bytes(self) -> int:
        return SIGNATURE_DTYPE.itemsize * self.num_perm

    def row_bytes(self, partition: int) -> int:
        return TRIPLE_BYTES + (self.signature_bytes if partition < self.signed else 0)


@dataclass
class Section:
    """One partition's rows of one object: (n, 3) triples and, in a band partition, (n, num_perm) signatures."""

    triples: np.ndarray
    signatures: np.ndarray | None

    def __len__(self) -> int:
        return len(self.triples)


def write_key_object(fh: BinaryIO, section_bytes: list[int], chunks: Iterable) -> None:
    """Write the header for sections of the given sizes, then the sections' bytes from `chunks`
    (bytes-like, in order, adding up to the sizes)."""
    header = (1 + len(section_bytes) + 1) * _WORD
    offsets = np.cumsum([header, *section_bytes], dtype=np.uint64)
    fh.write(np.asarray([len(section_bytes), *offsets], dtype="<u8").tobytes())
    written = header
    for chunk in chunks:
        fh.write(chunk)
        written += memoryview(chunk).nbytes
    if written != int(offsets[-1]):
        raise AssertionError(f"key object: wrote {written} bytes, header says {int(offsets[-1])}")


def write_input_keys(fh: BinaryIO, doc_ids: np.ndarray, keys: np.ndarray, sections: list[tuple[int, int]],
                     slices: int, signatures: np.ndarray | None = None, signed: int = 0) -> None:
    """One input's key file. `doc_ids`: its kept documents in row order (ascending); `keys`:
    (n, columns) uint64; `sections`: (column, slice) of each partition in partition order;
    `slices`: partitions per key column; `signatures`: (n, num_perm) uint32, written after the
    triples of each of the first `signed` sections."""
    if signed and signatures is None:
        raise ValueError("band sections carry signatures: pass them")
    doc_ids = np.asarray(doc_ids, dtype="<u8")
    rows = np.arange(len(doc_ids), dtype="<u8")
    by_column: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def members(column: int, key_slice: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows of one section, ascending (a stable sort by slice keeps row order within one), and the column."""
        if column not in by_column:
            column_keys = keys[:, column] if len(doc_ids) else np.zeros(0, np.uint64)
            slice_of = column_keys % np.uint64(slices)
            order = np.argsort(slice_of, kind="stable")
            bounds = np.searchsorted(slice_of[order], np.arange(slices + 1, dtype=np.uint64))
            by_column[column] = column_keys, order, bounds
        column_keys, order, bounds = by_column[column]
        return order[bounds[key_slice] : bounds[key_slice + 1]], column_keys

    def section(p: int) -> list[bytes]:
        mine, column_keys = members(*sections[p])
        triples = np.empty((len(mine), 3), dtype="<u8")
        triples[:, 0], triples[:, 1], triples[:, 2] = doc_ids[mine], column_keys[mine], rows[mine]
        if p >= signed:
            return [triples.tobytes()]
        return [triples.tobytes(), np.ascontiguousarray(signatures[mine], dtype=SIGNATURE_DTYPE).tobytes()]

    fmt = KeyFormat(signed, signatures.shape[1] if signatures is not None else 0)
    sizes = [len(members(*sections[p])[0]) * fmt.row_bytes(p) for p in range(len(sections))]
    write_key_object(fh, sizes, (chunk for p in range(len(sections)) for chunk in section(p)))


def encode_keys(doc_ids: np.ndarray, keys: np.ndarray, sections: list[tuple[int, int]], slices: int,
                signatures: np.ndarray | None = None, signed: int = 0) -> bytes:
    """write_input_keys, as bytes."""
    out = io.BytesIO()
    write_input_keys(out, doc_ids, keys, sections, slices, signatures, signed)
    return out.getvalue()


def _not_a_key_object(store: Store, rel: str, what: str) -> InputError:
    return InputError(f"{store.join(rel)}: {what}; not a key object this run wrote (a torn or foreign file): "
                      "rerun the stage that writes it, or use a fresh output directory")


def _checked_offsets(store: Store, rel: str, raw: bytes, count: int) -> np.ndarray:
    if len(raw) != count * _WORD:
        raise _not_a_key_object(store, rel, "truncated header")
    offsets = np.frombuffer(raw, dtype="<u8")
    if np.any(offsets[1:] < offsets[:-1]):
        raise _not_a_key_object(store, rel, "section offsets out of order")
    return offsets


def _split(store: Store, rel: str, fmt: KeyFormat, partition: int, data: memoryview) -> Section:
    row = fmt.row_bytes(partition)
    n, rest = divmod(len(data), row)
    if rest:
        raise _not_a_key_object(store, rel, f"partition {partition}'s section is {len(data)} bytes, "
                                            f"not a multiple of its {row}-byte rows")
    triples = np.frombuffer(data[: n * TRIPLE_BYTES], dtype="<u8").reshape(n, 3)
    if partition >= fmt.signed:
        return Section(triples, None)
    signatures = np.frombuffer(data[n * TRIPLE_BYTES :], dtype=SIGNATURE_DTYPE).reshape(n, fmt.num_perm)
    return Section(triples, signatures)


def read_sections(store: Store, rel: str, fmt: KeyFormat, sections: range, first_partition: int = 0
                  ) -> list[Section]:
    """Sections `sections` (indices in the object, whose first is partition `first_partition`):
    one ranged read of their offsets, one of their bytes."""
    start, stop = sections.start, sections.stop
    offsets = _checked_offsets(store, rel, store.read_range(rel, (1 + start) * _WORD, (stop - start + 1) * _WORD),
                               stop - start + 1)
    length = int(offsets[-1] - offsets[0])
    body = memoryview(store.read_range(rel, int(offsets[0]), length) if length else b"")
    if len(body) != length:
        raise _not_a_key_object(store, rel, f"truncated: sections {start}-{stop - 1} end at {int(offsets[-1])}")
    bounds = (offsets - offsets[0]).tolist()
    return [_split(store, rel, fmt, first_partition + k, body[bounds[j] : bounds[j + 1]])
            for j, k in enumerate(sections)]


@dataclass
class KeyPart:
    """A section's triples in one object and where its signatures are (a band partition's)."""

    rel: str
    triples: np.ndarray
    signatures_at: int


def read_key_part(store: Store, rel: str, fmt: KeyFormat, index: int, count: int, partition: int) -> KeyPart:
    """Section `index` of an object of `count` sections (partition `partition`): one ranged read of
    the header up to its end offset, one of its triples."""
    words = _checked_offsets(store, rel, store.read_range(rel, 0, (index + 3) * _WORD), index + 3)
    if int(words[0]) != count or int(words[1]) != (count + 2) * _WORD:
        raise _not_a_key_object(store, rel, f"header says {int(words[0])} sections, expected {count}")
    start, end = int(words[index + 1]), int(words[index + 2])
    n, rest = divmod(end - start, fmt.row_bytes(partition))
    if rest:
        raise _not_a_key_object(store, rel, f"partition {partition}'s section is {end - start} bytes, "
                                            f"not a multiple of its {fmt.row_bytes(partition)}-byte rows")
    raw = store.read_range(rel, start, n * TRIPLE_BYTES) if n else b""
    if len(raw) != n * TRIPLE_BYTES:
        raise _not_a_key_object(store, rel, f"truncated: partition {partition}'s section ends at {end}")
    return KeyPart(rel, np.frombuffer(raw, dtype="<u8").reshape(n, 3), start + n * TRIPLE_BYTES)


def signature_reads(positions: np.ndarray, row_bytes: int) -> list[tuple[int, int]]:
    """[first, stop) row ranges that cover the sorted `positions`: rows less than
    COALESCE_GAP_BYTES apart share a range, and no range passes MAX_READ_BYTES. Their number is
    at most the section's bytes / COALESCE_GAP_BYTES + its bytes / MAX_READ_BYTES + 1, whatever
    the number of candidates."""
    reads: list[tuple[int, int]] = []
    gap_rows, max_rows = max(1, COALESCE_GAP_BYTES // row_bytes), max(1, MAX_READ_BYTES // row_bytes)
    for position in positions.tolist():
        if reads and position - reads[-1][1] < gap_rows and position + 1 - reads[-1][0] <= max_rows:
            reads[-1] = (reads[-1][0], position + 1)
        else:
            reads.append((position, position + 1))
    return reads


def read_signature_rows(store: Store, part: KeyPart, fmt: KeyFormat, positions: np.ndarray) -> np.ndarray:
    """The signatures of rows `positions` (sorted, unique) of a band section, (len, num_perm)."""
    row = fmt.signature_bytes
    out = np.empty((len(positions), fmt.num_perm), dtype=SIGNATURE_DTYPE)
    done = 0
    for first, stop in signature_reads(positions, row):
        raw = store.read_range(part.rel, part.signatures_at + first * row, (stop - first) * row)
        if len(raw) != (stop - first) * row:
            raise _not_a_key_object(store, part.rel, "truncated signatures")
        block = np.frombuffer(raw, dtype=SIGNATURE_DTYPE).reshape(stop - first, fmt.num_perm)
        wanted = positions[done : done + np.searchsorted(positions[done:], stop)]
        out[done : done + len(wanted)] = block[wanted - first]
        done += len(wanted)
    return out
