"""Where every artifact of a data-prep run lives, relative to the output root.

Final artifacts (docs/design.md): shards/, tokenizer.json, manifest.json, lineage/, rejects/,
report.json, report.html, and trace-index/ when trace_index.enabled. Intermediate state for
resuming and for the global stages lives under work/.
"""

from __future__ import annotations

import zlib
from pathlib import PurePosixPath

from lmforge.trace import format as trace_format

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
TRACE_INDEX = "trace-index"  # the trace index's root (lmforge.trace.format declares what lies below it)
TRACE_INDEX_JSON = f"{TRACE_INDEX}/{trace_format.INDEX_JSON}"
TRACE_INDEX_TOKENIZER = f"{TRACE_INDEX}/{trace_format.TOKENIZER}"
TIMINGS = "work/timings"  # <phase>/<host>-<pid>-<start>.json: each process's part of a phase (timings.py)


def docs(i: int) -> str:
    return f"work/docs/{i:06d}.parquet"


def minhash(i: int) -> str:
    """The whole key matrix of input i, as versions before issue 19 wrote it (read only to resume one)."""
    return f"work/minhash/{i:06d}.npz"


def signatures(i: int) -> str:
    """Input i's signatures as versions before the combine stage wrote them (now in its key file):
    read only to resume such a run."""
    return f"work/minhash/{i:06d}.sig.npy"


def _hash_dir(name: str) -> str:
    """Two hex digits from a hash of `name`: objects a stage reads and writes at high rates go under
    256 such directories, so no S3 prefix takes more than a small share of the stage's requests."""
    return f"{zlib.crc32(name.encode()) & 0xFF:02x}"


def dedup_keys(i: int) -> str:
    """Input i's dedup keys with their signatures, one section per dedup partition (dedup_keys.py):
    a combine task reads its range of partitions of each of its group's inputs."""
    name = f"{i:06d}.bin"
    return f"work/minhash/keys/{_hash_dir(name)}/{name}"


def legacy_dedup_keys(i: int) -> str:
    """Input i's key file as versions before the combine stage wrote it (triples only, its
    signatures in layout.signatures(i)): read only to resume such a run."""
    return f"work/minhash/keys/{i:06d}.bin"


def combined_keys(group: int, part_range: int) -> str:
    """The keys of input group `group` for partition range `part_range` (combine.py): a dedup task
    reads its section of one such object per group."""
    name = f"g{group:06d}-r{part_range:04d}.bin"
    return f"work/dedup/combined/{_hash_dir(name)}/{name}"


def input_stats(i: int) -> str:
    return f"work/stats/input-{i:06d}.json"


def input_done(i: int) -> str:
    return f"work/done/input-{i:06d}"


def filter_rejects(i: int) -> str:
    return f"rejects/filter-{i:06d}.parquet"


def dedup_rejects(i: int) -> str:
    return f"rejects/dedup-{i:06d}.parquet"


def edges(partition: int) -> str:
    name = f"{partition:06d}.npy"
    return f"work/dedup/edges/{_hash_dir(name)}/{name}"


def removed(i: int) -> str:
    """Input i's documents that global dedup removed (doc ids, reasons), written by a components task:
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
    return lineage_of(shard(split, partition, k))


def lineage_of(shard_path: str) -> str:
    """The lineage file of a shard (shards/NAME.bin → lineage/NAME.parquet)."""
    return f"lineage/{PurePosixPath(shard_path).stem}.parquet"


def shard_entries(partition: int) -> str:
    """The manifest entries of one shard partition's shards; written last, it marks the task done."""
    return f"work/shards/partition-{partition:06d}.json"


def components_object(round_: int, source: int, dest: int) -> str:
    """The duplicate-graph edges components task `source` of round `round_` sends to task `dest` of
    the next round (components.py): tasks² objects per round, under 256 hash directories so that no
    S3 prefix takes more than a small share of a round's requests."""
    name = f"round-{round_:03d}/{source:05d}-{dest:05d}.npz"
    return f"work/dedup/components/{_hash_dir(name)}/{name}"


def components_done(round_: int, task: int) -> str:
    """A components task's completion marker (JSON: what the round did, whether its part changed).
    Every task of the next round reads every one of them: spread under the hash directories too."""
    name = f"round-{round_:03d}/done-{task:05d}.json"
    return f"work/dedup/components/{_hash_dir(name)}/{name}"


def components_nodes(task: int) -> str:
    """A components task's nodes (documents with a duplicate edge, sorted), each one's strongest edge
    kind and whether it has a near-duplicate edge, written in round 1 and read by the last round."""
    return f"work/dedup/components/nodes-{task:05d}.npz"


def components_stats(task: int) -> str:
    """A components task's part of the dedup summary, written with its inputs' removed files."""
    return f"work/dedup/components/stats-{task:05d}.json"


def trace_index_stats(partition: int) -> str:
    """What building a partition's trace index cost (seconds, peak RSS), written just before its entry."""
    return f"work/stats/trace-index-{partition:06d}.json"


def trace_partition(partition: int) -> str:
    """The trace index of index partition `partition` (an infini-gram index directory)."""
    return f"{TRACE_INDEX}/{trace_format.partition_dir(partition)}"


def trace_partition_file(partition: int, name: str) -> str:
    return f"{trace_partition(partition)}/{name}"


def trace_entry(partition: int) -> str:
    """The partition's index entry (files, sizes, sha256), written last: it marks the trace-index task done."""
    return trace_partition_file(partition, trace_format.ENTRY)
