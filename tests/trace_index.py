"""Tiny trace indexes for tests: a complete index root (partition dirs with entry.json, index.json, optionally
tokenizer.json) from a list of token-id documents, built by the real builder, plus a real byte-level BPE tokenizer
trained on a few sentences.

`make_tokenizer` is tests/tiny_text.py's tokenizer, the one tests/serving.py's tiny model is trained with; pass the
served package's own tokenizer.json to `build_test_index` when a server must accept the index (the tokenizer hashes
have to match)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from lmforge.common.storage import sha256_file
from lmforge.trace.build import build_partition
from lmforge.trace.format import ENTRY, INDEX_JSON, TOKENIZER, index_json, partition_dir
from tests.tiny_text import EOT, SENTENCES, train_tokenizer  # noqa: F401 - re-exported to the tests

make_tokenizer = train_tokenizer


def doc_metadata(i: int, url: str | None = None) -> dict:
    return {"doc_id": f"doc-{i}", "url": url if url is not None else f"https://example.com/{i}",
            "record_id": f"<urn:uuid:{i:08d}>", "shard": f"shard-{i % 3:06d}", "token_offset": 100 * i}


def build_test_index(root: Path, docs: list[list[int]], *, vocab_size: int, eos_token_id: int, urls=None,
                     tokenizer_json: Path | None = None, partitions: int = 1, part_tokens: int = 25_000_000) -> Path:
    """Index `docs` under `root` (document i gets doc_metadata(i, urls[i])), spread over `partitions` partitions
    in order (contiguous, nearly equal runs of documents; a partition may be empty). Returns root."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, len(docs), partitions + 1).round().astype(int)
    entries = []
    for p in range(partitions):
        name = partition_dir(p)
        chosen = range(bounds[p], bounds[p + 1])
        entry = build_partition(((np.asarray(docs[i], dtype=np.int64), doc_metadata(i, urls[i] if urls else None))
                                 for i in chosen), root / name, name, vocab_size=vocab_size,
                                eos_token_id=eos_token_id, part_tokens=part_tokens)
        (root / name / ENTRY).write_text(json.dumps(entry))
        entries.append(entry)
    tokenizer_sha256 = "0" * 64
    if tokenizer_json is not None:
        shutil.copyfile(tokenizer_json, root / TOKENIZER)
        tokenizer_sha256 = sha256_file(root / TOKENIZER)
    info = index_json(entries, vocab_size=vocab_size, eos_token_id=eos_token_id, tokenizer_sha256=tokenizer_sha256)
    (root / INDEX_JSON).write_text(json.dumps(info, indent=1))
    return root
