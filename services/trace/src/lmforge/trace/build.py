"""Build one partition's trace index: an infini-gram v4 index directory (see format.py for the layout).

We write the engine's input files ourselves, streaming one document at a time (never the partition's tokens as
Python lists), and call the `rust_indexing` binary shipped inside the infini_gram wheel for the suffix array:

    tokenized.0  for each document: the all-ones separator token, then its tokens (little-endian u16 or u32)
    offset.0     u64 byte offset of each document's separator in tokenized.0
    metadata.0   one JSON line per document ({key: metadata[key] for key in format.METADATA_KEYS}), ASCII
    metaoff.0    u64 byte offset of each metadata line
    unigram.npy  u64 count of every token id (0..vocab_size-1) in the partition: the query-time unigram model
    table.0      the suffix array (pointers of `ratio` bytes), from `rust_indexing make-part | merge | concat`

Memory is bounded by `part_tokens`: the tokens file is cut into ⌈bytes / part bytes⌉ equal parts, each part's
suffix array is built by its own `make-part` process (≈20 B per token of the part; `threads` of them at once),
then one streaming `merge` and `concat`. Neighbouring parts overlap by `hack` bytes (infini-gram's HACK, 100 000
bytes = 50 000 u16 tokens, or less when a part is smaller): the merge orders suffixes by their first `hack` bytes,
so a verbatim repeat longer than that inside one partition may be ordered inexactly (infini-gram's own limit;
one part, the usual case for a shard partition under part_tokens, has no such limit). u32 parts (vocab_size
>= 65535) are sorted in numpy instead of make-part (see _make_part_u32); merge and concat are the same.

A partition with no documents gets empty files and an entry with documents = 0: the engine cannot open an empty
index (it divides by the token count), so TraceIndex.open skips such partitions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import infini_gram
import numpy as np

from lmforge.common.errors import InputError, StorageError
from lmforge.common.storage import sha256_file
from lmforge.trace.format import METADATA_KEYS, PARTITION_FILES, index_token_dtype

HACK_BYTES = 100_000  # infini-gram's overlap between parts (indexing.py's HACK)
_UNIGRAM_CHUNK = 1 << 20  # tokens per chunk when counting unigrams (bincount copies a chunk as int64: 8 MiB)


def rust_indexing() -> Path:
    """The suffix-array builder bundled with the installed infini_gram wheel."""
    binary = Path(infini_gram.__file__).parent / "rust_indexing"
    if not os.access(binary, os.X_OK):
        raise InputError(f"infini_gram's rust_indexing binary is missing or not executable at {binary}")
    return binary


def numpy_dtype(token_dtype: str) -> np.dtype:
    return np.dtype({"u16": "<u2", "u32": "<u4"}[token_dtype])


def pointer_ratio(ds_size: int) -> int:
    """Bytes per suffix-array pointer: ⌈log2(ds_size) / 8⌉ as infini-gram computes it, in integers."""
    ratio = 1
    while 256**ratio < ds_size:
        ratio += 1
    return ratio


def build_partition(docs: Iterable[tuple[np.ndarray, dict]], out_dir: Path, name: str, *, vocab_size: int,
                    eos_token_id: int, part_tokens: int = 25_000_000, threads: int = 1,
                    scratch: Path | None = None) -> dict:
    """Index `docs` (each: token ids of one document without its trailing EOT, and its metadata) into `out_dir`.
    Returns the partition's entry ({name, tokens, documents, files}); the caller writes it as entry.json."""
    if not 0 <= eos_token_id < vocab_size:
        raise InputError(f"eos_token_id {eos_token_id} is outside the vocabulary (vocab_size {vocab_size})")
    if part_tokens < 1 or threads < 1:
        raise InputError(f"part_tokens ({part_tokens}) and threads ({threads}) must be at least 1")
    dtype = numpy_dtype(index_token_dtype(vocab_size))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokens, documents = _write_documents(docs, out_dir, dtype, vocab_size)
    _write_unigram(out_dir, dtype, vocab_size)
    table = out_dir / "table.0"
    table.unlink(missing_ok=True)
    if documents == 0:
        table.touch()
    else:
        scratch_root = Path(scratch) if scratch is not None else out_dir.parent
        scratch_root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{name}-build-", dir=scratch_root))
        try:
            _build_suffix_array(out_dir / "tokenized.0", table, work, dtype.itemsize, part_tokens, threads)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    files = {f: {"bytes": (out_dir / f).stat().st_size, "sha256": sha256_file(out_dir / f)} for f in PARTITION_FILES}
    return {"name": name, "tokens": tokens, "documents": documents, "files": files}


def _write_documents(docs: Iterable[tuple[np.ndarray, dict]], out_dir: Path, dtype: np.dtype,
                     vocab_size: int) -> tuple[int, int]:
    separator = np.array([np.iinfo(dtype).max], dtype=dtype).tobytes()
    tokens = documents = data_pos = meta_pos = 0
    with open(out_dir / "tokenized.0", "wb") as data, open(out_dir / "offset.0", "wb") as offsets, \
            open(out_dir / "metadata.0", "wb") as meta, open(out_dir / "metaoff.0", "wb") as metaoffs:
        for ids, metadata in docs:
            missing = [key for key in METADATA_KEYS if key not in metadata]
            if missing:
                raise InputError(f"document {documents} of the partition has no {', '.join(missing)} in its metadata")
            ids = _checked_ids(ids, vocab_size, metadata["doc_id"])
            body = ids.astype(dtype, copy=False).tobytes()
            line = (json.dumps({key: metadata[key] for key in METADATA_KEYS}) + "\n").encode("ascii")
            offsets.write(np.uint64(data_pos).astype("<u8").tobytes())
            metaoffs.write(np.uint64(meta_pos).astype("<u8").tobytes())
            data.write(separator)
            data.write(body)
            meta.write(line)
            data_pos += len(separator) + len(body)
            meta_pos += len(line)
            tokens += ids.size
            documents += 1
    return tokens, documents


def _checked_ids(ids, vocab_size: int, doc_id) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
        raise InputError(f"document {doc_id!r}: token ids must be a 1-d integer array, got {ids.dtype} {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise InputError(f"document {doc_id!r}: token id {int(ids.max() if ids.max() >= vocab_size else ids.min())} "
                         f"is outside the vocabulary (vocab_size {vocab_size})")
    return ids


def _write_unigram(out_dir: Path, dtype: np.dtype, vocab_size: int) -> None:
    """Count every token id from tokenized.0 in bounded chunks (separators excluded)."""
    counts = np.zeros(vocab_size, dtype=np.uint64)
    separator = np.iinfo(dtype).max
    # read, not memory-mapped: a mapped file's touched pages count in the task's RSS (the whole partition)
    with open(out_dir / "tokenized.0", "rb") as fh:
        while (chunk := np.fromfile(fh, dtype=dtype, count=_UNIGRAM_CHUNK)).size:
            chunk = chunk[chunk != separator]
            counts += np.bincount(chunk, minlength=vocab_size).astype(np.uint64)
    np.save(out_dir / "unigram.npy", counts)


def _part_ranges(ds_size: int, width: int, part_tokens: int) -> tuple[list[tuple[int, int]], int]:
    """Byte ranges of the make-part parts and the overlap (hack) between neighbours. rust_indexing's merge needs
    every part but the last to end exactly `hack` bytes into the next one, hence equal parts and hack ≤ the last."""
    parts = max(1, -(-ds_size // (part_tokens * width)))
    if parts == 1:
        return [(0, ds_size)], 0
    size = -(-ds_size // parts)
    size += -size % width
    last = ds_size - (parts - 1) * size
    while last <= 0:  # rounding up to whole tokens left nothing for the last part
        parts -= 1
        last = ds_size - (parts - 1) * size
    hack = min(HACK_BYTES, last) // width * width
    ranges = [(i * size, (i + 1) * size + hack) for i in range(parts - 1)] + [((parts - 1) * size, ds_size)]
    return ranges, hack


def _build_suffix_array(data: Path, table: Path, work: Path, width: int, part_tokens: int, threads: int) -> None:
    ds_size = data.stat().st_size
    ratio = pointer_ratio(ds_size)
    common = ["--ratio", str(ratio), "--token-width", str(width)]
    parts_dir, merged_dir = work / "parts", work / "merged"
    parts_dir.mkdir()
    merged_dir.mkdir()
    ranges, hack = _part_ranges(ds_size, width, part_tokens)

    def make_part(byte_range: tuple[int, int]) -> None:
        if width == 4:
            _make_part_u32(data, parts_dir, *byte_range, ratio)
            return
        _run("make-part", "--data-file", str(data), "--parts-dir", str(parts_dir), "--start-byte",
             str(byte_range[0]), "--end-byte", str(byte_range[1]), *common)

    with ThreadPoolExecutor(max_workers=min(threads, len(ranges))) as pool:
        list(pool.map(make_part, ranges))
    if len(ranges) == 1:  # one part is the whole suffix array already
        (parts_dir / f"0-{ds_size}").rename(table)
    else:
        _run("merge", "--data-file", str(data), "--parts-dir", str(parts_dir), "--merged-dir", str(merged_dir),
             "--num-threads", str(threads), "--hacksize", str(hack), *common)
        shutil.rmtree(parts_dir)
        # merge may use fewer threads than asked on a small input; concat must read exactly its outputs
        merged = len(list(merged_dir.iterdir()))
        _run("concat", "--data-file", str(data), "--merged-dir", str(merged_dir), "--merged-file", str(table),
             "--num-threads", str(merged), *common)
    expected = ds_size // width * ratio
    if table.stat().st_size != expected:
        raise StorageError(f"rust_indexing wrote a {table.stat().st_size}-byte suffix array for {data}; "
                           f"expected {expected} bytes")


def _make_part_u32(data: Path, parts_dir: Path, start: int, end: int, ratio: int) -> None:
    """make-part for 4-byte tokens. rust_indexing's u32 suffix sort allocates a bucket per possible value
    (2^32 × 8 bytes = 32 GiB), so u32 parts are sorted here instead, by prefix doubling in numpy (≈60 B per
    token of the part, ≈3.5 s per million tokens on one core), and written in make-part's format:
    `ratio`-byte little-endian byte offsets from `start`."""
    tokens = np.fromfile(data, dtype="<u4", count=(end - start) // 4, offset=start)
    # the index compares bytes: a little-endian token's byte order is its byte-swapped value's numeric order
    order = suffix_array(tokens.byteswap().astype(np.int64))
    pointers = (order.astype("<u8") * 4).view(np.uint8).reshape(-1, 8)[:, :ratio]
    (parts_dir / f"{start}-{end}").write_bytes(pointers.tobytes())


def suffix_array(keys: np.ndarray) -> np.ndarray:
    """Positions of `keys` ordered by the suffix starting there (a suffix that is a prefix of another sorts first):
    prefix doubling, each round ranking by (rank of the first k keys, rank of the next k)."""
    n = keys.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    rank = np.unique(keys, return_inverse=True)[1].astype(np.int64).reshape(-1)
    order = np.argsort(rank, kind="stable")
    k = 1
    while k < n and rank[order[-1]] < n - 1:
        second = np.full(n, -1, dtype=np.int64)
        second[:n - k] = rank[k:]
        order = np.lexsort((second, rank))
        first_sorted, second_sorted = rank[order], second[order]
        new_group = np.ones(n, dtype=bool)
        new_group[1:] = (first_sorted[1:] != first_sorted[:-1]) | (second_sorted[1:] != second_sorted[:-1])
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.cumsum(new_group) - 1
        k *= 2
    return order


def _run(command: str, *args: str) -> None:
    done = subprocess.run([str(rust_indexing()), command, *args], capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise StorageError(f"rust_indexing {command} failed (exit {done.returncode}): {tail}")
