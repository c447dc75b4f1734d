"""s3:// data sources read in place: a rank fetches the byte ranges its sequences lie in, as the
shards' blocks (`block_bytes`, 4 MiB), through the node's block cache (block_cache.py); no
node ever copies the whole data set.

- Opening a source reads manifest.json and its split's index (lmforge.common.shard_index), never
  the other split's: a shard's sequence count follows from its token count, so no shard is
  fetched before a sequence of it is read.
- A shard's block sidecar (its blocks' sha256) is fetched with its first block and checked against
  the index; the sidecars of the SIDECARS_KEPT most recently read shards stay in memory, so a
  rank's memory does not grow with the corpus.
- Each block is verified once, when it is fetched: the object's size against the index
  (1024 + tokens × bytes per token, from the GET's Content-Range) and the block's sha256 against
  the sidecar. A version-1 manifest lists the block hashes itself, or none (older data prep): then
  the whole shard is one block, checked against its `sha256`. A shard's header (magic, version,
  token count, token size, tokenizer) is checked the first time a process reads from the shard.
- `StreamingSource` has ShardSource's interface (num_sequences, sequence(), tokenizer_sha256,
  vocab_size, name, sequence_ends, block_bytes, token_bytes), so a sampler (sampling.py) draws the
  same sequences from either and a batch stays the same pure function of (seed, step, rank);
  `sequence()` returns the same bytes.
- `read_batch` is a sampler's batch() with a batch's sequences read by a pool of threads, so a
  batch's missing blocks are fetched in parallel.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lmforge.common.errors import ConfigError, InputError, ShardFormatError, StorageError
from lmforge.common.logging import get_logger
from lmforge.common.s3 import S3Location
from lmforge.common.s3_store import S3Store
from lmforge.common.shard_index import (
    MANIFEST,
    ShardEntry,
    block_digest,
    check_sidecar,
    parse_manifest,
    read_split_index,
)
from lmforge.common.shards import HEADER_BYTES, ShardHeader, token_dtype
from lmforge.common.store import ObjectMissing, local_path_of, scheme_of
from lmforge.trainer.block_cache import BlockCache
from lmforge.trainer.data import SampleRef, SequenceCounts, ShardSource, locate_sequence
from lmforge.trainer.sampling import Sampler

FETCH_THREADS = 16  # sequences of a batch read at once (each a block fetch at worst)
SIDECARS_KEPT = 4096  # shards whose block digests a source keeps in memory (32 bytes per block)


@dataclass
class _StreamedShard:
    key: str
    url: str
    tokens: int
    size: int  # of the .bin object: header + tokens
    block_bytes: int
    sequences: int
    entry: ShardEntry
    inline_digests: bytes | None  # a version-1 manifest's block digests; None: in the shard's sidecar
    header_checked: bool = field(default=False)


class StreamingSource(SequenceCounts):
    """One split of a data-prep output under s3://BUCKET/PREFIX, read through `cache`."""

    def __init__(self, uri: str, split: str, seq_len: int, cache: BlockCache, *, name: str = ""):
        loc = S3Location.parse(uri)
        self.uri = uri.rstrip("/")
        self.name = name or Path(self.uri).name
        self.seq_len, self.cache = seq_len, cache
        self.prefix = "/".join(_safe_parts(loc.key, uri))
        self.store = S3Store(f"s3://{loc.bucket}/{self.prefix}", concurrency=FETCH_THREADS)
        self.manifest = parse_manifest(self._manifest_bytes(), f"{self.uri}/{MANIFEST}")
        self.tokenizer_sha256 = self.manifest["tokenizer"]["sha256"]
        self.vocab_size = self.manifest["tokenizer"]["vocab_size"]
        self.eot_id = self.manifest["tokenizer"].get("eot_id")
        self.dtype = token_dtype(self.vocab_size)
        self._sidecars: OrderedDict[str, bytes] = OrderedDict()
        self._sidecars_lock = threading.Lock()
        entries = read_split_index(self.manifest, split, self._object_bytes, self.uri)
        if not entries:
            raise ConfigError(f"data source {self.uri}: no {split!r} shards in manifest.json")
        self.shards = [s for s in map(self._shard, entries) if s.sequences > 0]
        if not self.shards:
            raise ConfigError(f"data source {self.uri}: {split} shards are shorter than one sequence of {seq_len}")
        largest = max(s.block_bytes for s in self.shards)
        if largest > cache.max_bytes:
            raise ConfigError(f"data.cache_bytes {cache.max_bytes} is smaller than one block of {self.uri} "
                              f"({largest} bytes)")
        self._ends = np.cumsum([s.sequences for s in self.shards])
        self.block_bytes = max(e.block_bytes for e in entries)  # as ShardSource's (sampling.py)
        get_logger("trainer").info("data_stream_open", source=self.uri, split=split, shards=len(self.shards),
                                   bytes=sum(s.size for s in self.shards), cache=str(cache.root),
                                   cache_bytes=cache.max_bytes)

    @property
    def token_bytes(self) -> int:
        return self.dtype.itemsize

    def sequence(self, index: int, offset: int = 0, length: int = 0) -> np.ndarray:
        """seq_len + 1 tokens: inputs and (shifted by one) targets, or a piece of them (as ShardSource.sequence)."""
        shard_index, start_in_shard = locate_sequence(self._ends, index)
        shard = self.shards[shard_index]
        if not shard.header_checked:
            self._check_header(shard)
        itemsize = self.dtype.itemsize
        start = start_in_shard * self.seq_len + offset
        raw = self._read(shard, HEADER_BYTES + start * itemsize, ((length or self.seq_len) + 1) * itemsize)
        return np.frombuffer(raw, dtype=self.dtype).astype(np.int64)

    # -- internals -------------------------------------------------------------------------

    def _manifest_bytes(self) -> bytes:
        try:
            return self.store.read_bytes(MANIFEST)
        except ObjectMissing as exc:  # no such object, or no such bucket
            raise InputError(f"data source {self.uri}: no {self.store.join(MANIFEST)} "
                             "(not a data-prep output)") from exc

    def _object_bytes(self, rel: str) -> bytes | None:
        """A small object of the data set (an index, a sidecar), whole; None when it does not exist."""
        rel = "/".join(_safe_parts(rel, self.uri))
        try:
            return self.store.get_bytes(rel)
        except Exception as exc:
            raise StorageError(f"cannot read {self.store.join(rel)}: {exc}") from exc

    def _shard(self, entry: ShardEntry) -> _StreamedShard:
        key = "/".join(_safe_parts(entry.path, self.uri))  # in the store
        inline = None
        if entry.inline_block_sha256 is not None:
            try:
                inline = b"".join(bytes.fromhex(block) for block in entry.inline_block_sha256)
            except (TypeError, ValueError) as exc:
                raise ShardFormatError(f"{self.store.join(key)}: manifest.json's block hashes are not hex") from exc
        return _StreamedShard(key, self.store.join(key), entry.tokens, entry.size, entry.block_bytes,
                              max(0, (entry.tokens - 1) // self.seq_len), entry, inline)

    def _digests(self, shard: _StreamedShard) -> bytes:
        """The shard's block digests: inline, or its sidecar (fetched on first use, kept while recent)."""
        if shard.inline_digests is not None:
            return shard.inline_digests
        with self._sidecars_lock:
            digests = self._sidecars.get(shard.key)
            if digests is not None:
                self._sidecars.move_to_end(shard.key)
                return digests
        # fetched outside the lock: two threads may fetch one sidecar at once, never block each other
        digests = check_sidecar(self._object_bytes(shard.entry.sidecar_path), shard.entry, self.uri)
        with self._sidecars_lock:
            self._sidecars[shard.key] = digests
            while len(self._sidecars) > SIDECARS_KEPT:
                self._sidecars.popitem(last=False)
        return digests

    def _check_header(self, shard: _StreamedShard) -> None:
        header = ShardHeader.unpack(self._read(shard, 0, HEADER_BYTES), shard.url)
        if header.token_count != shard.tokens:
            raise ShardFormatError(f"{shard.url}: header says {header.token_count} tokens, manifest {shard.tokens}")
        if header.itemsize != self.dtype.itemsize:
            raise ShardFormatError(f"{shard.url}: {header.itemsize}-byte tokens, the manifest's vocabulary of "
                                   f"{self.vocab_size} makes {self.dtype.itemsize}")
        if header.tokenizer_sha256 != self.tokenizer_sha256:
            raise ShardFormatError(f"{shard.url}: written with another tokenizer than the manifest names")
        shard.header_checked = True

    def _read(self, shard: _StreamedShard, start: int, length: int) -> bytes:
        """Bytes [start, start + length) of the shard's .bin file, block by block."""
        size, digests = shard.block_bytes, self._digests(shard)
        parts = []
        for block in range(start // size, (start + length - 1) // size + 1):
            lo, hi = max(start, block * size), min(start + length, (block + 1) * size)
            digest = block_digest(digests, block)
            parts.append(self.cache.read(digest, lo - block * size, hi - lo,
                                         lambda block=block, digest=digest: self._fetch_block(shard, block, digest)))
        return b"".join(parts)

    def _fetch_block(self, shard: _StreamedShard, block: int, digest: str) -> bytes:
        start = block * shard.block_bytes
        length = min(shard.block_bytes, shard.size - start)
        try:
            data, total = self.store.read_range_sized(shard.key, start, length)  # a short object: total says so
        except ObjectMissing as exc:
            raise ShardFormatError(f"{shard.url}: listed in manifest.json but not in the bucket") from exc
        if total != shard.size:
            raise ShardFormatError(f"{shard.url}: {total} bytes, the manifest's {shard.tokens} tokens make "
                                   f"{shard.size}; the object is truncated or replaced")
        if hashlib.sha256(data).hexdigest() != digest:
            raise ShardFormatError(f"{shard.url}: bytes {start}-{start + length - 1} do not match their recorded "
                                   "block sha256 (corrupt or replaced)")
        return data


def open_sources(uris: list[str], names: list[str], split: str, seq_len: int, *, cache: BlockCache | None,
                 verify_sha256: bool) -> list[ShardSource | StreamingSource]:
    """A source per URI: local paths memory-mapped (ShardSource), s3:// ones streamed through
    `cache` (required when any URI is s3://)."""
    sources: list[ShardSource | StreamingSource] = []
    for uri, name in zip(uris, names, strict=True):
        scheme = scheme_of(uri)
        if scheme == "s3":
            if cache is None:
                raise ConfigError(f"data source {uri}: an s3:// source needs the block cache")
            sources.append(StreamingSource(uri, split, seq_len, cache, name=name))
        elif scheme == "file":
            sources.append(ShardSource(local_path_of(uri), split, seq_len, name=name, verify_sha256=verify_sha256))
        else:
            raise ConfigError(f"data.sources: {uri!r} is neither a local path nor an s3:// URI")
    return sources


_pool: ThreadPoolExecutor | None = None


def read_batch(sampler: Sampler, step: int, rank: int, world_size: int,
               per_rank: int) -> tuple[np.ndarray, list[SampleRef]]:
    """sampler.batch(...), with the sequences of streamed sources read in parallel."""
    global _pool
    if not any(isinstance(s, StreamingSource) for s in sampler.sources):
        return sampler.batch(step, rank, world_size, per_rank)
    if _pool is None:
        _pool = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="lmforge-fetch")
    refs = sampler.batch_refs(step, rank, world_size, per_rank)
    rows = _pool.map(lambda ref: ref.read(sampler.sources), refs)
    return np.stack(list(rows)), refs


def _safe_parts(path: str, uri: str) -> list[str]:
    parts = [p for p in path.split("/") if p]
    if any(p in {".", ".."} for p in parts):
        raise ConfigError(f"data source {uri}: '.' and '..' are not allowed in paths")
    return parts

