"""How the dedup keys are shuffled: inputs cut into contiguous groups, dedup partitions into
contiguous combine ranges, and the counts `auto` leaves open chosen from the inputs' sizes.

The combine stage writes one object per (input group, partition range) (combine.py); a dedup
task reads one object per group (dedup_global.group_partition). With G = min(inputs,
minhash.group_objects) groups a dedup task makes O(G) requests whatever the number of inputs,
and a combine task reads two ranges of each of its group's inputs' key files.

Sizing, all of it estimates from the inputs' bytes (what a listing gives before any input is read):
- documents: DOCS_PER_INPUT_BYTE per input byte, an over-estimate of every corpus we measured
  (the benchmark's gzip WET holds one record per 1.8 kB; Common Crawl 3.0 G documents in ~10 TB
  of gzip WET, one per 3.3 kB; uncompressed text holds fewer per byte), so the counts err on the
  side of smaller tasks;
- a dedup task holds SORT_BYTES_PER_DOC per document of its partition (the triples it reads,
  the sort order, the sorted copies) and, in a band partition, the signature of each candidate,
  CANDIDATE_SHARE of its documents at most (the benchmark: 21%);
- a combine task holds its combined object: its group's documents' triples for each partition of
  its range and, for a band partition, their signatures.
A task's data is kept under DATA_SHARE of minhash.task_memory_bytes; the rest is the interpreter,
its libraries and the reads in flight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmforge.dataprep.config import MinHashConfig

DOCS_PER_INPUT_BYTE = 1 / 1800
UNKNOWN_INPUT_BYTES = 160 << 20  # an input whose listing gives no size: more than a Common Crawl WET file
TRIPLE_BYTES = 24  # (doc id, key, signature row), uint64 each
SIGNATURE_ITEM_BYTES = 4  # uint32 per permutation
SORT_BYTES_PER_DOC = 80
CANDIDATE_SHARE = 0.25
DATA_SHARE = 0.5


def input_groups(n_inputs: int, group_objects: int) -> list[range]:
    """min(n_inputs, group_objects) contiguous groups of inputs, sizes differing by at most one."""
    count = min(n_inputs, group_objects)
    return [range(g * n_inputs // count, (g + 1) * n_inputs // count) for g in range(count)]


@dataclass(frozen=True)
class ShufflePlan:
    """Input groups × partition ranges of one run: a pure function of its input count and its
    resolved MinHash config, so every process builds the same."""

    n_inputs: int
    partitions: int  # dedup partitions in all (dedup_global.PartitionPlan.count)
    group_objects: int
    combine_partitions: int  # partitions per range

    @property
    def groups(self) -> list[range]:
        return input_groups(self.n_inputs, self.group_objects)

    @property
    def n_ranges(self) -> int:
        return -(-self.partitions // self.combine_partitions)

    def partition_range(self, index: int) -> range:
        return range(index * self.combine_partitions, min(self.partitions, (index + 1) * self.combine_partitions))

    def range_of(self, partition: int) -> int:
        return partition // self.combine_partitions


def _row_bytes(config: MinHashConfig, band: bool) -> int:
    return TRIPLE_BYTES + (SIGNATURE_ITEM_BYTES * config.num_perm if band else 0)


def dedup_task_bytes_per_doc(config: MinHashConfig, band: bool) -> float:
    return SORT_BYTES_PER_DOC + (CANDIDATE_SHARE * SIGNATURE_ITEM_BYTES * config.num_perm if band else 0)


def known_sizes(sizes: list[int | None]) -> list[int]:
    """Each input's size, the mean of the known ones (else UNKNOWN_INPUT_BYTES) where a size is unknown."""
    known = [s for s in sizes if s is not None]
    fill = round(sum(known) / len(known)) if known else UNKNOWN_INPUT_BYTES
    return [fill if s is None else s for s in sizes]


def choose_partitions_per_band(config: MinHashConfig, bands: int, input_bytes: int) -> int:
    """The fewest partitions per key column that keep a dedup task's estimated data under its share
    of task_memory_bytes (every partition of a column holds about the same share of the documents)."""
    docs = input_bytes * DOCS_PER_INPUT_BYTE
    need = docs * dedup_task_bytes_per_doc(config, band=bands > 0)
    return max(1, math.ceil(need / (config.task_memory_bytes * DATA_SHARE)))


def choose_combine_partitions(config: MinHashConfig, bands: int, partitions_per_band: int, partitions: int,
                              group_bytes: int) -> int:
    """The most partitions per combined object that keep a combine task of a group of `group_bytes`
    input bytes under its share of task_memory_bytes (at least one, at most every partition)."""
    per_partition = group_bytes * DOCS_PER_INPUT_BYTE / partitions_per_band * _row_bytes(config, band=bands > 0)
    fit = math.floor(config.task_memory_bytes * DATA_SHARE / per_partition) if per_partition else partitions
    return max(1, min(partitions, fit))


def choose_counts(config: MinHashConfig, bands: int, input_sizes: list[int | None]) -> dict:
    """The counts `config` leaves to the run ("auto"), chosen from its inputs' sizes, and the
    figures they came from: what work/minhash_config.json records beside the config."""
    sizes = known_sizes(input_sizes)
    groups = input_groups(len(sizes), config.group_objects)
    largest_group = max((sum(sizes[i] for i in group) for group in groups), default=0)
    ppb = config.partitions_per_band
    if ppb == "auto":
        ppb = choose_partitions_per_band(config, bands, sum(sizes))
    partitions = (bands + 2) * ppb
    combine = config.combine_partitions
    if combine == "auto":
        combine = choose_combine_partitions(config, bands, ppb, partitions, largest_group)
    return {"partitions_per_band": ppb, "combine_partitions": combine, "input_bytes": sum(sizes),
            "largest_group_input_bytes": largest_group, "docs_per_input_byte": DOCS_PER_INPUT_BYTE}
