"""manifest.json and the per-split shard indexes of a data-prep output: the one way to read, and
to write, which shards a split has.

manifest.json (version 2) holds only what stays small whatever the corpus: `format`, `version`,
`dtype`, the `tokenizer`, `totals`, the resolved `config`, and per split (`splits`) its shard
count, tokens, documents and where its index is, with the index's size and sha256. A reader of
one split reads manifest.json and that split's index, nothing else.

A split index (`index/SPLIT.index`) is a 64-byte header, then one 160-byte record per shard in
the split's order (little-endian):

    header  0  8   magic b"LMFINDEX"
            8  4   index format version (uint32) = 1
            12 4   bytes per record (uint32) = 160
            16 8   records (uint64)
            24 16  split name (UTF-8, NUL-padded); zero padding to 64
    record  0  64  shard path relative to the output root (UTF-8, NUL-padded)
            64 8   tokens          72 8  documents
            80 8   bytes of .bin   88 8  block_bytes
            96 32  sha256 of the .bin
            128 32 sha256 of its block sidecar (`NAME.blocks`, lmforge.common.shards)

Block hashes live in each shard's sidecar, not in the index, so the chain manifest → index →
sidecar → block verifies every byte a streaming reader fetches while each link stays small.

Guarantees: `read_split_index` gives a split's shards for a manifest of this version or of the
previous one (version 1, or unversioned, listing every shard under "shards", block hashes inline
or absent), so older data sets stay readable; an index or a sidecar that is missing, truncated,
corrupt or not the one the manifest names is a one-line ShardFormatError; a manifest of a newer
version is refused in one line.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmforge.common.errors import ShardFormatError
from lmforge.common.shards import HEADER_BYTES, token_dtype

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "lmforge-shards"
MANIFEST_VERSION = 2
INDEX_MAGIC = b"LMFINDEX"
INDEX_VERSION = 1
INDEX_HEADER_BYTES = 64
_INDEX_HEADER = struct.Struct("<8sIIQ16s")
DIGEST_BYTES = 32
RECORD = np.dtype([("path", "S64"), ("tokens", "<u8"), ("documents", "<u8"), ("bytes", "<u8"),
                   ("block_bytes", "<u8"), ("sha256", "u1", (DIGEST_BYTES,)), ("blocks_sha256", "u1", (DIGEST_BYTES,))])

Reader = Callable[[str], "bytes | None"]  # a file of the output by relative path; None: no such file


@dataclass(frozen=True, slots=True)
class ShardEntry:
    """One shard of a split, as the index (or a version-1 manifest) lists it."""

    path: str  # relative to the output root
    tokens: int
    documents: int
    size: int  # bytes of the .bin: header + tokens
    sha256: str
    block_bytes: int
    blocks_sha256: str | None = None  # the sidecar's sha256; None for a version-1 manifest's entry
    inline_block_sha256: tuple[str, ...] | None = None  # version 1 listed the block hashes itself

    @property
    def blocks(self) -> int:
        return -(-self.size // self.block_bytes)

    @property
    def sidecar_path(self) -> str:
        return self.path.removesuffix(".bin") + ".blocks"


def split_index_path(split: str) -> str:
    return f"index/{split}.index"


# ---------------------------------------------------------------- reading


def parse_manifest(raw: bytes, where: str) -> dict:
    """manifest.json's content, checked to hold what readers use; `where` names it in errors."""
    try:
        manifest = json.loads(raw)
        _ = manifest["tokenizer"]["sha256"], int(manifest["tokenizer"]["vocab_size"])
        version = manifest.get("version", 1)
        if version == MANIFEST_VERSION:
            for split, info in manifest["splits"].items():
                _ = split.encode(), info["index"].encode(), int(info["index_bytes"]), int(info["shards"])
                _ = info["index_sha256"].encode()
        elif version == 1:
            _ = [entry["split"] for entry in manifest["shards"]]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ShardFormatError(f"{where}: not a data-prep manifest ({exc!r})") from exc
    if version not in (1, MANIFEST_VERSION):
        raise ShardFormatError(f"{where}: manifest version {version!r}; this lmforge reads versions 1 and "
                               f"{MANIFEST_VERSION} (a newer data prep wrote it?)")
    return manifest


def split_totals(manifest: dict) -> dict[str, dict[str, int]]:
    """{split: {"shards", "tokens"}} from the manifest alone (no index read)."""
    if "splits" in manifest:
        return {split: {"shards": int(info["shards"]), "tokens": int(info.get("tokens", 0))}
                for split, info in manifest["splits"].items()}
    totals: dict[str, dict[str, int]] = {}
    for entry in manifest["shards"]:
        split = totals.setdefault(entry["split"], {"shards": 0, "tokens": 0})
        split["shards"] += 1
        split["tokens"] += int(entry.get("tokens", 0))
    return totals


def read_split_index(manifest: dict, split: str, read: Reader, where: str) -> list[ShardEntry]:
    """The shards of `split` in order ([] when the output has none). `manifest` is parse_manifest's;
    `read` is called for that split's index alone; `where` (the output's path or URI) names files in
    errors."""
    itemsize = token_dtype(int(manifest["tokenizer"]["vocab_size"])).itemsize
    if "splits" not in manifest:
        return [_legacy_entry(entry, itemsize, where) for entry in manifest["shards"] if entry["split"] == split]
    info = manifest["splits"].get(split)
    if info is None:
        return []
    rel = info["index"]
    raw = read(rel)
    if raw is None:
        raise ShardFormatError(f"{where}/{rel}: listed in manifest.json but missing")
    if len(raw) != int(info["index_bytes"]) or hashlib.sha256(raw).hexdigest() != info["index_sha256"]:
        raise ShardFormatError(f"{where}/{rel}: {len(raw)} bytes whose sha256 is not the one manifest.json "
                               f"records for its {info['index_bytes']} (truncated, corrupt or replaced)")
    entries = decode_split_index(raw, split, f"{where}/{rel}")
    if len(entries) != int(info["shards"]):
        raise ShardFormatError(f"{where}/{rel}: {len(entries)} shards, manifest.json says {info['shards']}")
    for entry in entries:
        if entry.size != HEADER_BYTES + entry.tokens * itemsize or entry.block_bytes < 1:
            raise ShardFormatError(f"{where}/{rel}: {entry.path} is listed as {entry.size} bytes in blocks of "
                                   f"{entry.block_bytes} for {entry.tokens} tokens of {itemsize} bytes")
    return entries


def decode_split_index(raw: bytes, split: str, where: str) -> list[ShardEntry]:
    """The records of a split index file (its header checked against `split`)."""
    if len(raw) < INDEX_HEADER_BYTES:
        raise ShardFormatError(f"{where}: {len(raw)} bytes, too short for a split index header")
    magic, version, record_bytes, count, name = _INDEX_HEADER.unpack_from(raw)
    if magic != INDEX_MAGIC:
        raise ShardFormatError(f"{where}: not an lmforge split index (magic {magic!r})")
    if version != INDEX_VERSION or record_bytes != RECORD.itemsize:
        raise ShardFormatError(f"{where}: split index version {version} with {record_bytes}-byte records; this "
                               f"lmforge reads version {INDEX_VERSION} ({RECORD.itemsize}-byte records)")
    named = name.rstrip(b"\0")
    if named != split.encode():
        raise ShardFormatError(f"{where}: the index of split {named!r}, not {split!r}")
    expected = INDEX_HEADER_BYTES + count * RECORD.itemsize
    if len(raw) != expected:
        raise ShardFormatError(f"{where}: {len(raw)} bytes, its header's {count} records make {expected}; "
                               "the file is truncated or corrupt")
    records = np.frombuffer(raw, RECORD, count=count, offset=INDEX_HEADER_BYTES)
    try:
        paths = [path.decode("utf-8") for path in records["path"].tolist()]
    except UnicodeDecodeError as exc:
        raise ShardFormatError(f"{where}: a shard path is not UTF-8 ({exc})") from exc
    hexes = 2 * DIGEST_BYTES
    sha256, blocks_sha256 = records["sha256"].tobytes().hex(), records["blocks_sha256"].tobytes().hex()
    columns = zip(paths, records["tokens"].tolist(), records["documents"].tolist(), records["bytes"].tolist(),
                  records["block_bytes"].tolist(), strict=True)
    return [ShardEntry(path, tokens, documents, size, sha256[i * hexes : (i + 1) * hexes], block_bytes,
                       blocks_sha256[i * hexes : (i + 1) * hexes])
            for i, (path, tokens, documents, size, block_bytes) in enumerate(columns)]


def check_sidecar(raw: bytes | None, entry: ShardEntry, where: str) -> bytes:
    """A shard's block sidecar as fetched, checked against its index entry: its 32-byte block
    digests, in block order (block_digest reads one)."""
    if raw is None:
        raise ShardFormatError(f"{where}/{entry.sidecar_path}: listed in the split index but missing")
    if len(raw) != entry.blocks * DIGEST_BYTES or hashlib.sha256(raw).hexdigest() != entry.blocks_sha256:
        raise ShardFormatError(f"{where}/{entry.sidecar_path}: {len(raw)} bytes that are not the {entry.blocks} "
                               "block digests the split index records (truncated, corrupt or replaced)")
    return raw


def block_digest(digests: bytes, block: int) -> str:
    """The hex sha256 of block `block` from a sidecar's digests."""
    return digests[block * DIGEST_BYTES : (block + 1) * DIGEST_BYTES].hex()


def _legacy_entry(raw: dict, itemsize: int, where: str) -> ShardEntry:
    """A version-1 manifest's shard: block hashes inline, or none (the whole shard one block)."""
    try:
        path, tokens, sha256 = raw["path"], int(raw["tokens"]), raw["sha256"]
        size = HEADER_BYTES + tokens * itemsize
        if raw.get("block_sha256") is not None:
            block_bytes, blocks = int(raw["block_bytes"]), tuple(raw["block_sha256"])
        else:
            block_bytes, blocks = size, (sha256,)
    except (KeyError, TypeError, ValueError) as exc:
        raise ShardFormatError(f"{where}/manifest.json: a shard entry lacks {exc!r}") from exc
    if block_bytes < 1 or len(blocks) != -(-size // block_bytes):
        raise ShardFormatError(f"{where}/{path}: manifest.json lists {len(blocks)} block hashes of {block_bytes} "
                               f"bytes for a {size}-byte shard")
    return ShardEntry(path, tokens, int(raw.get("documents", 0)), size, sha256, block_bytes, None, blocks)


# ---------------------------------------------------------------- writing


def encode_split_index(split: str, entries: Iterable[ShardEntry]) -> bytes:
    entries = list(entries)
    records = np.zeros(len(entries), RECORD)
    for record, entry in zip(records, entries, strict=True):
        path = entry.path.encode("utf-8")
        if len(path) > RECORD["path"].itemsize or entry.blocks_sha256 is None:
            raise ValueError(f"cannot index {entry.path!r}: paths take at most {RECORD['path'].itemsize} bytes and "
                             "every shard needs its block sidecar's sha256")
        record["path"] = path
        record["tokens"], record["documents"], record["bytes"] = entry.tokens, entry.documents, entry.size
        record["block_bytes"] = entry.block_bytes
        record["sha256"] = np.frombuffer(bytes.fromhex(entry.sha256), np.uint8)
        record["blocks_sha256"] = np.frombuffer(bytes.fromhex(entry.blocks_sha256), np.uint8)
    header = _INDEX_HEADER.pack(INDEX_MAGIC, INDEX_VERSION, RECORD.itemsize, len(entries), split.encode("utf-8"))
    return header.ljust(INDEX_HEADER_BYTES, b"\0") + records.tobytes()


def write_split_index(write: Callable[[str, bytes], Any], split: str, entries: list[ShardEntry]) -> dict:
    """Write `split`'s index with `write(rel, data)`; return the manifest's entry for the split."""
    raw = encode_split_index(split, entries)
    rel = split_index_path(split)
    write(rel, raw)
    return {"shards": len(entries), "tokens": sum(e.tokens for e in entries),
            "documents": sum(e.documents for e in entries),
            "index": rel, "index_bytes": len(raw), "index_sha256": hashlib.sha256(raw).hexdigest()}


def new_manifest(tokenizer: dict, splits: dict[str, dict], **fields) -> dict:
    """A version-2 manifest over `splits` (write_split_index's entries), with `fields` added."""
    return {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION,
            "dtype": token_dtype(int(tokenizer["vocab_size"])).name, "tokenizer": tokenizer, "splits": splits,
            **fields}
