"""The combine stage (a shuffle of the dedup keys): a dedup task makes the same requests whatever the
number of inputs and of candidates, finds the edges a plain in-memory computation finds, and a
damaged combined object is a one-line InputError. Partition counts chosen from the inputs' sizes.

The per-input stage is not run here: each input's key file is written with the encoder it uses
(dedup_keys.encode_keys), from synthetic keys and signatures."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math

import numpy as np
import pytest

from lmforge.common.errors import InputError
from lmforge.common.local_store import LocalStore
from lmforge.dataprep import dedup_plan, layout
from lmforge.dataprep.combine import combine_tasks
from lmforge.dataprep.config import DataprepConfig, MinHashConfig
from lmforge.dataprep.dedup_global import (
    KIND_NEAR,
    PartitionPlan,
    group_partition,
    shuffle_plan,
    write_minhash_config,
)
from lmforge.dataprep.dedup_keys import COALESCE_GAP_BYTES, MAX_READ_BYTES, encode_keys, signature_reads
from lmforge.dataprep.minhash import verify_threshold
from lmforge.dataprep.stage_runs import open_run


class CountingStore(LocalStore):
    """A LocalStore that counts each request a remote store would make: every exists, read and write."""

    def __init__(self, root):
        super().__init__(root)
        self.requests: list[tuple[str, str]] = []  # (kind, path)

    def exists(self, rel: str) -> bool:
        self.requests.append(("exists", rel))
        return super().exists(rel)

    def read_bytes(self, rel: str) -> bytes:
        self.requests.append(("read", rel))
        return super().read_bytes(rel)

    def read_range(self, rel: str, start: int, length: int) -> bytes:
        self.requests.append(("read_range", rel))
        return super().read_range(rel, start, length)

    def local_path(self, rel: str):
        self.requests.append(("download", rel))
        return super().local_path(rel)

    def list(self, prefix: str = "") -> list[str]:
        self.requests.append(("list", prefix))
        return super().list(prefix)

    @contextlib.contextmanager
    def open_write(self, rel: str):
        self.requests.append(("write", rel))
        with super().open_write(rel) as fh:
            yield fh


def _minhash(**overrides) -> MinHashConfig:
    # 4 bands x 8 rows of 32 permutations, 2 key ranges per column: 12 partitions, in ranges of 3
    # (the third range mixes band and exact-key partitions)
    settings = {"num_perm": 32, "bands": 4, "rows": 8, "verify_sigmas": 0.0, "partitions_per_band": 2,
                "combine_partitions": 3, "group_objects": 4, "max_pairs_per_bucket": 3}
    return MinHashConfig(**{**settings, **overrides})


def _write_inputs(store: LocalStore, config: MinHashConfig, n_inputs: int, docs: int = 12, seed: int = 0) -> dict:
    """Each input's key file: `docs` documents of random keys, the first 2 x partitions_per_band
    of them repeated in every input (the same keys, a signature edited more or less per input), so
    every partition of every input group has a run of equal keys. Returns what was written."""
    plan = PartitionPlan.from_config(config)
    columns, ppb = plan.key_bands + 2, plan.partitions_per_band
    rng = np.random.default_rng(seed)
    planted = 2 * ppb
    shared_keys = rng.integers(0, 2**62, size=(planted, columns), dtype=np.uint64) * np.uint64(ppb)
    shared_keys += (np.arange(planted, dtype=np.uint64) % np.uint64(ppb))[:, None]  # doc j: key range j % ppb
    shared_signatures = rng.integers(0, 2**32, size=(planted, config.num_perm), dtype=np.uint32)
    written = {"ids": [], "keys": [], "signatures": []}
    for i in range(n_inputs):
        ids = (np.uint64(i) << np.uint64(32)) | np.arange(docs, dtype=np.uint64)
        keys = rng.integers(0, 2**63, size=(docs, columns), dtype=np.uint64)
        keys[:planted] = shared_keys
        signatures = rng.integers(0, 2**32, size=(docs, config.num_perm), dtype=np.uint32)
        signatures[:planted] = shared_signatures
        edited = (i % 4) * config.num_perm // 8  # estimated Jaccard to the shared one: 1, 7/8, 3/4, 5/8
        signatures[:planted, :edited] = rng.integers(0, 2**32, size=(planted, edited), dtype=np.uint32)
        store.write_bytes(layout.dedup_keys(i), encode_keys(ids, keys, plan.sections(), ppb, signatures, plan.signed))
        for name, values in zip(written, (ids, keys, signatures)):
            written[name].append(values)
    return {name: np.concatenate(values) for name, values in written.items()}


def _combine(store, config: MinHashConfig, n_inputs: int) -> None:
    run_config = DataprepConfig(minhash=config)
    for task in combine_tasks(run_config, n_inputs):
        task.run(store, run_config)


def _oracle_edges(written: dict, config: MinHashConfig, partition: int) -> np.ndarray:
    """Partition p's edges, computed in memory from every document at once: sort its documents by
    (key, id); in each run of a key, link a document to the first (exact keys) or to the first of the
    run's first max_pairs_per_bucket whose signature agrees in ≥ verify_threshold of its positions."""
    plan = PartitionPlan.from_config(config)
    column, kind, key_slice = plan.describe(partition)
    ids, keys, signatures = written["ids"], written["keys"][:, column], written["signatures"]
    mine = sorted((int(keys[k]), int(ids[k]), k) for k in range(len(ids))
                  if int(keys[k]) % plan.partitions_per_band == key_slice)
    edges = []
    for _, run in itertools.groupby(mine, key=lambda member: member[0]):
        run = list(run)
        for j in range(1, len(run)):
            if kind != KIND_NEAR:
                edges.append((run[j][1], run[0][1], kind))
                continue
            for earlier in run[: min(j, config.max_pairs_per_bucket)]:
                if np.mean(signatures[run[j][2]] == signatures[earlier[2]]) >= verify_threshold(config):
                    edges.append((run[j][1], earlier[1], kind))
                    break
    return np.array(edges, dtype=np.uint64).reshape(-1, 3)


# ------------------------------------------------------------------ requests per dedup task


def test_a_dedup_task_makes_the_same_requests_at_1x_4x_and_16x_inputs(tmp_path):
    """One header and one triples read per input group's object, one signature read per object
    with a candidate (all of them here), an exists and a write: the same at 4, 16 and 64 inputs,
    while the candidates grow with the inputs."""
    config = _minhash()
    groups = config.group_objects
    requests, found = {}, {}
    for scale in (1, 4, 16):
        n_inputs = 4 * scale
        store = CountingStore(tmp_path / f"x{scale}")
        write_minhash_config(store, config)
        _write_inputs(store, config, n_inputs)
        _combine(store, config, n_inputs)
        counts = []
        for p in range(PartitionPlan.from_config(config).count):
            store.requests.clear()
            edges = group_partition(store, config, n_inputs, p)
            counts.append(len(store.requests))
            assert {rel for kind, rel in store.requests if kind == "read_range"} == \
                {layout.combined_keys(g, p // config.combine_partitions) for g in range(groups)}
            found[scale] = found.get(scale, 0) + edges
        requests[scale] = counts
    plan = PartitionPlan.from_config(config)
    assert requests[1] == requests[4] == requests[16]
    assert requests[1] == [2 + (3 if p < plan.signed else 2) * groups for p in range(plan.count)]
    assert found[1] < found[4] < found[16]  # runs grow with the inputs; the requests do not


def test_a_combine_task_reads_two_ranges_of_each_input_of_its_group(tmp_path):
    config = _minhash()
    store = CountingStore(tmp_path)
    write_minhash_config(store, config)
    _write_inputs(store, config, 10)
    run_config = DataprepConfig(minhash=config)
    tasks = combine_tasks(run_config, 10)
    shuffle = shuffle_plan(config, 10)
    assert [len(group) for group in shuffle.groups] == [2, 3, 2, 3]  # contiguous, balanced
    assert len(tasks) == len(shuffle.groups) * shuffle.n_ranges == 4 * 4
    for task in tasks:
        store.requests.clear()
        task.run(store, run_config)
        inputs = range(task.first_input, task.stop_input)
        reads = [rel for kind, rel in store.requests if kind == "read_range"]
        assert sorted(reads) == sorted(layout.dedup_keys(i) for i in inputs for _ in range(2))
        assert [kind for kind, _ in store.requests].count("write") == 1
        assert len(store.requests) == 2 * len(inputs) + 2  # and the exists of its own object


# ------------------------------------------------------------------ edges


@pytest.mark.parametrize("groups", [1, 2, 5])
def test_edges_are_those_of_an_in_memory_computation(tmp_path, groups):
    config = _minhash(group_objects=groups)
    store = LocalStore(tmp_path)
    write_minhash_config(store, config)
    written = _write_inputs(store, config, 7, docs=15, seed=groups)
    _combine(store, config, 7)
    near = exact = unverified = 0
    possible = 2 * (7 - 1)  # a band partition: 2 planted documents in each of 7 inputs, 2 runs of 7
    for p in range(PartitionPlan.from_config(config).count):
        group_partition(store, config, 7, p)
        edges = np.load(tmp_path / layout.edges(p))
        expected = _oracle_edges(written, config, p)
        assert edges.dtype == expected.dtype and np.array_equal(edges, expected), p
        if PartitionPlan.from_config(config).describe(p)[1] == KIND_NEAR:
            near += len(edges)
            unverified += possible - len(edges)
        else:
            exact += len(edges)
    assert near and exact and unverified > 0  # verification dropped some candidates


def test_an_input_without_documents_adds_nothing(tmp_path):
    config = _minhash(group_objects=2)
    store = LocalStore(tmp_path)
    write_minhash_config(store, config)
    written = _write_inputs(store, config, 4)
    plan = PartitionPlan.from_config(config)
    no_rows = np.zeros((0, plan.key_bands + 2), np.uint64)
    store.write_bytes(layout.dedup_keys(2), encode_keys(np.zeros(0, np.uint64), no_rows, plan.sections(), 2,
                                                        np.zeros((0, config.num_perm), np.uint32), plan.signed))
    kept = (written["ids"] >> np.uint64(32)) != 2
    written = {name: values[kept] for name, values in written.items()}
    _combine(store, config, 4)
    for p in range(plan.count):
        group_partition(store, config, 4, p)
        assert np.array_equal(np.load(tmp_path / layout.edges(p)), _oracle_edges(written, config, p)), p


def test_an_input_an_older_version_finished_combines_to_the_same_object(tmp_path):
    """The key file without signatures (at its old path) and the signature file give the same object."""
    config = _minhash(group_objects=1, combine_partitions=12)
    plan = PartitionPlan.from_config(config)
    roots = {name: tmp_path / name for name in ("new", "old")}
    for root in roots.values():
        write_minhash_config(LocalStore(root), config)
        written = _write_inputs(LocalStore(root), config, 3)
    old = roots["old"]
    ids, keys, signatures = (written[name][12:24] for name in ("ids", "keys", "signatures"))  # input 1
    (old / layout.dedup_keys(1)).unlink()
    (old / layout.legacy_dedup_keys(1)).write_bytes(encode_keys(ids, keys, plan.sections(), 2))
    buffer = io.BytesIO()
    np.save(buffer, signatures)
    (old / layout.signatures(1)).write_bytes(buffer.getvalue())
    for root in roots.values():
        _combine(LocalStore(root), config, 3)
    assert (old / layout.combined_keys(0, 0)).read_bytes() == (roots["new"] / layout.combined_keys(0, 0)).read_bytes()


# ------------------------------------------------------------------ damaged objects


@pytest.fixture
def combined(tmp_path):
    config = _minhash(group_objects=2)
    store = LocalStore(tmp_path)
    write_minhash_config(store, config)
    _write_inputs(store, config, 4)
    _combine(store, config, 4)
    return store, config


@pytest.mark.parametrize("damage", ["truncated keys", "truncated signatures", "torn", "offsets"])
def test_a_damaged_combined_object_is_a_one_line_input_error(combined, damage):
    """A task finds the damage in what it reads: its header, its section's triples, its candidates' rows."""
    store, config = combined
    last = 5  # the last partition of range 1 (partitions 3-5, band partitions): its section ends the object
    path = store.root / layout.combined_keys(1, 1)
    data = path.read_bytes()
    start, end = np.frombuffer(data[3 * 8 : 5 * 8], "<u8").tolist()  # its section
    n = (end - start) // (24 + 4 * config.num_perm)
    if damage == "truncated keys":
        path.write_bytes(data[: start + 24 * n - 8])
    elif damage == "truncated signatures":  # its first row, a planted document's, is a candidate
        path.write_bytes(data[: start + 24 * n + 10])
    elif damage == "torn":
        path.write_bytes(data[:12])
    else:  # the section offsets out of order
        words = np.frombuffer(data[:40], "<u8").copy()  # 3 sections: their count and 4 offsets
        words[3], words[4] = words[4], words[3]
        path.write_bytes(words.tobytes() + data[40:])
    with pytest.raises(InputError) as error:
        group_partition(store, config, 4, last)
    assert "\n" not in str(error.value) and layout.combined_keys(1, 1) in str(error.value)
    assert not (store.root / layout.edges(last)).exists()


def test_dedup_before_the_combine_stage_says_so(tmp_path):
    config = _minhash()
    store = LocalStore(tmp_path)
    write_minhash_config(store, config)
    _write_inputs(store, config, 4)
    with pytest.raises(InputError, match="run the combine stage before dedup"):
        group_partition(store, config, 4, 0)


def test_a_truncated_key_file_fails_its_combine_task_with_an_input_error(tmp_path):
    config = _minhash()
    store = LocalStore(tmp_path)
    write_minhash_config(store, config)
    _write_inputs(store, config, 4)
    path = tmp_path / layout.dedup_keys(2)
    path.write_bytes(path.read_bytes()[:-7])
    run_config = DataprepConfig(minhash=config)
    task = next(t for t in combine_tasks(run_config, 4) if t.first_input <= 2 < t.stop_input and t.part_range == 3)
    with pytest.raises(InputError, match="truncated") as error:
        task.run(store, run_config)
    assert "\n" not in str(error.value)
    assert not (tmp_path / task.done_marker).exists()


# ------------------------------------------------------------------ coalesced signature reads


def test_signature_reads_are_few_whatever_the_candidates():
    row = 512
    dense = np.arange(0, 20_000, 2)  # 10,000 candidates, every other row
    assert len(signature_reads(dense, row)) == math.ceil(20_000 * row / MAX_READ_BYTES)
    sparse = np.arange(0, 1_000_000, 10_000)  # rows 5 MB apart: one read each, whole rows
    assert signature_reads(sparse, row) == [(p, p + 1) for p in sparse.tolist()]
    section_bytes = 1_000_000 * row
    assert len(signature_reads(sparse, row)) <= section_bytes // COALESCE_GAP_BYTES + 1


# ------------------------------------------------------------------ counts chosen from the data


def _sized_inputs(directory, sizes: list[int]) -> list[str]:
    """Inputs of the given sizes that take no disk (sparse): only their listed sizes are read here."""
    directory.mkdir()
    paths = []
    for i, size in enumerate(sizes):
        path = directory / f"in-{i:02d}.warc.wet.gz"
        with open(path, "wb") as fh:
            fh.truncate(size)
        paths.append(str(path))
    return paths


def test_auto_counts_are_chosen_from_the_inputs_sizes_and_recorded(tmp_path):
    sizes = [1 << 30] * 15 + [2 << 30]
    inputs = _sized_inputs(tmp_path / "inputs", sizes)
    budget = 32 << 20  # half of task_memory_bytes
    config = DataprepConfig.model_validate({"minhash": {"task_memory_bytes": 2 * budget, "group_objects": 8}})
    run = open_run(str(tmp_path / "out"), config, inputs)
    bands = PartitionPlan.from_config(MinHashConfig(partitions_per_band=1)).key_bands
    # a dedup task: 80 bytes per document of its partition, a quarter of them candidates with their
    # 128 x 4-byte signatures; one document per 1,800 input bytes
    docs = sum(sizes) / 1800
    expected_ppb = math.ceil(docs * (80 + 0.25 * 512) / budget)
    # a combine task of the largest group (inputs 14 and 15): its documents' rows in each partition
    per_partition = (3 << 30) / 1800 / expected_ppb * (24 + 512)
    expected_combine = math.floor(budget / per_partition)
    assert expected_ppb > 1 and expected_combine > 1
    recorded = json.loads((tmp_path / "out" / layout.MINHASH_CONFIG).read_text())
    assert (recorded["partitions_per_band"], recorded["combine_partitions"]) == (expected_ppb, expected_combine)
    assert recorded["input_bytes"] == sum(sizes) and recorded["largest_group_input_bytes"] == 3 << 30
    assert run.config.minhash.partitions_per_band == expected_ppb
    assert PartitionPlan.from_config(run.config.minhash).count == (bands + 2) * expected_ppb
    # every later process sees the same counts: a global stage opened from the output alone, a worker
    # given the config again, and the combine stage's task list
    assert open_run(str(tmp_path / "out"), None, None).config.minhash == run.config.minhash
    assert open_run(str(tmp_path / "out"), config, inputs).config.minhash == run.config.minhash
    tasks = combine_tasks(run.config, len(inputs))
    assert len(tasks) == 8 * math.ceil((bands + 2) * expected_ppb / expected_combine)


def test_fixed_counts_still_work_and_must_match_the_record(tmp_path):
    inputs = _sized_inputs(tmp_path / "inputs", [1 << 30] * 3)
    config = DataprepConfig.model_validate({"minhash": {"partitions_per_band": 3, "combine_partitions": 2}})
    run = open_run(str(tmp_path / "out"), config, inputs)
    assert (run.config.minhash.partitions_per_band, run.config.minhash.combine_partitions) == (3, 2)
    other = DataprepConfig.model_validate({"minhash": {"partitions_per_band": 4, "combine_partitions": 2}})
    with pytest.raises(InputError, match="partitions_per_band: 3 recorded, 4 given"):
        write_minhash_config(LocalStore(tmp_path / "out"), other.minhash)


def test_unknown_sizes_count_as_the_known_ones_mean():
    assert dedup_plan.known_sizes([100, None, 300]) == [100, 200, 300]
    assert dedup_plan.known_sizes([None]) == [dedup_plan.UNKNOWN_INPUT_BYTES]
