"""The synthetic data-prep output the trainer's tests and benchmarks stream: its manifest and split
indexes list each shard's sha256, and each shard's block sidecar the sha256 of its blocks, as data
prep's do, so a streaming reader verifies it."""

from __future__ import annotations

import hashlib
import json

from lmforge.common.shard_index import read_split_index
from lmforge.common.shards import BLOCK_BYTES
from lmforge.sample_data.token_shards import synthetic_output


def test_index_lists_each_shards_hash_and_its_sidecar_the_block_hashes(tmp_path):
    root = synthetic_output(tmp_path / "out", train_tokens=3 * BLOCK_BYTES // 2)  # two train shards of ~6 MiB
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["version"] == 2 and set(manifest["splits"]) == {"train", "val"}
    entries = {split: read_split_index(manifest, split, lambda rel: (root / rel).read_bytes(), str(root))
               for split in ("train", "val")}
    assert [len(entries["train"]), len(entries["val"])] == [2, 1]
    for entry in entries["train"] + entries["val"]:
        raw = (root / entry.path).read_bytes()
        assert entry.sha256 == hashlib.sha256(raw).hexdigest() and entry.size == len(raw)
        assert entry.block_bytes == BLOCK_BYTES
        blocks = [raw[i : i + BLOCK_BYTES] for i in range(0, len(raw), BLOCK_BYTES)]
        sidecar = (root / entry.sidecar_path).read_bytes()
        assert sidecar == b"".join(hashlib.sha256(block).digest() for block in blocks)
        assert entry.blocks_sha256 == hashlib.sha256(sidecar).hexdigest()
    assert any(entry.blocks > 1 for entry in entries["train"])  # a shard spans blocks
