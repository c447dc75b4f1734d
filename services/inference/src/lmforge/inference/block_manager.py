"""The paged KV cache's bookkeeping (no tensors): which blocks are free, which a sequence
holds, and the prefix cache (vLLM's automatic prefix caching).

A full block is identified by a key chained from its predecessor's: the SHA-256 of the
predecessor's key (for the first block, a digest of the salt: the model's identity) and the
block's token ids, so equal keys mean equal prefixes up to and including that block, of the same
model. Once a full block's keys and values are computed it is registered under its key; a later
sequence whose prompt starts with the same blocks takes them instead of prefilling them again (a
block may be shared by many sequences: reference counts). A block nobody holds stays cached and
counts as free: it is reused in least-recently-freed order only when no never-cached block is left.

The key is a cryptographic digest, not Python's hash(): hash() of a tuple of ints is easy to
collide (hash(0) == hash(2**61 - 1), and 64 bits can be searched), and a tenant whose prompt
collided with another's would be served the other's keys and values (vLLM's CVE-2025-25183).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque

TOKEN_BYTES = array("q").itemsize  # token ids packed as 64-bit integers: a fixed width, unambiguous


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True, salt: bytes = b""):
        self.num_blocks, self.block_size, self.prefix_caching = num_blocks, block_size, prefix_caching
        self.root = hashlib.sha256(b"lmforge-prefix-cache-v1\0" + salt).digest()  # the first block's parent
        self._refs = [0] * num_blocks
        self._hash_of: list[bytes | None] = [None] * num_blocks
        self._fresh: deque[int] = deque(range(num_blocks))  # free, holding nothing cached
        self._evictable: OrderedDict[int, None] = OrderedDict()  # free but cached, least recently freed first
        self._cached: dict[bytes, int] = {}  # block key → block

    @property
    def num_free(self) -> int:
        return len(self._fresh) + len(self._evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def chain_hashes(self, hashes: list[bytes], tokens: list[int]) -> None:
        """Extend `hashes` (a sequence's full-block keys so far) over the full blocks of `tokens`,
        the sequence's tokens from the first block not yet hashed."""
        packed = array("q", tokens[:len(tokens) - len(tokens) % self.block_size]).tobytes()
        step = self.block_size * TOKEN_BYTES
        previous = hashes[-1] if hashes else self.root
        for start in range(0, len(packed), step):
            previous = hashlib.sha256(previous + packed[start:start + step]).digest()
            hashes.append(previous)

    def cached_prefix(self, hashes: list[bytes], max_blocks: int) -> list[int]:
        """The cached blocks holding the longest prefix of these full-block hashes (at most max_blocks)."""
        if not self.prefix_caching:
            return []
        blocks = []
        for block_hash in hashes[:max_blocks]:
            block = self._cached.get(block_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def free_after_taking(self, blocks: list[int]) -> int:
        """Free blocks left once these cached blocks are taken (those nobody held were free)."""
        return self.num_free - sum(1 for block in blocks if self._refs[block] == 0)

    def take(self, blocks: list[int]) -> None:
        """Hold cached blocks (prefix-cache hits)."""
        for block in blocks:
            if self._refs[block] == 0:
                del self._evictable[block]
            self._refs[block] += 1

    def allocate(self, count: int) -> list[int]:
        """`count` blocks for new tokens: never-cached ones first, then the least recently freed cached ones."""
        if count > self.num_free:
            raise RuntimeError(f"{count} KV blocks wanted, {self.num_free} free")
        blocks = []
        for _ in range(count):
            if self._fresh:
                block = self._fresh.popleft()
            else:
                block, _ = self._evictable.popitem(last=False)
                del self._cached[self._hash_of[block]]
                self._hash_of[block] = None
            self._refs[block] = 1
            blocks.append(block)
        return blocks

    def release(self, blocks: list[int]) -> None:
        """Let go of a sequence's blocks. Its last blocks are freed first, so that, evicted in that
        order, a cached prefix's first blocks (the most shared) are kept the longest."""
        for block in reversed(blocks):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if self._hash_of[block] is None:
                    self._fresh.append(block)
                else:
                    self._evictable[block] = None

    def register(self, block: int, block_hash: bytes) -> None:
        """A full block's keys and values are computed: cache it under its prefix hash (unless the
        same prefix is already cached in another block, computed at the same time)."""
        if self.prefix_caching and self._hash_of[block] is None and block_hash not in self._cached:
            self._cached[block_hash] = block
            self._hash_of[block] = block_hash
