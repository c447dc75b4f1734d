"""The combine stage, between the per-input stage and dedup: a shuffle of the dedup keys, so a
dedup task reads one object per input group instead of one key file per input.

Inputs are cut into G = min(inputs, minhash.group_objects) contiguous groups and the dedup
partitions into contiguous ranges of minhash.combine_partitions (dedup_plan.ShufflePlan). The
task of (group, range) reads, from each input of its group, the sections of its range (they are
contiguous in the input's key file: one ranged read of their offsets, one of their bytes) and
writes one object, layout.combined_keys(group, range), in the key files' own layout
(dedup_keys.py): a section per partition of the range, in partition order, each holding its
inputs' rows in input order, which is doc-id order, and in a band partition their signatures
after the triples, in the same order.

Guarantees: the object is written whole or not at all (Store writes are atomic), so its presence
marks the task done; a task reads only its group's inputs and holds about its object (what
minhash.combine_partitions is chosen for); an input an older version finished (the key file
without signatures, or only the whole key matrix) is read whole with its signature file, once
per task, and gives the same object. A key file this run cannot read is a one-line InputError.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from lmforge.common.errors import InputError, StorageError
from lmforge.common.store import Store
from lmforge.dataprep import layout
from lmforge.dataprep.config import DataprepConfig, MinHashConfig
from lmforge.dataprep.dedup_global import (
    PartitionPlan,
    bounded_map,
    key_format,
    resolved_minhash_config,
    shuffle_plan,
)
from lmforge.dataprep.dedup_keys import SIGNATURE_DTYPE, KeyFormat, Section, read_sections, write_key_object


@dataclass(frozen=True)
class CombineTask:
    """One input group's keys for one range of dedup partitions, gathered into one object."""

    group: int
    part_range: int
    first_input: int
    stop_input: int
    first_partition: int
    stop_partition: int

    @property
    def done_marker(self) -> str:
        return layout.combined_keys(self.group, self.part_range)

    def run(self, store: Store, config: DataprepConfig) -> int:
        return combine_group(store, config.minhash, self.group, self.part_range,
                             range(self.first_input, self.stop_input),
                             range(self.first_partition, self.stop_partition))


def combine_tasks(config: DataprepConfig, n_inputs: int) -> list[CombineTask]:
    """Every (input group, partition range) of the run, group by group. `config` is the run's,
    its counts resolved (stage_runs.open_run; dedup_global.resolved_minhash_config)."""
    shuffle = shuffle_plan(config.minhash, n_inputs)
    ranges = [shuffle.partition_range(r) for r in range(shuffle.n_ranges)]
    return [CombineTask(g, r, inputs.start, inputs.stop, partitions.start, partitions.stop)
            for g, inputs in enumerate(shuffle.groups) for r, partitions in enumerate(ranges)]


def combine_group(store: Store, config: MinHashConfig, group: int, part_range: int, inputs: range,
                  partitions: range) -> int:
    """Write the combined object of `inputs` for `partitions`; returns its rows (documents ×
    partitions), 0 when it was written before."""
    rel = layout.combined_keys(group, part_range)
    if store.exists(rel):
        return 0
    config = resolved_minhash_config(store, config)
    plan, fmt = PartitionPlan.from_config(config), key_format(config)
    per_input = bounded_map(lambda i: _input_sections(store, plan, fmt, i, partitions), inputs)
    by_partition = list(zip(*per_input)) if per_input else [() for _ in partitions]
    sizes = [sum(len(section) for section in sections) * fmt.row_bytes(p)
             for p, sections in zip(partitions, by_partition)]

    def chunks():
        for sections in by_partition:
            yield from (section.triples for section in sections)
            yield from (section.signatures for section in sections if section.signatures is not None)

    with store.open_write(rel) as fh:
        write_key_object(fh, sizes, chunks())
    return sum(len(section) for sections in by_partition for section in sections)


def _input_sections(store: Store, plan: PartitionPlan, fmt: KeyFormat, i: int, partitions: range) -> list[Section]:
    try:
        return read_sections(store, layout.dedup_keys(i), fmt, partitions)
    except StorageError:
        if store.exists(layout.dedup_keys(i)):
            raise
    sections = _legacy_sections(store, plan, i, partitions)
    if sections is None:
        raise InputError(f"{store.join(layout.dedup_keys(i))} not found: run the per-input stage for input {i} first")
    if any(p < fmt.signed for p in partitions):
        _attach_signatures(store, fmt, i, partitions, sections)
    return sections


def _legacy_sections(store: Store, plan: PartitionPlan, i: int, partitions: range) -> list[Section] | None:
    """Input i's sections as an older version left them: its key file without signatures, or its
    whole key matrix (before key files), cut in memory; None when it has neither."""
    if store.exists(layout.legacy_dedup_keys(i)):
        return read_sections(store, layout.legacy_dedup_keys(i), KeyFormat(0, 0), partitions)
    if not store.exists(layout.minhash(i)):
        return None
    with np.load(io.BytesIO(store.read_bytes(layout.minhash(i)))) as data:
        ids, keys = data["doc_ids"], data["keys"]
    rows = np.arange(len(ids), dtype=np.uint64)
    sections = []
    for p in partitions:
        column, _, key_slice = plan.describe(p)
        column_keys = keys[:, column] if len(ids) else np.zeros(0, np.uint64)
        mine = column_keys % np.uint64(plan.partitions_per_band) == key_slice
        sections.append(Section(np.stack([ids[mine], column_keys[mine], rows[mine]], axis=1).astype("<u8"), None))
    return sections


def _attach_signatures(store: Store, fmt: KeyFormat, i: int, partitions: range, sections: list[Section]) -> None:
    """Give an older input's band sections their rows of its signature file (read whole, once)."""
    rel = layout.signatures(i)
    try:
        signatures = np.load(io.BytesIO(store.read_bytes(rel)))
    except ValueError as exc:
        raise InputError(f"{store.join(rel)}: not a signature file ({exc})") from None
    if signatures.ndim != 2 or signatures.shape[1] != fmt.num_perm:
        raise InputError(f"{store.join(rel)}: signatures of shape {signatures.shape}, expected (n, {fmt.num_perm})")
    for p, section in zip(partitions, sections):
        if p < fmt.signed:
            rows = section.triples[:, 2].astype(np.int64)
            if len(rows) and rows.max() >= len(signatures):
                raise InputError(f"{store.join(rel)}: {len(signatures)} rows, its key file names row {rows.max()}")
            section.signatures = np.ascontiguousarray(signatures[rows], dtype=SIGNATURE_DTYPE)
