"""Where every artifact of a data-prep run lives, relative to the output root.

Final artifacts (docs/design.md): shards/, tokenizer.json, manifest.json, lineage/, rejects/,
report.json, report.html. Intermediate state for resuming and for the global stages
lives under work/.
"""

from __future__ import annotations

CONFIG = "work/config.json"
INPUTS = "work/inputs.json"
MINHASH_CONFIG = "work/minhash_config.json"
TOKENIZER = "tokenizer.json"
MANIFEST = "manifest.json"
REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
LEGACY_DEDUP_REMOVED = "work/dedup/removed.npz"  # every removed id in one file, before issue 19
DEDUP_STATS = "work/stats/global_dedup.json"
TOKENIZER_STATS = "work/stats/global_tokenizer.json"
SHARD_STATS = "work/stats/global_shards.json"
TIMINGS = "work/timings"  # <phase>/<host>-<pid>-<start>.json: each process's part of a phase (timings.py)


def docs(i: int) -> str:
    return f"work/docs/{i:06d}.parquet"


def minhash(i: int) -> str:
    """The whole key matrix of input i, as versions before issue 19 wrote it (read only to resume one)."""
    return f"work/minhash/{i:06d}.npz"


def signatures(i: int) -> str:
    return f"work/minhash/{i:06d}.sig.npy"


def dedup_keys(i: int) -> str:
    """Input i's dedup keys, one section per dedup partition (dedup_keys.py): a dedup task reads
    only its own section of each input's file."""
    return f"work/minhash/keys/{i:06d}.bin"


def input_stats(i: int) -> str:
    return f"work/stats/input-{i:06d}.json"


def input_done(i: int) -> str:
    return f"work/done/input-{i:06d}"


def filter_rejects(i: int) -> str:
    return f"rejects/filter-{i:06d}.parquet"


def dedup_rejects(i: int) -> str:
    return f"rejects/dedup-{i:06d}.parquet"


def edges(partition: int) -> str:
    return f"work/dedup/edges-{partition:04d}.npy"


def cluster_forest(group: int) -> str:
    """A cluster task's components of its group of partitions' edges (dedup_global.cluster_group)."""
    return f"work/dedup/forest-{group:04d}.npz"


def removed(i: int) -> str:
    """Input i's documents that global dedup removed (doc ids, reasons), written by the cluster task:
    the only part of the duplicate clusters a task on input i reads."""
    return f"work/dedup/removed/{i:06d}.npz"


def tokens(i: int) -> str:
    return f"work/tokens/{i:06d}.bin"


def token_index(i: int) -> str:
    return f"work/tokens/{i:06d}.arrow"


def tokenize_stats(i: int) -> str:
    return f"work/stats/tokenize-{i:06d}.json"


def tokenize_done(i: int) -> str:
    return f"work/done/tokenize-{i:06d}"


def shard(split: str, partition: int, k: int) -> str:
    return f"shards/{split}_{partition:06d}_{k:04d}.bin"


def lineage(split: str, partition: int, k: int) -> str:
    return f"lineage/{split}_{partition:06d}_{k:04d}.parquet"


def shard_entries(partition: int) -> str:
    """The manifest entries of one shard partition's shards; written last, it marks the task done."""
    return f"work/shards/partition-{partition:06d}.json"
