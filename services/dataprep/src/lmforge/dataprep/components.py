"""The duplicate clusters: connected components of the dedup edges in rounds of independent tasks
(large-star / small-star, star_steps.py), then each input's removed documents and the dedup summary.

Each round is `components.tasks` tasks (an Indexed Job on a cluster). Task t owns the documents of
a contiguous range of inputs (task_inputs: a doc id's high 32 bits are its input), so its nodes'
final labels are the removed ids of those inputs.
- Round 0 reads a contiguous share of the dedup partitions' edge files and sends each edge to the
  owners of both ends (one object per destination task).
- Every later round, while a task of the round before changed something, is a step: a task reads
  the one object each task of the round before sent it (round 1 first records its nodes,
  layout.components_nodes: each node's strongest edge kind, whether it has a near-duplicate edge),
  runs large-star (odd rounds) or small-star (even rounds) and sends the new edges on. Its marker
  says whether its part changed: a part already made of stars around lower ids is a fixed point of
  both steps. An unchanged part also writes its labels: in each component the lowest id survives
  and the others are removed, with reason = their strongest (lowest) kind over their own edges;
  the task writes layout.removed(i) for its inputs and its part of the summary
  (layout.components_stats). Once every task of a round is unchanged the graph is one star per
  component around its lowest id, and what that round wrote is final.
- A round after one in which nothing changed only marks itself done. A part still changing in the
  last scheduled round (components.max_rounds) fails with an InputError.
- finish_components sums the tasks' parts into layout.DEDUP_STATS, once they are final.
Two graphs go through the same rounds as layers of the same records: every edge (the clusters) and
the near-duplicate edges alone (the summary's near_duplicate_groups).

Guarantees: the removed files and the summary (but its `components_tasks`) are the same, byte for
byte, whatever the number of tasks or processes, and so is the number of rounds (each round is a
function of the whole graph); a round reads tasks² objects, however many inputs and documents
there are; every task writes its outputs before its marker, and a rerun skips a task whose marker
exists. A removed file written before the last round may be rewritten by a later one: it is final
once finish_components has run (layout.DEDUP_STATS).

Memory: a task holds its nodes' records, 18 bytes each: every duplicate edge twice (once per end),
a near-duplicate edge twice more (it is in both layers); sorting them and building a step's output
take a task to about 70 bytes a record at its peak (bench/components_memory.py). Round 0 holds its
share of the partitions' edges (24 bytes each) and their records. Skew: large-star gathers each
component's edges around its lowest id, so the task owning the center of a giant component holds
about one record per node of that component and layer, whatever the number of tasks (the bench's
random graph, 3 M edges with 80% of its 3 M documents in one component, at 4 tasks: 7.5 M records and
576 MiB in that task, 160-220 MiB in the others). Since a component's lowest id lies more often in
the first inputs, the first tasks hold more than their share even without one (a forest of small
components, 3 M edges over 12 M documents: 414 MiB against 200-290 MiB).
"""

from __future__ import annotations

import io
import json
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from lmforge.common.errors import ConfigError, InputError
from lmforge.common.store import Store
from lmforge.dataprep import layout
from lmforge.dataprep.config import DataprepConfig
from lmforge.dataprep.dedup_global import KIND_NEAR, KIND_REASONS, PartitionPlan
from lmforge.dataprep.star_steps import Adjacency, Records, both_ways, large_star, small_star

# What a task's completion marker says it did.
SHUFFLED, CHANGED, UNCHANGED, IDLE = "shuffled", "changed", "unchanged", "idle"
LAYER_ALL, LAYER_NEAR = 0, 1
IO_THREADS = 16  # object reads and writes in flight: a task reads and writes one object per task of a round


@dataclass(frozen=True)
class ComponentsTask:
    """Task `task` of round `round` of the components (round 0: the edge shuffle)."""

    n_inputs: int
    round: int
    task: int

    @property
    def done_marker(self) -> str:
        return layout.components_done(self.round, self.task)

    def run(self, store: Store, config: DataprepConfig) -> dict:
        return run_components_task(store, config, self.n_inputs, self.round, self.task)


def scheduled_rounds(config: DataprepConfig) -> int:
    """Rounds to schedule, one after the other; those after the final one only mark themselves done."""
    return config.components.max_rounds


def settled_by(store: Store, config: DataprepConfig, round: int) -> bool:
    """Whether the labels were final after round `round`: the rounds after it need not be
    scheduled (they would only mark themselves done)."""
    states = _states(store, config.components.tasks, round)
    return None not in states and (states[0] == IDLE or set(states) == {UNCHANGED})


def components_tasks(config: DataprepConfig, n_inputs: int, round: int) -> list[ComponentsTask]:
    if not 0 <= round < scheduled_rounds(config):
        raise ConfigError(f"components round {round} is outside components.max_rounds = {scheduled_rounds(config)}")
    return [ComponentsTask(n_inputs, round, t) for t in range(config.components.tasks)]


def task_inputs(n_inputs: int, tasks: int, task: int) -> range:
    """The inputs whose documents task `task` owns: a contiguous range (empty when tasks > inputs)."""
    return range(task * n_inputs // tasks, (task + 1) * n_inputs // tasks)


def edge_share(config: DataprepConfig, task: int) -> range:
    """The dedup partitions whose edge files task `task` of round 0 reads."""
    count, tasks = PartitionPlan.from_config(config.minhash).count, config.components.tasks
    return range(task * count // tasks, (task + 1) * count // tasks)


def run_components_task(store: Store, config: DataprepConfig, n_inputs: int, round: int, task: int) -> dict:
    """Run one task (see the module docstring); returns what its marker records."""
    marker = layout.components_done(round, task)
    if store.exists(marker):
        return json.loads(store.read_text(marker))
    last = round == scheduled_rounds(config) - 1
    if round == 0:
        result = _shuffle_edges(store, config, n_inputs, task)
    elif _all_unchanged_or_idle(store, config.components.tasks, round - 1):
        result = {"state": IDLE}
    else:
        result = _star_step(store, config, n_inputs, round, task)
    if last and result["state"] in (SHUFFLED, CHANGED):
        raise InputError(f"the duplicate graph did not settle within components.max_rounds = "
                         f"{scheduled_rounds(config)} rounds; raise components.max_rounds")
    store.write_text(marker, json.dumps(result, sort_keys=True))
    return result


def _states(store: Store, tasks: int, round: int) -> list[str | None]:
    """The state each task of `round` recorded in its marker (None: not done)."""
    markers = [layout.components_done(round, t) for t in range(tasks)]
    return [json.loads(store.read_text(marker))["state"] if store.exists(marker) else None for marker in markers]


def _all_unchanged_or_idle(store: Store, tasks: int, previous: int) -> bool:
    states = _states(store, tasks, previous)
    missing = [t for t, state in enumerate(states) if state is None]
    if missing:
        raise InputError(f"components round {previous} not finished: tasks {missing[:10]}"
                         f"{'…' if len(missing) > 10 else ''}")
    return states[0] == IDLE or set(states) == {UNCHANGED}


# ------------------------------------------------------------------ round 0: edges to their nodes' tasks


def _shuffle_edges(store: Store, config: DataprepConfig, n_inputs: int, task: int) -> dict:
    partitions = edge_share(config, task)
    missing = [p for p in partitions if not store.exists(layout.edges(p))]
    if missing:
        raise InputError(f"dedup partitions not finished: {missing[:10]}{'…' if len(missing) > 10 else ''}")
    with ThreadPoolExecutor(IO_THREADS) as pool:
        parts = list(pool.map(lambda p: _load_edges(store, p, n_inputs), partitions))
    n_edges = sum(len(part) for part in parts)
    edges = _unique_rows(np.concatenate(parts) if parts else np.zeros((0, 3), np.uint64))
    del parts
    records = list(both_ways(edges[:, 0], edges[:, 1], edges[:, 2].astype(np.uint8)))
    del edges
    _send(store, config, n_inputs, 0, task, records)
    return {"state": SHUFFLED, "edges": n_edges}


def _load_edges(store: Store, partition: int, n_inputs: int) -> np.ndarray:
    rel = layout.edges(partition)
    try:
        edges = np.load(io.BytesIO(store.read_bytes(rel)), allow_pickle=False)
    except (ValueError, EOFError, OSError, zipfile.BadZipFile) as exc:
        raise InputError(f"{store.join(rel)} is not a dedup edge file: {exc}") from exc
    if not isinstance(edges, np.ndarray) or edges.dtype != np.uint64 or edges.ndim != 2 or edges.shape[1] != 3:
        what = f"{edges.dtype} {edges.shape}" if isinstance(edges, np.ndarray) else "an .npz archive"
        raise InputError(f"{store.join(rel)} is not a dedup edge file: an (n, 3) uint64 array expected, got {what}")
    if len(edges) and int(edges[:, 2].max()) > KIND_NEAR:
        raise InputError(f"{store.join(rel)} has an unknown edge kind {int(edges[:, 2].max())}")
    if len(edges) and int(edges[:, :2].max() >> np.uint64(32)) >= n_inputs:
        raise InputError(f"{store.join(rel)} names input {int(edges[:, :2].max() >> np.uint64(32))}, "
                         f"but the run has {n_inputs} input(s)")
    return edges


def _unique_rows(edges: np.ndarray) -> np.ndarray:
    """The distinct rows (a pair that collides in many bands is one edge per kind)."""
    if len(edges) < 2:
        return edges
    edges = edges[np.lexsort(edges.T[::-1])]
    distinct = np.ones(len(edges), dtype=bool)
    distinct[1:] = np.any(edges[1:] != edges[:-1], axis=1)
    return edges[distinct]


# ------------------------------------------------------------------ rounds ≥ 1


def _star_step(store: Store, config: DataprepConfig, n_inputs: int, round: int, task: int) -> dict:
    records = list(_receive(store, config.components.tasks, round - 1, task))
    if round == 1:  # the records are the dedup edges, tagged with their kind
        _write_nodes(store, task, records[0], records[2])
        records = list(_layers(*records))
    adjacency = Adjacency.build(records)  # empties `records`
    settled, held = adjacency.settled(), len(adjacency)
    if settled:
        _write_labels(store, config, n_inputs, round, task, adjacency)
    step = large_star if round % 2 == 1 else small_star
    records = list(step(adjacency))
    del adjacency
    _send(store, config, n_inputs, round, task, records)  # empties `records`
    return {"state": UNCHANGED if settled else CHANGED, "records": held}


def _layers(src: np.ndarray, dst: np.ndarray, kind: np.ndarray) -> Records:
    """The dedup edges' records as the two layers: every edge, and the near-duplicate edges again."""
    near = kind == KIND_NEAR
    layer = np.concatenate((np.full(len(kind), LAYER_ALL, np.uint8), np.full(int(near.sum()), LAYER_NEAR, np.uint8)))
    return np.concatenate((src, src[near])), np.concatenate((dst, dst[near])), layer


def _write_nodes(store: Store, task: int, src: np.ndarray, kind: np.ndarray) -> None:
    """The task's nodes (sorted), each one's strongest (lowest) kind over its own edges, and whether
    it has a near-duplicate edge."""
    order = np.lexsort((kind, src))
    src, kind = src[order], kind[order]
    first = np.ones(len(src), dtype=bool)
    first[1:] = src[1:] != src[:-1]
    nodes, strongest = src[first], kind[first]
    near_nodes = np.unique(src[kind == KIND_NEAR])
    _write_npz(store, layout.components_nodes(task), nodes=nodes, kinds=strongest,
               near=np.isin(nodes, near_nodes, assume_unique=True))


def _write_labels(store: Store, config: DataprepConfig, n_inputs: int, round: int, task: int,
                  adjacency: Adjacency) -> None:
    """From a part made of stars around lower ids: its inputs' removed files and its summary part
    (final once every part is so)."""
    nodes_rel = layout.components_nodes(task)
    with _open_npz(store, nodes_rel) as data:
        nodes, kinds, near = _arrays(store, nodes_rel, data, "nodes", "kinds", "near")
    removed = adjacency.centers(LAYER_ALL, nodes) != nodes
    removed_ids, reasons = nodes[removed], kinds[removed]
    near_groups = int(np.sum(adjacency.centers(LAYER_NEAR, nodes[near]) == nodes[near]))
    inputs = task_inputs(n_inputs, config.components.tasks, task)
    bounds = np.searchsorted(removed_ids >> np.uint64(32), np.arange(inputs.start, inputs.stop + 1, dtype=np.uint64))
    for k, i in enumerate(inputs):
        _write_npz(store, layout.removed(i), doc_ids=removed_ids[bounds[k] : bounds[k + 1]],
                   reasons=reasons[bounds[k] : bounds[k + 1]])
    shuffled = json.loads(store.read_text(layout.components_done(0, task)))
    part = {"clusters": int(np.sum(~removed)),
            "removed": {name: int(np.sum(reasons == kind)) for kind, name in KIND_REASONS.items()},
            "edges": shuffled["edges"], "removed_total": int(len(removed_ids)), "near_duplicate_groups": near_groups,
            "rounds": round + 1, "inputs": [inputs.start, inputs.stop]}
    store.write_text(layout.components_stats(task), json.dumps(part, sort_keys=True))


def finish_components(store: Store, config: DataprepConfig, n_inputs: int) -> dict:
    """Sum the tasks' parts of the summary into layout.DEDUP_STATS (reading `components.tasks` small
    files) and return it."""
    tasks = config.components.tasks
    missing = [t for t in range(tasks) if not store.exists(layout.components_stats(t))]
    if missing:
        raise InputError(f"components tasks not finished: {missing[:10]}{'…' if len(missing) > 10 else ''}")
    parts = [json.loads(store.read_text(layout.components_stats(t))) for t in range(tasks)]
    rounds = {part["rounds"] for part in parts}
    if len(rounds) > 1 or not settled_by(store, config, rounds.pop() - 1):
        raise InputError("the duplicate graph's components are not settled yet: run every round of "
                         "components.max_rounds first")
    covered = [part["inputs"] for part in parts]
    expected = [[r.start, r.stop] for r in (task_inputs(n_inputs, tasks, t) for t in range(tasks))]
    if covered != expected:
        raise InputError(f"{store.join(layout.components_stats(0))}…: the components were found for other inputs "
                         f"than this run's {n_inputs}; use a fresh output directory")
    summary = {"clusters": sum(part["clusters"] for part in parts),
               "removed": {name: sum(part["removed"][name] for part in parts) for name in KIND_REASONS.values()},
               "edges": sum(part["edges"] for part in parts),
               "removed_total": sum(part["removed_total"] for part in parts),
               "near_duplicate_groups": sum(part["near_duplicate_groups"] for part in parts),
               "components_tasks": tasks, "components_rounds": parts[0]["rounds"]}
    store.write_text(layout.DEDUP_STATS, json.dumps(summary, indent=1))
    return summary


# ------------------------------------------------------------------ the objects between rounds


def _send(store: Store, config: DataprepConfig, n_inputs: int, round: int, task: int,
          records: list[np.ndarray]) -> None:
    """Write one object per task of the next round: the records whose src it owns. Takes the
    arrays out of `records` ([src, dst, tag]) and frees each once its sorted copy exists."""
    src, dst, tag = records
    records.clear()
    tasks = config.components.tasks
    # a task owns a contiguous range of inputs, so a contiguous range of ids: sorted by src, each
    # destination's records are one slice
    order = np.argsort(src, kind="stable")
    src = src[order]
    dst = dst[order]
    tag = tag[order]
    del order
    first_ids = np.array([task_inputs(n_inputs, tasks, t).start for t in range(tasks)], dtype=np.uint64) << 32
    bounds = np.append(np.searchsorted(src, first_ids), len(src))

    def write(dest: int) -> None:
        mine = slice(bounds[dest], bounds[dest + 1])
        _write_npz(store, layout.components_object(round, task, dest), src=src[mine], dst=dst[mine], tag=tag[mine])

    with ThreadPoolExecutor(IO_THREADS) as pool:
        list(pool.map(write, range(tasks)))


def _receive(store: Store, tasks: int, round: int, task: int) -> Records:
    """The records every task of `round` sent to task `task`."""
    def read(source: int) -> Records:
        rel = layout.components_object(round, source, task)
        with _open_npz(store, rel) as data:
            return _arrays(store, rel, data, "src", "dst", "tag")

    with ThreadPoolExecutor(IO_THREADS) as pool:
        parts = list(pool.map(read, range(tasks)))
    return tuple(np.concatenate(column) for column in zip(*parts))


def _write_npz(store: Store, rel: str, **arrays: np.ndarray) -> None:
    with store.open_write(rel) as fh:  # straight to the file: no copy of the arrays in memory
        np.savez(fh, **arrays)


def _open_npz(store: Store, rel: str):
    try:
        data = np.load(io.BytesIO(store.read_bytes(rel)), allow_pickle=False)
    except (ValueError, EOFError, OSError, zipfile.BadZipFile) as exc:
        raise InputError(f"{store.join(rel)} is unreadable: {exc}") from exc
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise InputError(f"{store.join(rel)} is not an .npz archive")
    return data


def _arrays(store: Store, rel: str, data, *names: str) -> tuple[np.ndarray, ...]:
    try:
        arrays = tuple(data[name] for name in names)
    except (KeyError, ValueError, EOFError, OSError, zipfile.BadZipFile) as exc:
        raise InputError(f"{store.join(rel)} is unreadable: {exc}") from exc
    if len({len(array) for array in arrays}) > 1:
        raise InputError(f"{store.join(rel)} is unreadable: its arrays {names} differ in length")
    return arrays
