"""The token shard format shared by data-prep (writer) and the trainer (reader).

A shard `NAME.bin` is a 1024-byte header followed by little-endian tokens:

    offset  size  field
    0       8     magic  b"LMFSHARD"
    8       4     format version (uint32) = 1
    12      4     bytes per token (uint32): 2 (uint16) or 4 (uint32)
    16      8     token count (uint64)
    24      8     document count (uint64)
    32      4     end-of-text token id (uint32)
    36      4     vocabulary size (uint32)
    40      32    sha256 of the tokenizer.json that produced the tokens
    72      ...   zero padding to 1024

Documents are separated by the end-of-text token (each document is followed by one).
`NAME.idx` holds the uint64 token offsets at which each document ends (exclusive), so
readers can find document boundaries without scanning.

`NAME.blocks` (the block sidecar) holds the 32-byte sha256 of each BLOCK_BYTES block of the .bin
file, in order (from byte 0; the last block may be short), so a reader that fetches byte ranges
from an object store can verify every block it fetches without downloading the whole shard. The
split index (lmforge.common.shard_index) records the sidecar's own sha256 beside the shard's.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from lmforge.common.atomic_files import atomic_open
from lmforge.common.errors import ShardFormatError

MAGIC = b"LMFSHARD"
FORMAT_VERSION = 1
HEADER_BYTES = 1024
_HEADER = struct.Struct("<8sIIQQII32s")
BLOCK_BYTES = 4 << 20


@dataclass(frozen=True)
class ShardDigest:
    """sha256 of a shard's .bin file, whole and per block of `block_bytes`."""

    sha256: str
    block_bytes: int
    block_sha256: tuple[str, ...]

    def sidecar(self) -> bytes:
        """The block sidecar's content: each block's 32-byte digest, in order."""
        return b"".join(bytes.fromhex(block) for block in self.block_sha256)

    def index_fields(self) -> dict:
        """What the split index records of the shard's content (shard_index.ShardEntry fields)."""
        return {"sha256": self.sha256, "block_bytes": self.block_bytes,
                "blocks_sha256": hashlib.sha256(self.sidecar()).hexdigest()}


class _BlockHasher:
    def __init__(self, block_bytes: int):
        self.block_bytes = block_bytes
        self.whole = hashlib.sha256()
        self.blocks: list[str] = []
        self._block = hashlib.sha256()
        self._in_block = 0

    def update(self, data: bytes) -> None:
        self.whole.update(data)
        view = memoryview(data)
        while len(view):
            take = min(len(view), self.block_bytes - self._in_block)
            self._block.update(view[:take])
            self._in_block += take
            view = view[take:]
            if self._in_block == self.block_bytes:
                self.blocks.append(self._block.hexdigest())
                self._block, self._in_block = hashlib.sha256(), 0

    def digest(self) -> ShardDigest:
        blocks = self.blocks + ([self._block.hexdigest()] if self._in_block else [])
        return ShardDigest(self.whole.hexdigest(), self.block_bytes, tuple(blocks))


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every token id fits, else uint32."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


@dataclass(frozen=True)
class ShardHeader:
    itemsize: int
    token_count: int
    doc_count: int
    eot_id: int
    vocab_size: int
    tokenizer_sha256: str
    version: int = FORMAT_VERSION

    @property
    def dtype(self) -> np.dtype:
        return np.dtype("<u2") if self.itemsize == 2 else np.dtype("<u4")

    def pack(self) -> bytes:
        raw = _HEADER.pack(
            MAGIC,
            self.version,
            self.itemsize,
            self.token_count,
            self.doc_count,
            self.eot_id,
            self.vocab_size,
            bytes.fromhex(self.tokenizer_sha256),
        )
        return raw + b"\0" * (HEADER_BYTES - len(raw))

    @classmethod
    def unpack(cls, raw: bytes, source: str = "<shard>") -> ShardHeader:
        if len(raw) < HEADER_BYTES:
            raise ShardFormatError(f"{source}: file too short for a shard header ({len(raw)} bytes)")
        magic, version, itemsize, tokens, docs, eot, vocab, tok_sha = _HEADER.unpack_from(raw)
        if magic != MAGIC:
            raise ShardFormatError(f"{source}: not an lmforge shard (magic {magic!r})")
        if version != FORMAT_VERSION:
            raise ShardFormatError(f"{source}: unsupported shard format version {version}")
        if itemsize not in (2, 4):
            raise ShardFormatError(f"{source}: invalid token size {itemsize}")
        return cls(itemsize, tokens, docs, eot, vocab, tok_sha.hex(), version)


def write_shard(
    path: str | Path,
    tokens: np.ndarray,
    doc_ends: np.ndarray,
    *,
    eot_id: int,
    vocab_size: int,
    tokenizer_sha256: str,
    block_bytes: int = BLOCK_BYTES,
) -> ShardDigest:
    """Atomically write `path` (+ `.idx` and the `.blocks` sidecar); return the sha256 of the .bin
    file, whole and per block."""
    dtype = token_dtype(vocab_size)
    tokens = np.ascontiguousarray(tokens, dtype=dtype)
    doc_ends = np.ascontiguousarray(doc_ends, dtype="<u8")
    if len(doc_ends) and int(doc_ends[-1]) != len(tokens):
        raise ValueError("the last document end must equal the token count")
    header = ShardHeader(dtype.itemsize, len(tokens), len(doc_ends), eot_id, vocab_size, tokenizer_sha256)
    digest = _BlockHasher(block_bytes)
    path = Path(path)
    with atomic_open(path) as fh:
        for chunk in (header.pack(), tokens.tobytes()):
            digest.update(chunk)
            fh.write(chunk)
    with atomic_open(index_path(path)) as fh:
        fh.write(doc_ends.tobytes())
    result = digest.digest()
    with atomic_open(blocks_path(path)) as fh:
        fh.write(result.sidecar())
    return result


def index_path(path: str | Path) -> Path:
    return Path(path).with_suffix(".idx")


def blocks_path(path: str | Path) -> Path:
    """The block sidecar of shard `path`."""
    return Path(path).with_suffix(".blocks")


def read_header(fh: BinaryIO, source: str) -> ShardHeader:
    return ShardHeader.unpack(fh.read(HEADER_BYTES), source)


def open_shard(path: str | Path) -> tuple[ShardHeader, np.memmap]:
    """Validate the header and size, return (header, memory-mapped tokens)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            header = read_header(fh, str(path))
    except OSError as exc:
        raise ShardFormatError(f"{path}: cannot read shard: {exc}") from exc
    expected = HEADER_BYTES + header.token_count * header.itemsize
    if size != expected:
        raise ShardFormatError(
            f"{path}: size {size} bytes does not match the header "
            f"({header.token_count} tokens x {header.itemsize} B + {HEADER_BYTES} B header = {expected});"
            " the file is truncated or corrupt"
        )
    tokens = np.memmap(path, dtype=header.dtype, mode="r", offset=HEADER_BYTES, shape=(header.token_count,))
    return header, tokens


def read_doc_ends(path: str | Path) -> np.ndarray:
    return np.fromfile(index_path(path), dtype="<u8")
