"""Training data over data-prep shards, as sources of numbered sequences; which of them a rank
reads at a step is the sampler's choice (sampling.py), a pure function of (seed, step, rank).

- A `ShardSource` is one data-prep output's split: its shards, listed by the split's index
  (lmforge.common.shard_index; the other split's index is never read), are checked against it
  (header, size, tokenizer hash, sha256) and memory-mapped.
- Sequence i of a shard is tokens[i·L : i·L + L + 1] (inputs and shifted targets); a source's
  sequences are numbered shard after shard (`sequence_ends`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmforge.common.errors import ConfigError, InputError, ShardFormatError
from lmforge.common.shard_index import MANIFEST, ShardEntry, parse_manifest, read_split_index
from lmforge.common.shards import open_shard
from lmforge.common.storage import sha256_file


def locate_sequence(ends: np.ndarray, index: int) -> tuple[int, int]:
    """(shard, sequence within it) of a source's sequence `index`; `ends`: the cumulative
    sequence counts of its shards."""
    shard_index = int(np.searchsorted(ends, index, side="right"))
    return shard_index, index - (int(ends[shard_index - 1]) if shard_index else 0)


@dataclass
class _Shard:
    path: Path
    tokens: np.ndarray  # memory-mapped
    sequences: int


class SequenceCounts:
    """What a sampler reads of a source, local or streamed: its sequences per shard, cumulative."""

    _ends: np.ndarray

    @property
    def num_sequences(self) -> int:
        return int(self._ends[-1])

    @property
    def sequence_ends(self) -> np.ndarray:
        """Cumulative sequences per shard: shard k holds sequences [ends[k-1], ends[k])."""
        return self._ends


class ShardSource(SequenceCounts):
    """One data-prep output's split, validated against its manifest."""

    def __init__(self, root: str | Path, split: str, seq_len: int, *, verify_sha256: bool = True, name: str = ""):
        self.root = Path(root)
        self.name = name or self.root.name
        self.seq_len = seq_len
        manifest_path = self.root / MANIFEST
        try:
            raw = manifest_path.read_bytes()
        except FileNotFoundError as exc:
            missing = "no manifest.json (not a data-prep output)" if self.root.is_dir() else "no such directory"
            raise InputError(f"data source {self.root}: {missing}") from exc
        self.manifest = parse_manifest(raw, str(manifest_path))
        self.tokenizer_sha256 = self.manifest["tokenizer"]["sha256"]
        self.vocab_size = self.manifest["tokenizer"]["vocab_size"]
        self.eot_id = self.manifest["tokenizer"].get("eot_id")
        entries = read_split_index(self.manifest, split, self._read_file, str(self.root))
        if not entries:
            raise ConfigError(f"data source {self.root}: no {split!r} shards in manifest.json")
        self.shards = [self._open(entry, verify_sha256) for entry in entries]
        self.shards = [s for s in self.shards if s.sequences > 0]
        if not self.shards:
            raise ConfigError(f"data source {self.root}: {split} shards are shorter than one sequence of {seq_len}")
        self._ends = np.cumsum([s.sequences for s in self.shards])
        self.block_bytes = max(e.block_bytes for e in entries)  # the split's storage block (sampling.py)

    def _read_file(self, rel: str) -> bytes | None:
        try:
            return (self.root / rel).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ShardFormatError(f"{self.root / rel}: cannot read ({exc})") from exc

    def _open(self, entry: ShardEntry, verify_sha256: bool) -> _Shard:
        path = self.root / entry.path
        if not path.exists():
            raise ShardFormatError(f"{path}: listed in manifest.json but missing")
        header, tokens = open_shard(path)  # checks magic, version and size against the header
        if header.token_count != entry.tokens:
            raise ShardFormatError(f"{path}: header says {header.token_count} tokens, manifest {entry.tokens}")
        if header.tokenizer_sha256 != self.tokenizer_sha256:
            raise ShardFormatError(f"{path}: written with another tokenizer than the manifest names")
        if verify_sha256 and sha256_file(path) != entry.sha256:
            raise ShardFormatError(f"{path}: sha256 does not match manifest.json (corrupt or replaced)")
        return _Shard(path, tokens, max(0, (len(tokens) - 1) // self.seq_len))

    @property
    def token_bytes(self) -> int:
        return self.shards[0].tokens.dtype.itemsize

    def sequence(self, index: int, offset: int = 0, length: int = 0) -> np.ndarray:
        """seq_len + 1 tokens: inputs and (shifted by one) targets; with `length`, length + 1 tokens of it
        from `offset` on (a shorter stage's piece of the sequence, lmforge.trainer.schedule)."""
        shard_index, start_in_shard = locate_sequence(self._ends, index)
        start = start_in_shard * self.seq_len + offset
        return np.asarray(self.shards[shard_index].tokens[start : start + (length or self.seq_len) + 1],
                          dtype=np.int64)


@dataclass(frozen=True)
class SampleRef:
    """Sequence `sequence` of source `source` (drawn in its epoch `epoch`); with `length`, the piece of
    length + 1 tokens of it from `offset` on."""

    source: int
    sequence: int
    epoch: int
    offset: int = 0
    length: int = 0

    def read(self, sources) -> np.ndarray:
        return sources[self.source].sequence(self.sequence, self.offset, self.length)
