"""Tiny trace indexes for tests: a complete index root (partition dirs with entry.json, index.json, optionally
tokenizer.json) from a list of token-id documents, built by the real builder, plus a real byte-level BPE tokenizer
trained on a few sentences.

`make_tokenizer` trains exactly as tests/serving.py's `train_tokenizer` does (same sentences, same trainer), without
importing torch; pass the served package's own tokenizer.json to `build_test_index` when a server must accept the
index (the tokenizer hashes have to match)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from lmforge.common.storage import sha256_file
from lmforge.trace.build import build_partition
from lmforge.trace.format import ENTRY, INDEX_JSON, TOKENIZER, index_json, partition_dir

EOT = "<|endoftext|>"
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "A week has seven days and a year has twelve months.",
    "The sun rises in the east and sets in the west.",
    "Bees make honey from the nectar of flowers.",
    "The train to the north leaves at nine in the morning.",
    "Two plus two is four, and three plus three is six.",
    "Grüße aus München: das Café öffnet um acht Uhr.",
    "Our garden has roses, tulips and a small apple tree.",
]


def make_tokenizer(path: Path, vocab_size: int = 320, sentences: list[str] = SENTENCES) -> Path:
    """A byte-level BPE tokenizer.json (EOT is id 0) trained on `sentences`; returns `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(sentences * 4, trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path


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
