"""Data-prep-shaped outputs for trainer tests: real shard files and a manifest."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lmforge.common.shards import write_shard


def write_output(root: Path, shard_tokens: dict[str, list[np.ndarray]], *, vocab_size: int,
                 tokenizer_sha: str = "ab" * 32) -> Path:
    entries = []
    for split, arrays in shard_tokens.items():
        for k, tokens in enumerate(arrays):
            rel = f"shards/{split}_{k:05d}.bin"
            (root / "shards").mkdir(parents=True, exist_ok=True)
            digest = write_shard(root / rel, tokens, np.array([len(tokens)]), eot_id=0, vocab_size=vocab_size,
                                 tokenizer_sha256=tokenizer_sha)
            entries.append({"path": rel, "split": split, "tokens": int(len(tokens)), "sha256": digest})
    manifest = {"shards": entries, "tokenizer": {"sha256": tokenizer_sha, "vocab_size": vocab_size}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def random_output(root: Path, vocab_size: int = 256, train_tokens: int = 40_000, seed: int = 0) -> Path:
    """Tokens with some structure (a noisy repeating pattern), so a model can learn; with a
    stand-in tokenizer.json whose hash the manifest and shard headers carry."""
    import hashlib

    root.mkdir(parents=True, exist_ok=True)
    stand_in = json.dumps({"stand_in_tokenizer": True, "vocab_size": vocab_size}).encode()
    (root / "tokenizer.json").write_bytes(stand_in)
    tokenizer_sha = hashlib.sha256(stand_in).hexdigest()
    rng = np.random.default_rng(seed)
    pattern = rng.integers(1, vocab_size, 97)
    tokens = np.resize(pattern, train_tokens)
    noise = rng.random(train_tokens) < 0.2
    tokens[noise] = rng.integers(1, vocab_size, int(noise.sum()))
    return write_output(root, {"train": [tokens[: train_tokens // 2], tokens[train_tokens // 2 :]],
                               "val": [tokens[:3000]]}, vocab_size=vocab_size, tokenizer_sha=tokenizer_sha)
