"""Global dedup across all workers and inputs, in two stages that scale out.

1. `group_partition(p)`: partition p is one slice by key range of one key column: an LSH
   band, the exact-URL or the exact-content key. It reads only its own section of every
   input's key file (dedup_keys.py: two ranged reads per input, in parallel), finds documents
   sharing a key and emits duplicate edges. Band candidates are verified against the full signatures
   (estimated Jaccard ≥ threshold less the estimator's noise margin, see
   minhash.verify_threshold), each candidate's row read alone: a partition without a
   candidate run reads no signatures. URL and content keys are exact. Partitions are
   independent: processes or Indexed-Job pods share them.
2. `cluster_group(k)`: connected components (scipy) of the edges of one group of partitions,
   written as a forest (node → lowest id of its component); `minhash.cluster_tasks` groups.
   Memory grows with the group's edges, never with documents that have no duplicate.
3. `merge_clusters()`: components of the joined forests, which are those of every edge; in each
   the document with the lowest id (first in input order) survives, the others are removed. It
   writes the removed ids per input (layout.removed), so a later task on input i reads only that
   input's, and the summary (layout.DEDUP_STATS) last. A duplicate pair that collides in many
   bands is many edges but one forest entry per group, so the merge holds far less than the edges.
"""

from __future__ import annotations

import io
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from lmforge.common.errors import InputError, StorageError
from lmforge.common.storage import Store
from lmforge.dataprep import layout
from lmforge.dataprep.config import MinHashConfig
from lmforge.dataprep.dedup_keys import read_partition
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
        key_bands, _ = lsh_params(config)
        return cls(key_bands if config.enabled else 0, config.partitions_per_band, key_bands)

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


def write_minhash_config(store: Store, config: MinHashConfig) -> None:
    bands, rows = lsh_params(config)
    payload = {**config.model_dump(mode="json"), "bands": bands, "rows": rows}
    if store.exists(layout.MINHASH_CONFIG):
        existing = json.loads(store.read_text(layout.MINHASH_CONFIG))
        if existing != payload:
            raise InputError(
                f"{store.join(layout.MINHASH_CONFIG)} was written with another MinHash config "
                f"({existing}); signatures are not comparable. Use a fresh output directory."
            )
        return
    store.write_text(layout.MINHASH_CONFIG, json.dumps(payload, indent=1, sort_keys=True))


def check_minhash_config(store: Store, config: MinHashConfig) -> None:
    if not store.exists(layout.MINHASH_CONFIG):
        raise InputError(f"{store.join(layout.MINHASH_CONFIG)} is missing: run the per-input stage first")
    write_minhash_config(store, config)  # raises on mismatch


READ_THREADS = 16  # ranged reads in flight: a dedup task reads one section per input, one row per candidate


def _partition_keys(store: Store, plan: PartitionPlan, i: int, partition: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(doc ids, keys, signature rows) of one partition of input i: its section of the input's key
    file, or for an input finished by an older version, its whole key matrix cut in memory."""
    try:
        return read_partition(store, i, partition)
    except StorageError:  # no key file: an input an older version finished has its key matrix
        if store.exists(layout.dedup_keys(i)) or not store.exists(layout.minhash(i)):
            raise
    with np.load(io.BytesIO(store.read_bytes(layout.minhash(i)))) as data:
        ids, keys = data["doc_ids"], data["keys"]
    column, _, key_slice = plan.describe(partition)
    column_keys = keys[:, column] if len(ids) else np.zeros(0, np.uint64)
    mine = column_keys % np.uint64(plan.partitions_per_band) == key_slice
    return ids[mine], column_keys[mine], np.flatnonzero(mine).astype(np.uint64)


def group_partition(store: Store, config: MinHashConfig, n_inputs: int, partition: int) -> int:
    """Write the duplicate edges of one partition; returns the number of edges."""
    if store.exists(layout.edges(partition)):
        return int(np.load(io.BytesIO(store.read_bytes(layout.edges(partition)))).shape[0])
    plan = PartitionPlan.from_config(config)
    _, kind, _ = plan.describe(partition)
    sections = _bounded_map(lambda i: _partition_keys(store, plan, i, partition), range(n_inputs))
    if sections:
        ids, keys, rows = (np.concatenate(parts) for parts in zip(*sections))
    else:
        ids, keys, rows = np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    order = np.lexsort((ids, keys))  # by key, then by doc id: each run starts with its lowest id
    edges = _edges_for_runs(store, config, keys[order], ids[order], rows[order], kind)
    buffer = io.BytesIO()
    np.save(buffer, edges)
    store.write_bytes(layout.edges(partition), buffer.getvalue())
    return int(edges.shape[0])


def _runs(keys: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of ≥ 2 equal keys in a sorted array."""
    if len(keys) < 2:
        return []
    boundaries = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [len(keys)]))
    keep = ends - starts >= 2
    return list(zip(starts[keep].tolist(), ends[keep].tolist()))


def _edges_for_runs(store: Store, config: MinHashConfig, keys, ids, rows, kind: int) -> np.ndarray:
    runs = _runs(keys)
    if not runs:
        return np.zeros((0, 3), dtype=np.uint64)
    if kind != KIND_NEAR:
        pairs = [(ids[j], ids[start]) for start, end in runs for j in range(start + 1, end)]
        return _edge_array(pairs, kind)
    in_runs = np.concatenate([np.arange(start, end) for start, end in runs])
    signatures = dict(zip(in_runs.tolist(), _read_signatures(store, ids[in_runs], rows[in_runs])))
    pairs = []
    for start, end in runs:
        sigs = np.stack([signatures[j] for j in range(start, end)])
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


def _bounded_map(fn, items, window: int = 1024) -> list:
    """[fn(x) for x in items], READ_THREADS at a time, at most `window` submitted at once (a queued
    read costs its Future's memory: a task can have a million of them)."""
    items, results = list(items), []
    with ThreadPoolExecutor(READ_THREADS) as pool:
        for first in range(0, len(items), window):
            results.extend(pool.map(fn, items[first : first + window]))
    return results


def _read_signatures(store: Store, doc_ids: np.ndarray, rows: np.ndarray) -> list[np.ndarray]:
    """The signatures of the given documents (doc id → input, row), each row read by a ranged read
    of its own (in parallel): a task reads its candidates' signatures, never a whole file."""
    inputs = (doc_ids >> np.uint64(32)).astype(np.int64)
    with_candidates = np.unique(inputs).tolist()
    layouts = {}
    for i, (offset, shape, dtype) in zip(
            with_candidates, _bounded_map(lambda i: _npy_layout(store, layout.signatures(i)), with_candidates)):
        layouts[i] = (offset, shape[1] * dtype.itemsize, dtype)

    def row(item: tuple[int, int]) -> np.ndarray:
        i, r = item
        offset, row_bytes, dtype = layouts[i]
        return np.frombuffer(store.read_range(layout.signatures(i), offset + r * row_bytes, row_bytes), dtype=dtype)

    return _bounded_map(row, list(zip(inputs.tolist(), rows.tolist())))


def _npy_layout(store: Store, rel: str) -> tuple[int, tuple[int, ...], np.dtype]:
    """(offset of the data, shape, dtype) of a C-order .npy file, from two ranged reads of its header."""
    prefix = store.read_range(rel, 0, 10)  # magic (6), version (2), header length (2 in version 1)
    major = prefix[6]
    size_bytes = 2 if major == 1 else 4
    if major != 1:
        prefix += store.read_range(rel, 10, 2)
    header_len = int.from_bytes(prefix[8 : 8 + size_bytes], "little")
    head = io.BytesIO(prefix + store.read_range(rel, len(prefix), header_len))
    np.lib.format.read_magic(head)
    read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    shape, _, dtype = read_header(head)
    return head.tell(), shape, dtype


def cluster_groups(config: MinHashConfig) -> list[range]:
    """The dedup partitions whose edges each cluster task reads (minhash.cluster_tasks of them)."""
    count = PartitionPlan.from_config(config).count
    tasks = min(config.cluster_tasks, count)
    return [range(k * count // tasks, (k + 1) * count // tasks) for k in range(tasks)]


def cluster_group(store: Store, config: MinHashConfig, group: int) -> int:
    """Connected components of one group of partitions' edges, written as a forest: each node (a
    document with a duplicate in the group), the lowest id of its component in the group, and the
    strongest kind of its edges there; the same for near-duplicate edges alone (the report's
    groups). Memory grows with the group's edges. Returns the number of edges."""
    if store.exists(layout.cluster_forest(group)):
        with np.load(io.BytesIO(store.read_bytes(layout.cluster_forest(group)))) as data:
            return int(data["edges"])
    partitions = cluster_groups(config)[group]
    missing = [p for p in partitions if not store.exists(layout.edges(p))]
    if missing:
        raise InputError(f"dedup partitions not finished: {missing[:10]}{'…' if len(missing) > 10 else ''}")
    edges = [np.load(io.BytesIO(store.read_bytes(layout.edges(p)))) for p in partitions]
    edges = np.concatenate(edges) if edges else np.zeros((0, 3), np.uint64)
    nodes, roots, kinds = _forest(edges[:, :2], edges[:, 2].astype(np.uint8))
    near = edges[edges[:, 2] == KIND_NEAR]
    near_nodes, near_roots, _ = _forest(near[:, :2], near[:, 2].astype(np.uint8))
    buffer = io.BytesIO()
    np.savez(buffer, nodes=nodes, roots=roots, kinds=kinds, near_nodes=near_nodes, near_roots=near_roots,
             edges=np.int64(edges.shape[0]))
    store.write_bytes(layout.cluster_forest(group), buffer.getvalue())
    return int(edges.shape[0])


def merge_clusters(store: Store, config: MinHashConfig, n_inputs: int) -> dict:
    """Join the cluster tasks' forests (a node → root pair keeps every connection its group's
    edges made), so the components are those of every edge, and in each the document with the
    lowest id (first in input order) survives. Writes the removed ids of each input, then the
    summary (its presence marks clustering complete). Memory grows with the documents that have a
    duplicate, at most once per cluster task, not with the edges."""
    groups = range(len(cluster_groups(config)))
    missing = [k for k in groups if not store.exists(layout.cluster_forest(k))]
    if missing:
        raise InputError(f"cluster tasks not finished: {missing[:10]}{'…' if len(missing) > 10 else ''}")
    parts: dict[str, list[np.ndarray]] = {"nodes": [], "roots": [], "kinds": [], "near_nodes": [], "near_roots": []}
    n_edges = 0
    for k in groups:
        with np.load(io.BytesIO(store.read_bytes(layout.cluster_forest(k)))) as data:
            for name, values in parts.items():
                values.append(data[name])
            n_edges += int(data["edges"])
    joined = {name: np.concatenate(values) for name, values in parts.items()}
    pairs = np.stack([joined["nodes"], joined["roots"]], axis=1)
    nodes, roots, kinds = _forest(pairs, joined["kinds"])
    removed = nodes != roots
    removed_ids, reasons = nodes[removed], kinds[removed]
    near_pairs = np.stack([joined["near_nodes"], joined["near_roots"]], axis=1)
    near_nodes, near_roots, _ = _forest(near_pairs, np.zeros(len(near_pairs), np.uint8))
    owner = (removed_ids >> np.uint64(32)).astype(np.int64)  # a doc id's high 32 bits are its input
    bounds = np.searchsorted(owner, np.arange(n_inputs + 1))  # removed_ids are sorted
    for i in range(n_inputs):
        buffer = io.BytesIO()
        np.savez(buffer, doc_ids=removed_ids[bounds[i] : bounds[i + 1]], reasons=reasons[bounds[i] : bounds[i + 1]])
        store.write_bytes(layout.removed(i), buffer.getvalue())
    counts = {KIND_REASONS[k]: int(np.sum(reasons == k)) for k in KIND_REASONS}
    summary = {"clusters": int(np.sum(~removed)), "removed": counts, "edges": n_edges,
               "removed_total": int(len(removed_ids)), "near_duplicate_groups": int(np.sum(near_nodes == near_roots)),
               "cluster_tasks": len(groups)}
    store.write_text(layout.DEDUP_STATS, json.dumps(summary, indent=1))
    return summary


def _forest(pairs: np.ndarray, kinds_of_pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Connected components of the graph whose edges are `pairs` (doc ids): every node, sorted, the
    lowest id in its component, and the strongest (lowest) kind among the pairs it is in."""
    if len(pairs) == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(0, np.uint8)
    nodes, inverse = np.unique(pairs, return_inverse=True)
    inverse = inverse.reshape(-1, 2)
    n = len(nodes)
    graph = coo_matrix((np.ones(len(inverse), dtype=np.int8), (inverse[:, 0], inverse[:, 1])), shape=(n, n))
    count, labels = connected_components(graph, directed=False)
    first = np.full(count, n, dtype=np.int64)  # nodes are sorted: the first index per label is its lowest id
    np.minimum.at(first, labels, np.arange(n))
    kinds = np.full(n, 255, dtype=np.uint8)
    for column in (0, 1):  # a pair's kind applies to both of its ends
        np.minimum.at(kinds, inverse[:, column], kinds_of_pairs)
    return nodes, nodes[first[labels]], kinds


def load_removed(store: Store, i: int) -> tuple[np.ndarray, np.ndarray]:
    """(doc ids, reasons) of input i's documents that dedup removed, the ids sorted."""
    if not store.exists(layout.removed(i)) and store.exists(layout.LEGACY_DEDUP_REMOVED):
        with np.load(io.BytesIO(store.read_bytes(layout.LEGACY_DEDUP_REMOVED))) as data:  # an older run's
            mine = (data["doc_ids"] >> np.uint64(32)) == i
            return data["doc_ids"][mine], data["reasons"][mine]
    with np.load(io.BytesIO(store.read_bytes(layout.removed(i)))) as data:
        return data["doc_ids"], data["reasons"]
