"""Training data over data-prep shards: which sequences a rank reads at a step is a pure
function of (seed, step, rank), so a restarted run reproduces its batches exactly.

- A `ShardSource` is one data-prep output's split: its shards are checked against
  manifest.json (header, size, tokenizer hash, sha256) and memory-mapped.
- Sequence i of a shard is tokens[i·L : i·L + L + 1] (inputs and shifted targets).
- Global sample q (q = step·global_batch + rank·per_rank + j, the same whatever the world
  size) picks its source by a hash of (seed, q) against the mixture weights, then its
  sequence as perm(q mod n) of that source, where perm is a keyed bijection of [0, n)
  that changes every epoch (q // n). One source with weight 1 is a plain shuffled epoch
  loop; a small source in a mixture simply cycles through its epochs faster.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmforge.common.errors import ConfigError, InputError, ShardFormatError
from lmforge.common.shards import open_shard
from lmforge.common.storage import sha256_file


def _hash64(*parts: int | str) -> int:
    data = ":".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class KeyedPermutation:
    """A bijection of [0, n) from a 4-round Feistel network over the next power of four,
    with cycle walking: O(1) memory whatever n, different for every key."""

    ROUNDS = 4

    def __init__(self, n: int, key: int):
        if n < 1:
            raise ValueError("a permutation needs n ≥ 1")
        self.n = n
        self.half_bits = max(1, ((n - 1).bit_length() + 1) // 2)
        self.mask = (1 << self.half_bits) - 1
        self.keys = [_hash64(key, r) for r in range(self.ROUNDS)]

    def _round(self, value: int, round_key: int) -> int:
        return _hash64(round_key, value) & self.mask

    def _encrypt(self, x: int) -> int:
        left, right = x >> self.half_bits, x & self.mask
        for round_key in self.keys:
            left, right = right, left ^ self._round(right, round_key)
        return (left << self.half_bits) | right

    def __call__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        x = self._encrypt(i)
        while x >= self.n:  # cycle walking stays within [0, n)
            x = self._encrypt(x)
        return x


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


class ShardSource:
    """One data-prep output's split, validated against its manifest."""

    def __init__(self, root: str | Path, split: str, seq_len: int, *, verify_sha256: bool = True, name: str = ""):
        self.root = Path(root)
        self.name = name or self.root.name
        self.seq_len = seq_len
        manifest_path = self.root / "manifest.json"
        try:
            self.manifest = json.loads(manifest_path.read_text())
        except FileNotFoundError as exc:
            missing = "no manifest.json (not a data-prep output)" if self.root.is_dir() else "no such directory"
            raise InputError(f"data source {self.root}: {missing}") from exc
        except json.JSONDecodeError as exc:
            raise ShardFormatError(f"{manifest_path}: not valid JSON ({exc})") from exc
        self.tokenizer_sha256 = self.manifest["tokenizer"]["sha256"]
        self.vocab_size = self.manifest["tokenizer"]["vocab_size"]
        entries = [s for s in self.manifest["shards"] if s["split"] == split]
        if not entries:
            raise ConfigError(f"data source {self.root}: no {split!r} shards in manifest.json")
        self.shards = [self._open(entry, verify_sha256) for entry in entries]
        self.shards = [s for s in self.shards if s.sequences > 0]
        if not self.shards:
            raise ConfigError(f"data source {self.root}: {split} shards are shorter than one sequence of {seq_len}")
        self._ends = np.cumsum([s.sequences for s in self.shards])

    def _open(self, entry: dict, verify_sha256: bool) -> _Shard:
        path = self.root / entry["path"]
        if not path.exists():
            raise ShardFormatError(f"{path}: listed in manifest.json but missing")
        header, tokens = open_shard(path)  # checks magic, version and size against the header
        if header.token_count != entry["tokens"]:
            raise ShardFormatError(f"{path}: header says {header.token_count} tokens, manifest {entry['tokens']}")
        if header.tokenizer_sha256 != self.tokenizer_sha256:
            raise ShardFormatError(f"{path}: written with another tokenizer than the manifest names")
        if verify_sha256 and sha256_file(path) != entry["sha256"]:
            raise ShardFormatError(f"{path}: sha256 does not match manifest.json (corrupt or replaced)")
        return _Shard(path, tokens, max(0, (len(tokens) - 1) // self.seq_len))

    @property
    def num_sequences(self) -> int:
        return int(self._ends[-1])

    def sequence(self, index: int) -> np.ndarray:
        """seq_len + 1 tokens: inputs and (shifted by one) targets."""
        shard_index, start_in_shard = locate_sequence(self._ends, index)
        start = start_in_shard * self.seq_len
        return np.asarray(self.shards[shard_index].tokens[start : start + self.seq_len + 1], dtype=np.int64)


@dataclass(frozen=True)
class SampleRef:
    source: int
    sequence: int
    epoch: int


class MixtureSampler:
    """Deterministic sampling of sequences from weighted sources (see module docstring)."""

    def __init__(self, sources: list[ShardSource], weights: list[float], seed: int):
        if len(sources) != len(weights) or not sources:
            raise ConfigError("data: give one weight per source")
        if any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ConfigError("data: mixture weights must be non-negative and not all zero")
        tokenizers = {s.tokenizer_sha256 for s in sources}
        if len(tokenizers) > 1:
            raise ConfigError("data: mixture sources were tokenized with different tokenizers")
        self.sources = sources
        self.seed = seed
        total = float(sum(weights))
        self.weights = [w / total for w in weights]
        self._cumulative = np.cumsum(self.weights)
        self._perms: dict[tuple[int, int], KeyedPermutation] = {}

    def _permutation(self, source: int, epoch: int) -> KeyedPermutation:
        key = (source, epoch)
        permutation = self._perms.get(key)
        if permutation is None:  # (the prefetcher's loader threads call this at once: no lookup after a clear)
            if len(self._perms) > 64:
                self._perms.clear()
            permutation = KeyedPermutation(self.sources[source].num_sequences, _hash64(self.seed, source, epoch))
            self._perms[key] = permutation
        return permutation

    def sample(self, q: int) -> SampleRef:
        if len(self.sources) == 1:
            source = 0
        else:
            u = _hash64(self.seed, "mix", q) / 2**64
            source = min(int(np.searchsorted(self._cumulative, u, side="right")), len(self.sources) - 1)
        n = self.sources[source].num_sequences
        epoch, offset = divmod(q, n)
        return SampleRef(source, self._permutation(source, epoch)(offset), epoch)

    def batch_refs(self, step: int, rank: int, world_size: int, per_rank: int) -> list[SampleRef]:
        first = (step * world_size + rank) * per_rank
        return [self.sample(q) for q in range(first, first + per_rank)]

    def batch(self, step: int, rank: int, world_size: int, per_rank: int) -> tuple[np.ndarray, list[SampleRef]]:
        """(per_rank, seq_len + 1) int64 tokens for this rank at this step, and what they are."""
        refs = self.batch_refs(step, rank, world_size, per_rank)
        tokens = np.stack([self.sources[r.source].sequence(r.sequence) for r in refs])
        return tokens, refs
