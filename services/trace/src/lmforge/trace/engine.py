"""An opened trace index: index.json checked, one infini-gram engine over every partition, the unigram model.

The engine takes a list of index directories and fans every query out over them (counts summed, documents from
each), so a partition directory is one engine "shard" and its position in `partition_dirs` is the engine's `s`.
Partitions without documents are skipped: the engine cannot open an empty index.

Two engine quirks are handled here:
- it classifies a directory's files by searching the *whole path* for "tokenized", "table", "offset", "metadata",
  "metaoff" and "unigram", so an index under, say, /data/metadata/ would be misread: such directories are opened
  through symlinks in a fresh temporary directory (removed once the files are mapped);
- its longest-prefix search skips the suffix of rank 0 when the query sorts before every suffix of a partition,
  so a match with that one suffix is missed. `rank0` keeps each partition's rank-0 suffix (a lazy memmap) for
  query.py to detect and repair exactly that case.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from infini_gram.engine import InfiniGramEngine

from lmforge.common.errors import InputError
from lmforge.trace.build import numpy_dtype
from lmforge.trace.format import ENGINE, ENGINE_VERSION, INDEX_JSON, INDEX_VERSION, PARTITION_FILES, read_index_json

_ENGINE_KEYWORDS = ("tokenized", "table", "offset", "metadata", "metaoff", "unigram")
# the engine starts one thread per query position in blocks of this size (times one per partition): keep it small
# so a long query cannot exhaust a container's pid limit
ATTRIBUTION_BLOCK = 64


class TraceIndex:
    """Use `TraceIndex.open(root)`. Thread-safe for queries (the engine's methods are const and release the GIL)."""

    def __init__(self, root: Path, info: dict, engine: InfiniGramEngine | None, unigram_counts: np.ndarray,
                 partition_dirs: list[Path]):
        self.root = root
        self.info = info
        self.engine = engine
        self.partition_dirs = partition_dirs
        self.tokens: int = info["tokens"]
        self.documents: int = info["documents"]
        self.bytes: int = info["bytes"]
        self.partitions: int = len(info["partitions"])
        self.vocab_size: int = info["vocab_size"]
        self.eos_token_id: int = info["eos_token_id"]
        self.tokenizer_sha256: str = info["tokenizer_sha256"]
        self.token_dtype = numpy_dtype(info["token_dtype"])
        self.unigram_counts = unigram_counts
        # add-one smoothing: a token the corpus never saw still gets a finite (very low) log-probability
        total = float(unigram_counts.sum()) + self.vocab_size
        self.unigram_logprobs = np.log((unigram_counts.astype(np.float64) + 1.0) / total)
        self.rank0 = [_rank0_suffix(d, self.token_dtype) for d in partition_dirs]

    @classmethod
    def open(cls, root: Path) -> TraceIndex:
        root = Path(root)
        manifest = root / INDEX_JSON
        try:
            text = manifest.read_text()
        except FileNotFoundError:
            raise InputError(f"{manifest} does not exist: not a trace index") from None
        info = read_index_json(text, source=str(manifest))
        vocab_size = info["vocab_size"]
        entries = [entry for entry in info["partitions"] if entry["documents"] > 0]
        dirs = [root / entry["name"] for entry in entries]
        counts = np.zeros(vocab_size, dtype=np.uint64)
        for d, entry in zip(dirs, entries):
            _check_partition(d, entry, numpy_dtype(info["token_dtype"]).itemsize)
            partition_counts = np.load(d / "unigram.npy")
            if partition_counts.shape != (vocab_size,):
                raise InputError(f"{d / 'unigram.npy'} has shape {partition_counts.shape}; expected ({vocab_size},)")
            counts += partition_counts.astype(np.uint64)
        engine = None
        if dirs:
            with _engine_paths(dirs) as paths:
                engine = InfiniGramEngine(index_dir=paths, eos_token_id=info["eos_token_id"], vocab_size=vocab_size,
                                          version=INDEX_VERSION, token_dtype=info["token_dtype"],
                                          attribution_block_size=ATTRIBUTION_BLOCK,
                                          precompute_unigram_logprobs=False)
        return cls(root, info, engine, counts, dirs)

    def summary(self) -> dict:
        """What a trace result says about the index it came from."""
        return {"tokens": self.tokens, "documents": self.documents, "partitions": self.partitions,
                "engine": f"{ENGINE}/{ENGINE_VERSION}"}


def _check_partition(partition: Path, entry: dict, width: int) -> None:
    """The files the engine will map agree with the entry and with each other (the engine asserts, i.e. aborts
    the process, on an inconsistent index)."""
    sizes = {}
    for name in PARTITION_FILES:
        path = partition / name
        if not path.is_file():
            raise InputError(f"trace index partition {partition} lacks {name}")
        sizes[name] = path.stat().st_size
        if sizes[name] != entry["files"][name]["bytes"]:
            raise InputError(f"{path} has {sizes[name]} bytes; index.json says {entry['files'][name]['bytes']}")
    tokens = sizes["tokenized.0"] // width
    documents = entry["documents"]
    if (sizes["tokenized.0"] % width or tokens < documents or sizes["table.0"] % tokens
            or not 1 <= sizes["table.0"] // tokens <= 8 or sizes["offset.0"] != 8 * documents
            or sizes["metaoff.0"] != 8 * documents):
        raise InputError(f"trace index partition {partition} is inconsistent (file sizes do not fit "
                         f"{documents} documents of {width}-byte tokens)")


def _rank0_suffix(partition: Path, dtype: np.dtype) -> np.ndarray:
    """The partition's lexicographically smallest suffix (tokens from its position to the end of tokenized.0)."""
    data = np.memmap(partition / "tokenized.0", dtype=dtype, mode="r")
    table_bytes = (partition / "table.0").stat().st_size
    ratio = table_bytes // data.size
    with open(partition / "table.0", "rb") as fh:
        pointer = int.from_bytes(fh.read(ratio), "little")
    return data[pointer // dtype.itemsize:]


@contextlib.contextmanager
def _engine_paths(dirs: list[Path]) -> Iterator[list[str]]:
    paths = [str(d.resolve()) for d in dirs]
    if not any(k in p for p in paths for k in _ENGINE_KEYWORDS):
        yield paths
        return
    for _ in range(10):
        links = Path(tempfile.mkdtemp(prefix="lmforge-trace-"))
        if not any(k in str(links) for k in _ENGINE_KEYWORDS):
            break
        links.rmdir()
    else:
        raise InputError("cannot find a temporary directory whose path the trace engine reads correctly")
    try:
        linked = []
        for i, path in enumerate(paths):
            (links / f"p{i}").symlink_to(path, target_is_directory=True)
            linked.append(str(links / f"p{i}"))
        yield linked
    finally:
        for entry in links.iterdir():
            os.unlink(entry)
        links.rmdir()
