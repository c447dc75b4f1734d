"""Connected components in rounds (components.py): the removed files and the summary against an
exact union-find, at 1, 2 and 7 tasks, on graphs chosen to be hard for label propagation; the
round count, reruns, and what bad input and an unsettled graph give."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest

from lmforge.common.errors import InputError
from lmforge.common.local_store import LocalStore
from lmforge.dataprep import layout
from lmforge.dataprep.components import components_tasks, finish_components, scheduled_rounds, settled_by
from lmforge.dataprep.config import DataprepConfig
from lmforge.dataprep.dedup_global import (
    KIND_CONTENT,
    KIND_NEAR,
    KIND_REASONS,
    KIND_URL,
    PartitionPlan,
    load_removed,
)

N_INPUTS = 5


def _config(tasks: int, max_rounds: int = 40) -> DataprepConfig:
    return DataprepConfig.model_validate({"components": {"tasks": tasks, "max_rounds": max_rounds},
                                          "minhash": {"partitions_per_band": 2}})


def _doc_ids(n: int, rng: np.random.Generator) -> np.ndarray:
    """n distinct doc ids spread over the inputs (high 32 bits: input, low 32: row), ascending."""
    inputs = np.sort(rng.integers(0, N_INPUTS, n)).astype(np.uint64)
    rows = np.arange(n, dtype=np.uint64)
    return (inputs << np.uint64(32)) | rows


def _edges(pairs: np.ndarray, kinds) -> np.ndarray:
    edges = np.empty((len(pairs), 3), dtype=np.uint64)
    edges[:, :2] = pairs
    edges[:, 2] = kinds
    return edges


def _chain(n: int, shuffled: bool) -> np.ndarray:
    rng = np.random.default_rng(1)
    ids = _doc_ids(n, rng)
    if shuffled:
        ids = rng.permutation(ids)
    return _edges(np.stack([ids[1:], ids[:-1]], axis=1), KIND_NEAR)


def _star(n: int) -> np.ndarray:
    rng = np.random.default_rng(2)
    ids = _doc_ids(n, rng)
    center = ids[n // 2]  # neither the lowest id nor the highest
    leaves = np.delete(ids, n // 2)
    return _edges(np.stack([leaves, np.full(n - 1, center)], axis=1), rng.integers(0, 3, n - 1))


def _small_components(n: int) -> np.ndarray:
    rng = np.random.default_rng(3)
    ids = rng.permutation(_doc_ids(n, rng))
    pairs = []
    start = 0
    while start < n - 1:
        size = min(int(rng.integers(2, 5)), n - start)
        members = ids[start : start + size]
        pairs.extend((members[k], members[int(rng.integers(0, k))]) for k in range(1, size))
        start += size
    return _edges(np.array(pairs, dtype=np.uint64), rng.integers(0, 3, len(pairs)))


def _random_graph(n: int, m: int) -> np.ndarray:
    rng = np.random.default_rng(4)
    ids = _doc_ids(n, rng)
    pairs = ids[rng.integers(0, n, (m, 2))]
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    return _edges(pairs, rng.integers(0, 3, len(pairs)))


def _mixed_kinds() -> np.ndarray:
    """Near chains joined by exact edges, the same pair under several kinds and many times over (as
    LSH bands give it), and a self-loop."""
    rng = np.random.default_rng(5)
    ids = _doc_ids(1500, rng)
    chain = np.stack([ids[1:600], ids[:599]], axis=1)
    near = _edges(chain, KIND_NEAR)
    exact = _edges(ids[rng.integers(0, 1500, (400, 2))], rng.choice([KIND_CONTENT, KIND_URL], 400))
    exact = exact[exact[:, 0] != exact[:, 1]]
    again = near[rng.integers(0, len(near), 300)]
    relabelled = again.copy()
    relabelled[:, 2] = KIND_URL
    self_loop = _edges(np.array([[ids[1400], ids[1400]]], dtype=np.uint64), KIND_NEAR)
    return np.concatenate([near, exact, again, relabelled, self_loop])


GRAPHS = {
    "chain_increasing": lambda: _chain(3000, shuffled=False),
    "chain_shuffled": lambda: _chain(3000, shuffled=True),
    "large_star": lambda: _star(4000),
    "small_components": lambda: _small_components(4000),
    "random": lambda: _random_graph(3000, 2500),
    "mixed_kinds": _mixed_kinds,
}


# ------------------------------------------------------------------ the exact reference


def _union_find_components(nodes: np.ndarray, pairs: np.ndarray) -> dict[int, int]:
    """node → lowest id of its component."""
    parent = {int(v): int(v) for v in nodes}

    def root(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for a, b in pairs.tolist():
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)  # the lower id stays the root: it is the component's lowest
    return {v: root(v) for v in parent}


def _expected(edges: np.ndarray) -> tuple[list[tuple[list[int], list[int]]], dict]:
    strongest: dict[int, int] = {}
    for a, b, kind in edges.tolist():
        for v in (a, b):
            strongest[v] = min(strongest.get(v, 3), kind)
    nodes = np.array(sorted(strongest), dtype=np.uint64)
    labels = _union_find_components(nodes, edges[:, :2])
    removed = sorted(v for v, label in labels.items() if label != v)
    near = edges[edges[:, 2] == KIND_NEAR]
    near_labels = _union_find_components(np.unique(near[:, :2]), near[:, :2])
    per_input = [([v for v in removed if v >> 32 == i], [strongest[v] for v in removed if v >> 32 == i])
                 for i in range(N_INPUTS)]
    summary = {"clusters": sum(label == v for v, label in labels.items()),
               "removed": {name: sum(strongest[v] == kind for v in removed) for kind, name in KIND_REASONS.items()},
               "edges": len(edges), "removed_total": len(removed),
               "near_duplicate_groups": sum(label == v for v, label in near_labels.items())}
    return per_input, summary


# ------------------------------------------------------------------ running the rounds


def _write_edge_files(root, config: DataprepConfig, edges: np.ndarray) -> None:
    """The edges spread over every dedup partition's file, as the dedup tasks leave them."""
    count = PartitionPlan.from_config(config.minhash).count
    which = np.random.default_rng(6).integers(0, count, len(edges))
    store = LocalStore(root)
    for p in range(count):
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(edges[which == p]))
        store.write_bytes(layout.edges(p), buffer.getvalue())


def _run_rounds(root, config: DataprepConfig) -> dict:
    """Every round in order, as the runner schedules them, until one has found the final labels."""
    store = LocalStore(root)
    for round_ in range(scheduled_rounds(config)):
        for task in components_tasks(config, N_INPUTS, round_):
            task.run(store, config)
        if settled_by(store, config, round_):
            break
    return finish_components(store, config, N_INPUTS)


def _removed_files(root) -> list[bytes]:
    return [(root / layout.removed(i)).read_bytes() for i in range(N_INPUTS)]


@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_components_match_union_find_at_any_number_of_tasks(tmp_path, graph):
    edges = GRAPHS[graph]()
    per_input, summary = _expected(edges)
    assert summary["removed_total"] > 0
    files = {}
    for tasks in (1, 2, 7):
        root = tmp_path / f"tasks-{tasks}"
        config = _config(tasks)
        _write_edge_files(root, config, edges)
        got = _run_rounds(root, config)
        assert {key: got[key] for key in summary} == summary, tasks
        assert got["components_tasks"] == tasks
        for i, (ids, reasons) in enumerate(per_input):
            doc_ids, got_reasons = load_removed(LocalStore(root), i)
            assert doc_ids.dtype == np.uint64 and got_reasons.dtype == np.uint8
            assert doc_ids.tolist() == ids and got_reasons.tolist() == reasons, (tasks, i)
        files[tasks] = (_removed_files(root), {k: v for k, v in got.items() if k != "components_tasks"})
    assert files[1] == files[2] == files[7]  # byte for byte, and the same number of rounds


def test_rounds_grow_with_the_log_of_a_chain(tmp_path):
    rounds = {}
    for n in (16, 4096):
        for shuffled in (False, True):
            root = tmp_path / f"{n}-{shuffled}"
            config = _config(3)
            _write_edge_files(root, config, _chain(n, shuffled))
            rounds[n, shuffled] = _run_rounds(root, config)["components_rounds"]
    # the shuffle, the steps (a large-star and a small-star step about halve a path's length) and
    # the step that changes nothing
    assert all(r <= 2 * math.log2(n) + 4 for (n, _), r in rounds.items()), rounds
    assert rounds[4096, False] > rounds[16, False]


def test_a_rerun_skips_done_tasks_and_redoes_a_killed_one(tmp_path):
    config = _config(3)
    _write_edge_files(tmp_path, config, _random_graph(2000, 1800))
    summary = _run_rounds(tmp_path, config)
    files = _removed_files(tmp_path)
    stamps = [(tmp_path / layout.removed(i)).stat().st_mtime_ns for i in range(N_INPUTS)]
    assert _run_rounds(tmp_path, config) == summary
    assert [(tmp_path / layout.removed(i)).stat().st_mtime_ns for i in range(N_INPUTS)] == stamps
    # the last round's task 1 killed after writing one of its inputs' removed files, before its marker
    last_round = summary["components_rounds"] - 1
    (tmp_path / layout.components_done(last_round, 1)).unlink()
    (tmp_path / layout.components_stats(1)).unlink()
    (tmp_path / layout.removed(2)).write_bytes(b"torn")
    assert _run_rounds(tmp_path, config) == summary
    assert _removed_files(tmp_path) == files


def test_rounds_after_the_final_one_only_mark_themselves_done(tmp_path):
    config = _config(2)
    ids = _doc_ids(600, np.random.default_rng(7)).reshape(200, 3)  # each component a star around its lowest id
    stars = np.concatenate([np.stack([ids[:, k], ids[:, 0]], axis=1) for k in (1, 2)])
    _write_edge_files(tmp_path, config, _edges(stars, KIND_URL))  # settled from the start
    store = LocalStore(tmp_path)
    for round_ in range(scheduled_rounds(config)):
        for task in components_tasks(config, N_INPUTS, round_):
            task.run(store, config)
    summary = finish_components(store, config, N_INPUTS)
    assert summary["components_rounds"] == 2  # the shuffle, one step that changes nothing
    states = [json.loads(store.read_text(layout.components_done(r, 0)))["state"]
              for r in range(scheduled_rounds(config))]
    assert states == ["shuffled", "unchanged"] + ["idle"] * (scheduled_rounds(config) - 2)
    assert [settled_by(store, config, r) for r in range(4)] == [False, True, True, True]
    idle_files = [rel for rel in store.list("work/dedup/components/") if "/round-003/" in rel]
    assert sorted(idle_files) == sorted(layout.components_done(3, t) for t in range(2))  # its markers only


def test_a_graph_not_settled_within_max_rounds_fails_naming_the_setting(tmp_path):
    config = _config(2, max_rounds=4)
    _write_edge_files(tmp_path, config, _chain(4096, shuffled=True))
    with pytest.raises(InputError, match=r"did not settle within components.max_rounds = 4 rounds") as caught:
        _run_rounds(tmp_path, config)
    assert "\n" not in str(caught.value)
    with pytest.raises(InputError, match=r"components tasks not finished|components are not settled yet"):
        finish_components(LocalStore(tmp_path), config, N_INPUTS)
    assert not (tmp_path / layout.DEDUP_STATS).exists()


def test_the_summary_waits_for_the_last_round(tmp_path):
    """Parts that settled early have written their labels; the summary waits until every part has."""
    config = _config(2)
    path = np.arange(64, dtype=np.uint64)  # input 0's documents: task 0's part
    chain = _edges(np.stack([path[1:], path[:-1]], axis=1), KIND_NEAR)
    stars = _edges(np.array([[(4 << 32) | 9, (4 << 32) | 8]], dtype=np.uint64), KIND_URL)  # task 1's, settled
    _write_edge_files(tmp_path, config, np.concatenate([chain, stars]))
    store = LocalStore(tmp_path)
    for round_ in range(2):
        for task in components_tasks(config, N_INPUTS, round_):
            task.run(store, config)
    assert store.exists(layout.components_stats(1)) and not store.exists(layout.components_stats(0))
    with pytest.raises(InputError, match=r"components tasks not finished: \[0\]"):
        finish_components(store, config, N_INPUTS)
    assert not settled_by(store, config, 1)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@pytest.mark.parametrize("content, message", [
    (b"not an npy file", "is not a dedup edge file"),
    (_npy(np.ones((40, 3), np.uint64))[:-5], "is not a dedup edge file"),  # torn
    (_npy(np.zeros((4, 2), np.uint64)), r"an \(n, 3\) uint64 array expected, got uint64 \(4, 2\)"),
    (_npy(np.zeros((4, 3), np.int32)), r"an \(n, 3\) uint64 array expected, got int32 \(4, 3\)"),
    (_npy(np.array([[2, 1, 7]], np.uint64)), "unknown edge kind 7"),
    (_npy(np.array([[(9 << 32) | 1, 3, KIND_NEAR]], np.uint64)), "names input 9, but the run has 5 input"),
], ids=["garbage", "torn", "shape", "dtype", "kind", "input"])
def test_a_corrupt_edge_file_is_an_input_error(tmp_path, content, message):
    config = _config(2)
    _write_edge_files(tmp_path, config, _random_graph(200, 150))
    (tmp_path / layout.edges(0)).write_bytes(content)
    with pytest.raises(InputError, match=message) as caught:
        _run_rounds(tmp_path, config)
    assert "\n" not in str(caught.value) and layout.edges(0) in str(caught.value)
    assert not (tmp_path / layout.components_done(0, 0)).exists()


def test_a_corrupt_object_between_rounds_is_an_input_error(tmp_path):
    config = _config(2)
    _write_edge_files(tmp_path, config, _random_graph(200, 150))
    store = LocalStore(tmp_path)
    for task in components_tasks(config, N_INPUTS, 0):
        task.run(store, config)
    (tmp_path / layout.components_object(0, 1, 0)).write_bytes(b"PK\x03\x04 torn")
    with pytest.raises(InputError, match="round-000/00001-00000.npz is unreadable"):
        components_tasks(config, N_INPUTS, 1)[0].run(store, config)


def test_a_round_waits_for_the_round_before(tmp_path):
    config = _config(3)
    _write_edge_files(tmp_path, config, _random_graph(200, 150))
    store = LocalStore(tmp_path)
    components_tasks(config, N_INPUTS, 0)[0].run(store, config)
    with pytest.raises(InputError, match=r"components round 0 not finished: tasks \[1, 2\]"):
        components_tasks(config, N_INPUTS, 1)[0].run(store, config)


def test_a_reason_is_the_removed_documents_own_strongest_edge(tmp_path):
    """r's own edges are near-duplicate ones; the content edge of its neighbour y is not r's."""
    g, r, y, x = 1, 2, 3, 4
    edges = np.array([[x, y, KIND_CONTENT], [y, r, KIND_NEAR], [r, g, KIND_NEAR]], dtype=np.uint64)
    config = _config(1)
    _write_edge_files(tmp_path, config, edges)
    summary = _run_rounds(tmp_path, config)
    ids, reasons = load_removed(LocalStore(tmp_path), 0)
    assert dict(zip(ids.tolist(), reasons.tolist())) == {r: KIND_NEAR, y: KIND_CONTENT, x: KIND_CONTENT}
    assert summary["clusters"] == 1 and summary["near_duplicate_groups"] == 1
