"""A synthetic data-prep output (manifest, shards, a stand-in tokenizer.json) for the
trainer's tests and benchmarks: tokens with learnable structure, no data-prep run needed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from lmforge.common.shard_index import ShardEntry, new_manifest, write_split_index
from lmforge.common.shards import BLOCK_BYTES, write_shard

EOT_ID = 0  # the end-of-text token of the synthetic outputs (their patterns draw tokens from 1 up)


def write_output(root: Path, shard_tokens: dict[str, list[np.ndarray]], *, vocab_size: int,
                 tokenizer_sha: str = "ab" * 32, block_bytes: int = BLOCK_BYTES) -> Path:
    """Shards per split (each with its block sidecar, blocks of `block_bytes`), a split index per
    split and manifest.json, in data-prep's format (lmforge.common.shard_index)."""
    (root / "shards").mkdir(parents=True, exist_ok=True)
    splits = {}
    for split, arrays in shard_tokens.items():
        entries = []
        for k, tokens in enumerate(arrays):
            rel = f"shards/{split}_{k:05d}.bin"
            digest = write_shard(root / rel, tokens, np.array([len(tokens)]), eot_id=EOT_ID, vocab_size=vocab_size,
                                 tokenizer_sha256=tokenizer_sha, block_bytes=block_bytes)
            entries.append(ShardEntry(rel, int(len(tokens)), 1, (root / rel).stat().st_size, **digest.index_fields()))
        splits[split] = write_split_index(lambda rel, data: _write(root / rel, data), split, entries)
    manifest = new_manifest({"sha256": tokenizer_sha, "vocab_size": vocab_size, "eot_id": EOT_ID}, splits)
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def synthetic_output(root: Path, vocab_size: int = 256, train_tokens: int = 40_000, seed: int = 0,
                     block_bytes: int = BLOCK_BYTES, document_tokens: int = 0, tokenizer: Path | None = None) -> Path:
    """A noisy repeating pattern (so a model can learn), split into two train shards and a val shard;
    with document_tokens, documents of about that many tokens (geometric lengths) each ending with the
    end-of-text token EOT_ID (which the pattern never uses). The tokenizer.json is a stand-in, or
    `tokenizer` (a real one, whose vocabulary size then wins) for what encodes text against the data
    set, e.g. an evaluation job's harness tasks."""
    root.mkdir(parents=True, exist_ok=True)
    if tokenizer is not None:
        stand_in = tokenizer.read_bytes()
        vocab_size = tokenizer_vocab_size(stand_in)
    else:
        stand_in = json.dumps({"stand_in_tokenizer": True, "vocab_size": vocab_size}).encode()
    (root / "tokenizer.json").write_bytes(stand_in)
    rng = np.random.default_rng(seed)
    pattern = rng.integers(1, vocab_size, 97)
    tokens = np.resize(pattern, train_tokens)
    noise = rng.random(train_tokens) < 0.2
    tokens[noise] = rng.integers(1, vocab_size, int(noise.sum()))
    if document_tokens:
        ends = np.cumsum(rng.geometric(1 / document_tokens, train_tokens // document_tokens * 2)) - 1
        tokens[ends[ends < train_tokens]] = EOT_ID
    val = tokens[: min(3000, train_tokens)]
    return write_output(root, {"train": [tokens[: train_tokens // 2], tokens[train_tokens // 2 :]], "val": [val]},
                        vocab_size=vocab_size, tokenizer_sha=hashlib.sha256(stand_in).hexdigest(),
                        block_bytes=block_bytes)


def tokenizer_vocab_size(tokenizer_json: bytes) -> int:
    """The id space of a Hugging Face tokenizers file: one past the largest id of its vocabulary and
    added tokens."""
    body = json.loads(tokenizer_json)
    ids = [*body["model"]["vocab"].values(), *(t["id"] for t in body.get("added_tokens") or [])]
    return max(ids) + 1
