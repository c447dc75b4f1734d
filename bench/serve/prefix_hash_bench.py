#!/usr/bin/env python3
"""The cost of a prefix-cache key per block: the engine's SHA-256 chain
(`BlockManager.chain_hashes`) against the Python hash() of (previous, token tuple) it replaced,
and BLAKE2b-256 over the same packed bytes for comparison. Microseconds per block, the best of
`--repeats` runs over a `--tokens`-token prompt in blocks of `--block-size`.

    python bench/serve/prefix_hash_bench.py [--tokens 4096] [--block-size 16] [--repeats 20]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import time
from array import array

from lmforge.inference.block_manager import BlockManager


def builtin_hash_chain(hashes: list, tokens: list[int], size: int) -> None:
    """The keys before: Python's hash() of (previous key, the block's token tuple)."""
    for start in range(0, len(tokens) - size + 1, size):
        previous = hashes[-1] if hashes else None
        hashes.append(hash((previous, tuple(tokens[start:start + size]))))


def blake2b_chain(hashes: list, tokens: list[int], size: int) -> None:
    packed = array("q", tokens[:len(tokens) - len(tokens) % size]).tobytes()
    step = size * 8
    previous = hashes[-1] if hashes else bytes(32)
    for start in range(0, len(packed), step):
        previous = hashlib.blake2b(previous + packed[start:start + step], digest_size=32).digest()
        hashes.append(previous)


def best_microseconds_per_block(chain, tokens: list[int], blocks: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        keys: list = []
        started = time.perf_counter()
        chain(keys, tokens)
        best = min(best, time.perf_counter() - started)
        assert len(keys) == blocks
    return best / blocks * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    tokens = [random.Random(0).randrange(50_000) for _ in range(args.tokens)]
    blocks = args.tokens // args.block_size
    manager = BlockManager(1, args.block_size, salt=b"bench")
    size = args.block_size
    for name, chain in (("builtin hash() (before)", lambda keys, t: builtin_hash_chain(keys, t, size)),
                        ("sha256 (BlockManager.chain_hashes)", manager.chain_hashes),
                        ("blake2b-256", lambda keys, t: blake2b_chain(keys, t, size))):
        micros = best_microseconds_per_block(chain, tokens, blocks, args.repeats)
        print(f"{name:36s} {micros:6.2f} µs per {size}-token block")


if __name__ == "__main__":
    main()
