"""Global dedup across all workers and inputs: the duplicate edges of each dedup partition.

`group_partition(p)`: partition p is one slice by key range of one key column: an LSH
   band, the exact-URL or the exact-content key. The combine stage (combine.py) has gathered
   every input group's sections of a range of partitions into one object; a dedup task reads its
   section's triples from each group's object (dedup_keys.py: two ranged reads per object, in
   parallel), finds documents sharing a key and emits duplicate edges. Band candidates are
   verified against the full signatures (estimated Jaccard ≥ threshold less the estimator's noise
   margin, see minhash.verify_threshold), read from the signature part of the same objects, only
   of those that hold a candidate, a few coalesced ranged reads each: requests per task grow with
   the number of input groups (minhash.group_objects at most), never with the inputs or the
   candidates. Memory: ~80 bytes per document of the partition plus the candidates' signatures.
   URL and content keys are exact. The edges are those one sort of every input's section of the
   partition gives: the objects hold the inputs' sections in input order. Partitions are
   independent: processes or Indexed-Job pods share them.

The components stage (components.py) then finds the duplicate clusters in rounds and writes
each input's removed documents (layout.removed), which `load_removed` reads.
"""

from __future__ import annotations

import io
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from lmforge.common.errors import ConfigError, InputError, StorageError
from lmforge.common.store import Store
from lmforge.dataprep import layout
from lmforge.dataprep.config import MinHashConfig
from lmforge.dataprep.dedup_keys import SIGNATURE_DTYPE, KeyFormat, KeyPart, read_key_part, read_signature_rows
from lmforge.dataprep.dedup_plan import ShufflePlan, choose_counts
from lmforge.dataprep.minhash import estimated_jaccard, lsh_params, verify_threshold

# Edge kinds, in order of precedence when a removed document has several.
KIND_CONTENT, KIND_URL, KIND_NEAR = 0, 1, 2
KIND_REASONS = {KIND_CONTENT: "duplicate_content", KIND_URL: "duplicate_url", KIND_NEAR: "near_duplicate"}


@dataclass(frozen=True)
class PartitionPlan:
    bands: int
    partitions_per_band: int
    # The band-key columns before the URL and content keys in the key matrix: the per-input stage
    # computes them whether or not near-duplicate dedup runs (then `bands`, its partitions, is 0).
    key_bands: int | None = None

    @classmethod
    def from_config(cls, config: MinHashConfig) -> PartitionPlan:
        if config.partitions_per_band == "auto":
            raise ConfigError("minhash.partitions_per_band is 'auto' until a run chooses it: plan dedup partitions "
                              "with the run's config (resolved_minhash_config), not the one given")
        key_bands, _ = lsh_params(config)
        return cls(key_bands if config.enabled else 0, config.partitions_per_band, key_bands)

    @property
    def signed(self) -> int:
        """The band partitions, the first ones: their sections carry the documents' signatures."""
        return self.bands * self.partitions_per_band

    @property
    def count(self) -> int:
        return (self.bands + 2) * self.partitions_per_band

    def describe(self, partition: int) -> tuple[int, int, int]:
        """(key column, kind, key-range slice) of a partition: each partitioned column (the LSH
        bands, then the URL and content keys) cut into partitions_per_band slices."""
        index, key_slice = divmod(partition, self.partitions_per_band)
        if index < self.bands:
            return index, KIND_NEAR, key_slice
        first_exact = self.bands if self.key_bands is None else self.key_bands
        return first_exact + (index - self.bands), KIND_URL if index == self.bands else KIND_CONTENT, key_slice

    def sections(self) -> list[tuple[int, int]]:
        """(key column, slice) of every partition, in order: the sections of an input's key file."""
        return [(column, key_slice) for column, _, key_slice in map(self.describe, range(self.count))]


def key_format(config: MinHashConfig) -> KeyFormat:
    return KeyFormat(PartitionPlan.from_config(config).signed, config.num_perm)


def shuffle_plan(config: MinHashConfig, n_inputs: int) -> ShufflePlan:
    """The run's input groups and combine ranges (dedup_plan.py)."""
    if config.combine_partitions == "auto":
        raise ConfigError("minhash.combine_partitions is 'auto' until a run chooses it: plan the combine stage "
                          "with the run's config (resolved_minhash_config), not the one given")
    return ShufflePlan(n_inputs, PartitionPlan.from_config(config).count, config.group_objects,
                       config.combine_partitions)


# What a run chooses when its config says "auto" (dedup_plan.choose_counts), recorded with the config.
CHOSEN_COUNTS = ("partitions_per_band", "combine_partitions")


def write_minhash_config(store: Store, config: MinHashConfig, input_sizes: list[int | None] | None = None
                         ) -> MinHashConfig:
    """Record the run's MinHash config in work/minhash_config.json, with the counts it leaves to the
    run ("auto") chosen from `input_sizes` (each input's bytes, None where the listing gives none;
    no list: nothing is known, the fewest partitions) and the figures they came from; or, when a
    record exists, check `config` against it: signatures, key files and partitions are comparable
    only under one config, and every task must see the same counts. Returns the config with the
    recorded counts."""
    bands, rows = lsh_params(config)
    requested = {**config.model_dump(mode="json"), "bands": bands, "rows": rows}
    if store.exists(layout.MINHASH_CONFIG):
        existing = json.loads(store.read_text(layout.MINHASH_CONFIG))
        differing = [f"{key}: {existing.get(key)!r} recorded, {value!r} given" for key, value in requested.items()
                     if existing.get(key) != value and not (key in CHOSEN_COUNTS and value == "auto")]
        if differing:
            raise InputError(
                f"{store.join(layout.MINHASH_CONFIG)} was written with another MinHash config "
                f"({'; '.join(differing)}); signatures are not comparable. Use a fresh output directory."
            )
        return config.model_copy(update={key: existing[key] for key in CHOSEN_COUNTS})
    record = {**requested, **choose_counts(config, bands if config.enabled else 0, input_sizes or [])}
    store.write_text(layout.MINHASH_CONFIG, json.dumps(record, indent=1, sort_keys=True))
    return config.model_copy(update={key: record[key] for key in CHOSEN_COUNTS})


def check_minhash_config(store: Store, config: MinHashConfig) -> MinHashConfig:
    """`config` checked against the run's record, with the recorded counts."""
    if not store.exists(layout.MINHASH_CONFIG):
        raise InputError(f"{store.join(layout.MINHASH_CONFIG)} is missing: run the per-input stage first")
    return write_minhash_config(store, config)  # raises on mismatch


def resolved_minhash_config(store: Store, config: MinHashConfig) -> MinHashConfig:
    """`config` with the counts the run chose where it says "auto" (one read of the record); a config
    that leaves nothing open as it is, without a read."""
    if all(getattr(config, key) != "auto" for key in CHOSEN_COUNTS):
        return config
    if not store.exists(layout.MINHASH_CONFIG):
        raise InputError(f"{store.join(layout.MINHASH_CONFIG)} is missing: the MinHash counts left to the run "
                         "('auto') are chosen when it is opened with its inputs (stage_runs.open_run)")
    return write_minhash_config(store, config)


READ_THREADS = 16  # ranged reads in flight: a dedup task reads a section of one object per input group


def group_partition(store: Store, config: MinHashConfig, n_inputs: int, partition: int) -> int:
    """Write the duplicate edges of one partition; returns the number of edges."""
    if store.exists(layout.edges(partition)):
        return int(np.load(io.BytesIO(store.read_bytes(layout.edges(partition)))).shape[0])
    config = resolved_minhash_config(store, config)
    plan, shuffle, fmt = PartitionPlan.from_config(config), shuffle_plan(config, n_inputs), key_format(config)
    _, kind, _ = plan.describe(partition)
    part_range = shuffle.range_of(partition)
    first, count = shuffle.partition_range(part_range).start, len(shuffle.partition_range(part_range))
    parts = bounded_map(lambda g: _key_part(store, fmt, layout.combined_keys(g, part_range), partition - first,
                                             count, partition), range(len(shuffle.groups)))
    triples = np.concatenate([part.triples for part in parts]) if parts else np.zeros((0, 3), np.uint64)
    ids, keys = triples[:, 0], triples[:, 1]
    order = np.lexsort((ids, keys))  # by key, then by doc id: each run starts with its lowest id
    edges = _edges_for_runs(config, keys[order], ids[order], kind,
                            lambda positions: _candidate_signatures(store, fmt, parts, order[positions]))
    buffer = io.BytesIO()
    np.save(buffer, edges)
    store.write_bytes(layout.edges(partition), buffer.getvalue())
    return int(edges.shape[0])


def _key_part(store: Store, fmt: KeyFormat, rel: str, index: int, count: int, partition: int) -> KeyPart:
    try:
        return read_key_part(store, rel, fmt, index, count, partition)
    except StorageError:
        if store.exists(rel):
            raise
        raise InputError(f"{store.join(rel)} not found: run the combine stage before dedup") from None


def _candidate_signatures(store: Store, fmt: KeyFormat, parts: list[KeyPart], indices: np.ndarray) -> np.ndarray:
    """The signatures of the documents at `indices` (unique) of the parts' concatenated triples, in
    that order: per part, only its candidates' rows, a few coalesced ranged reads (parts in parallel)."""
    starts = np.cumsum([0, *(len(part.triples) for part in parts)])
    by_index = np.argsort(indices)
    ordered = indices[by_index]
    bounds = np.searchsorted(ordered, starts)
    with_candidates = [k for k in range(len(parts)) if bounds[k + 1] > bounds[k]]

    def read(k: int) -> np.ndarray:
        return read_signature_rows(store, parts[k], fmt, ordered[bounds[k] : bounds[k + 1]] - starts[k])

    out = np.empty((len(indices), fmt.num_perm), dtype=SIGNATURE_DTYPE)
    for k, rows in zip(with_candidates, bounded_map(read, with_candidates)):
        out[by_index[bounds[k] : bounds[k + 1]]] = rows
    return out


def _runs(keys: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of ≥ 2 equal keys in a sorted array."""
    if len(keys) < 2:
        return []
    boundaries = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [len(keys)]))
    keep = ends - starts >= 2
    return list(zip(starts[keep].tolist(), ends[keep].tolist()))


def _edges_for_runs(config: MinHashConfig, keys, ids, kind: int, signatures_of) -> np.ndarray:
    """Edges of the runs of equal keys in sorted (keys, ids); `signatures_of(positions)`: the
    signatures of the documents at those positions, read only for a band partition's runs."""
    runs = _runs(keys)
    if not runs:
        return np.zeros((0, 3), dtype=np.uint64)
    if kind != KIND_NEAR:
        pairs = [(ids[j], ids[start]) for start, end in runs for j in range(start + 1, end)]
        return _edge_array(pairs, kind)
    in_runs = np.concatenate([np.arange(start, end) for start, end in runs])
    signatures = signatures_of(in_runs)  # the runs' rows, run after run
    pairs, at = [], 0
    for start, end in runs:
        sigs = signatures[at : at + end - start]
        at += end - start
        pairs.extend(_verified_pairs(ids[start:end], sigs, verify_threshold(config), config.max_pairs_per_bucket))
    return _edge_array(pairs, kind)


def _verified_pairs(members: np.ndarray, sigs: np.ndarray, threshold: float, cap: int) -> list[tuple[int, int]]:
    """Link each member to the first earlier member (among the first `cap`) whose
    estimated Jaccard reaches the threshold."""
    anchors = sigs[: min(cap, len(members))]
    similarity = estimated_jaccard(sigs[:, None, :], anchors[None, :, :])  # (members, anchors)
    pairs = []
    for j in range(1, len(members)):
        limit = min(j, len(anchors))
        hits = np.flatnonzero(similarity[j, :limit] >= threshold)
        if len(hits):
            pairs.append((members[j], members[hits[0]]))
    return pairs


def _edge_array(pairs, kind: int) -> np.ndarray:
    if not pairs:
        return np.zeros((0, 3), dtype=np.uint64)
    edges = np.empty((len(pairs), 3), dtype=np.uint64)
    edges[:, :2] = np.asarray(pairs, dtype=np.uint64)
    edges[:, 2] = kind
    return edges


def bounded_map(fn, items, window: int = 1024) -> list:
    """[fn(x) for x in items], READ_THREADS at a time, at most `window` submitted at once (a queued
    read costs its Future's memory: a task can have a million of them)."""
    items, results = list(items), []
    with ThreadPoolExecutor(READ_THREADS) as pool:
        for first in range(0, len(items), window):
            results.extend(pool.map(fn, items[first : first + window]))
    return results


def load_removed(store: Store, i: int) -> tuple[np.ndarray, np.ndarray]:
    """(doc ids, reasons) of input i's documents that dedup removed, the ids sorted."""
    if not store.exists(layout.removed(i)) and store.exists(layout.LEGACY_DEDUP_REMOVED):
        with np.load(io.BytesIO(store.read_bytes(layout.LEGACY_DEDUP_REMOVED))) as data:  # an older run's
            mine = (data["doc_ids"] >> np.uint64(32)) == i
            return data["doc_ids"][mine], data["reasons"][mine]
    with np.load(io.BytesIO(store.read_bytes(layout.removed(i)))) as data:
        return data["doc_ids"], data["reasons"]
