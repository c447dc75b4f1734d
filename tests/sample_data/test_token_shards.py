"""The synthetic data-prep output the trainer's tests and benchmarks stream: its manifest lists
each shard's sha256 whole and per block, as data prep's does, so a streaming reader verifies it."""

from __future__ import annotations

import hashlib
import json

from lmforge.common.shards import BLOCK_BYTES
from lmforge.sample_data.token_shards import synthetic_output


def test_manifest_lists_each_shards_whole_and_block_hashes(tmp_path):
    root = synthetic_output(tmp_path / "out", train_tokens=3 * BLOCK_BYTES // 2)  # two train shards of ~6 MiB
    manifest = json.loads((root / "manifest.json").read_text())
    assert {entry["split"] for entry in manifest["shards"]} == {"train", "val"}
    for entry in manifest["shards"]:
        raw = (root / entry["path"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(raw).hexdigest()
        assert entry["block_bytes"] == BLOCK_BYTES
        blocks = [raw[i : i + BLOCK_BYTES] for i in range(0, len(raw), BLOCK_BYTES)]
        assert entry["block_sha256"] == [hashlib.sha256(block).hexdigest() for block in blocks]
    assert any(len(entry["block_sha256"]) > 1 for entry in manifest["shards"])  # a shard spans blocks
