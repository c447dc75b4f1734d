"""Dedup building blocks: keys, MinHash, candidate verification, components, partitions, and
what a partition reads of the per-input stage's output."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys

import numpy as np
import pytest

from lmforge.common.errors import InputError
from lmforge.common.local_store import LocalStore
from lmforge.dataprep import layout
from lmforge.dataprep.combine import combine_tasks
from lmforge.dataprep.components import components_tasks, finish_components, settled_by
from lmforge.dataprep.config import DataprepConfig, MinHashConfig
from lmforge.dataprep.dedup_global import (
    KIND_CONTENT,
    KIND_NEAR,
    KIND_URL,
    PartitionPlan,
    _verified_pairs,
    check_minhash_config,
    group_partition,
    key_format,
    load_removed,
    shuffle_plan,
    write_minhash_config,
)
from lmforge.dataprep.dedup_keys import read_sections
from lmforge.dataprep.document import Document
from lmforge.dataprep.minhash import MinHasher, estimated_jaccard, lsh_params, verify_threshold
from lmforge.dataprep.steps.dedup import ExactDedupFilter, UrlDedupFilter, content_key, normalize_url, url_key
from lmforge.dataprep.worker import process_input
from tests.dataprep.wet_records import gz_member, wet_record

VOCAB = [f"word{i}" for i in range(5000)]


def shingle_jaccard(a: str, b: str, n: int = 5) -> float:
    def grams(text):
        words = text.lower().split()
        return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}

    x, y = grams(a), grams(b)
    return len(x & y) / len(x | y)


@pytest.mark.parametrize("a, b", [
    ("https://www.Example.com/a/", "https://example.com/a"),
    ("http://example.com:80/a#frag", "http://example.com/a"),
    ("https://example.com/a?utm_source=x&b=2&a=1", "https://example.com/a?a=1&b=2"),
])
def test_equivalent_urls_normalize_alike(a, b):
    assert normalize_url(a) == normalize_url(b) and url_key(a) == url_key(b)


def test_different_urls_stay_different():
    assert url_key("https://example.com/a") != url_key("https://example.com/b")
    assert url_key("https://example.com/a?id=1") != url_key("https://example.com/a?id=2")
    assert normalize_url("not a url at all") == "not a url at all"


def test_keys_are_stable_across_processes():
    code = ("from lmforge.dataprep.steps.dedup import url_key, content_key;"
            "print(url_key('https://x.org/p'), content_key('Hello  World'))")
    outputs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
               for _ in range(2)}
    assert outputs == {f"{url_key('https://x.org/p')} {content_key('hello world')}\n"}


def test_local_dedup_steps_drop_repeats_and_record_keys():
    docs = [Document(0, "https://a.org/x", "Same text here."), Document(1, "https://a.org/x/", "Other text."),
            Document(2, "https://b.org/", "same   TEXT here."), Document(3, "https://c.org/", "Fresh.")]
    url_step, exact_step = UrlDedupFilter(), ExactDedupFilter()
    kept = list(exact_step.run(url_step.run(docs)))
    assert [d.doc_id for d in kept] == [0, 3]
    assert url_step.stats.dropped == {"duplicate_url": 1} and exact_step.stats.dropped == {"duplicate_content": 1}
    assert kept[0].metadata["content_key"] == content_key("same text here.")


def test_minhash_estimates_jaccard():
    rng = random.Random(0)
    hasher = MinHasher(MinHashConfig())
    for _ in range(20):
        a = " ".join(rng.choice(VOCAB) for _ in range(400))
        words = a.split()
        for _ in range(rng.randint(0, 60)):
            words[rng.randrange(len(words))] = rng.choice(VOCAB)
        b = " ".join(words)
        true = shingle_jaccard(a, b)
        estimate = float(estimated_jaccard(hasher.signature(a), hasher.signature(b)))
        assert abs(estimate - true) < 0.15, (true, estimate)


def test_lsh_params_favour_recall_and_respect_explicit_values():
    bands, rows = lsh_params(MinHashConfig())
    assert bands * rows <= 128
    p = 1 - (1 - 0.85**rows) ** bands
    assert p >= 0.999  # candidates are verified afterwards, so be generous here
    assert lsh_params(MinHashConfig(bands=8, rows=16)) == (8, 16)
    with pytest.raises(ValueError):
        MinHashConfig(bands=20, rows=8)


def test_verify_threshold_allows_for_estimator_noise():
    assert verify_threshold(MinHashConfig()) == pytest.approx(0.8 - 3 * (0.8 * 0.2 / 128) ** 0.5)
    assert verify_threshold(MinHashConfig(verify_sigmas=0)) == 0.8
    assert verify_threshold(MinHashConfig(num_perm=512)) > verify_threshold(MinHashConfig())


def test_verification_links_only_true_near_duplicates():
    hasher = MinHasher(MinHashConfig())
    rng = random.Random(1)
    base = [rng.choice(VOCAB) for _ in range(300)]
    near = list(base)
    near[150] = "changed"
    other = [rng.choice(VOCAB) for _ in range(300)]
    sigs = np.stack([hasher.signature(" ".join(w)) for w in (base, other, near)])
    members = np.array([10, 11, 12], dtype=np.uint64)
    assert _verified_pairs(members, sigs, 0.8, 64) == [(12, 10)]


def test_partition_plan_covers_bands_slices_and_exact_keys():
    plan = PartitionPlan(bands=4, partitions_per_band=3)
    described = [plan.describe(p) for p in range(plan.count)]
    assert plan.count == 18
    assert described[:3] == [(0, KIND_NEAR, 0), (0, KIND_NEAR, 1), (0, KIND_NEAR, 2)]
    assert described[-6:] == [(4, KIND_URL, 0), (4, KIND_URL, 1), (4, KIND_URL, 2),
                              (5, KIND_CONTENT, 0), (5, KIND_CONTENT, 1), (5, KIND_CONTENT, 2)]


def test_without_near_duplicate_dedup_the_exact_keys_are_still_the_url_and_content_columns():
    """minhash.enabled=false drops the band partitions, not the band-key columns the per-input stage writes."""
    plan = PartitionPlan.from_config(MinHashConfig(enabled=False, partitions_per_band=1))
    bands, _ = lsh_params(MinHashConfig())
    assert plan.count == 2
    assert [plan.describe(p) for p in range(2)] == [(bands, KIND_URL, 0), (bands + 1, KIND_CONTENT, 0)]


def test_signatures_from_another_config_are_refused(tmp_path):
    store = LocalStore(tmp_path)
    write_minhash_config(store, MinHashConfig())
    check_minhash_config(store, MinHashConfig())
    with pytest.raises(InputError, match="another MinHash config"):
        check_minhash_config(store, MinHashConfig(num_perm=64))
    assert json.loads((tmp_path / "work" / "minhash_config.json").read_text())["num_perm"] == 128


# ------------------------------------------------------------ partitions read only their own keys

_NO_FILTERS = {"pipeline": ["url_dedup", "exact_dedup"]}


class _RecordingStore(LocalStore):
    """A LocalStore that records every (path, bytes) it reads, and each ranged read's request."""

    def __init__(self, root):
        super().__init__(root)
        self.reads: list[tuple[str, int]] = []
        self.whole: list[str] = []  # paths read whole
        self.ranges: list[tuple[str, int, int]] = []  # (path, start, length asked for)

    def read_bytes(self, rel: str) -> bytes:
        data = super().read_bytes(rel)
        self.reads.append((rel, len(data)))
        self.whole.append(rel)
        return data

    def read_range(self, rel: str, start: int, length: int) -> bytes:
        data = super().read_range(rel, start, length)
        self.reads.append((rel, len(data)))
        self.ranges.append((rel, start, length))
        return data

    def local_path(self, rel: str):
        self.reads.append((rel, (self.root / rel).stat().st_size))
        self.whole.append(rel)
        return super().local_path(rel)


def _dedup_corpus(base) -> list[str]:
    """Three inputs: near duplicates (one close, one looser), an exact copy and a repeated URL
    across inputs, and unrelated documents."""
    rng = random.Random(7)

    def text(n=300):
        return [rng.choice(VOCAB) for _ in range(n)]

    def edited(words, changes):
        words = list(words)
        for k in range(changes):
            words[(k * 37 + 11) % len(words)] = f"changed{k}"
        return words

    close, loose, copied, other = text(), text(), text(), text()
    docs = [
        [("https://a.org/close", close), ("https://a.org/loose", loose), ("https://a.org/copied", copied),
         ("https://shared.org/page", text())],
        [("https://b.org/close", edited(close, 2)), ("https://b.org/loose", edited(loose, 8)),
         ("https://b.org/copied", copied), ("https://shared.org/page/", text()), ("https://b.org/x", text())],
        [("https://c.org/y", other), ("https://c.org/z", text())],
    ]
    paths = []
    for i, records in enumerate(docs):
        path = base / f"in-{i}.warc.wet.gz"
        path.write_bytes(b"".join(gz_member(wet_record(url, " ".join(words).encode())) for url, words in records))
        paths.append(str(path))
    return paths


def _prepare(root, paths, config, only=None) -> list:
    """The per-input stage; `config` gets the counts the run chose, as stage_runs.open_run gives them."""
    store = LocalStore(root)
    config.minhash = write_minhash_config(store, config.minhash)
    return [process_input(store, config, uri, i) for i, uri in enumerate(paths) if only is None or i in only]


def _edges(root, config, n_inputs) -> dict[int, bytes]:
    """The combine stage, then every dedup partition; each partition's edges file."""
    store = LocalStore(root)
    for task in combine_tasks(config, n_inputs):
        task.run(store, config)
    for p in range(PartitionPlan.from_config(config.minhash).count):
        group_partition(store, config.minhash, n_inputs, p)
    return {p: (root / layout.edges(p)).read_bytes() for p in range(PartitionPlan.from_config(config.minhash).count)}


@pytest.fixture(scope="module")
def dedup_inputs(tmp_path_factory):
    return _dedup_corpus(tmp_path_factory.mktemp("dedup-inputs"))


def test_group_partition_reads_only_its_own_section_of_each_combined_object(dedup_inputs, tmp_path):
    config = DataprepConfig.model_validate({**_NO_FILTERS, "minhash": {"partitions_per_band": 2,
                                                                      "combine_partitions": 5}})
    _prepare(tmp_path, dedup_inputs, config)
    n = len(dedup_inputs)
    _edges(tmp_path, config, n)  # the combined objects (and edges, removed below)
    plan, shuffle, fmt = PartitionPlan.from_config(config.minhash), shuffle_plan(config.minhash, n), \
        key_format(config.minhash)
    store = _RecordingStore(tmp_path)
    with_runs, without_runs, kinds_seen = [], [], set()
    for p in range(plan.count):
        (tmp_path / layout.edges(p)).unlink()
        _, kind, _ = plan.describe(p)
        store.reads.clear()
        store.whole.clear()
        store.ranges.clear()
        edges = group_partition(store, config.minhash, n, p)
        r = shuffle.range_of(p)
        objects = {layout.combined_keys(g, r) for g in range(len(shuffle.groups))}
        first = shuffle.partition_range(r).start
        sections = [read_sections(LocalStore(tmp_path), rel, fmt, range(p - first, p - first + 1), first)[0]
                    for rel in sorted(objects)]
        assert {rel for rel, _ in store.reads} == objects, p  # no per-input file, no other range's object
        index, row = p - first, 24 + (4 * config.minhash.num_perm if kind == KIND_NEAR else 0)
        signature_reads = []
        for rel, section in zip(sorted(objects), sections):
            start = int(np.frombuffer((tmp_path / rel).read_bytes()[(index + 1) * 8 : (index + 2) * 8], "<u8")[0])
            reads = sorted((at, length) for path, at, length in store.ranges if path == rel)
            # the header up to its section's end offset, then the section's triples (when it has any) ...
            expected = [(0, (index + 3) * 8)] + ([(start, 24 * len(section))] if len(section) else [])
            assert reads[: len(expected)] == expected, (p, rel, reads)
            # ... then, in a band partition, whole signature rows of this section, and only those
            signatures_at, end = start + 24 * len(section), start + row * len(section)
            for at, length in reads[len(expected) :]:
                assert signatures_at <= at and at + length <= end and (at - signatures_at) % (row - 24) == 0
                assert length % (row - 24) == 0
                signature_reads.append(length)
        keys = np.concatenate([section.triples[:, 1] for section in sections])
        has_run = len(np.unique(keys)) < len(keys)
        if kind == KIND_NEAR and has_run:
            with_runs.append(p)
            assert signature_reads, p
        else:
            if kind == KIND_NEAR:
                without_runs.append(p)
            assert not signature_reads, p  # no candidate, no signature read
        assert not store.whole, store.whole
        if edges:
            kinds_seen.add(kind)
    assert with_runs and without_runs
    assert kinds_seen == {KIND_NEAR, KIND_URL, KIND_CONTENT}


def test_key_files_give_the_edges_the_whole_key_matrix_gave(dedup_inputs, tmp_path):
    """An input finished before the key files existed (only the whole key matrix) still dedups,
    to the same edges."""
    config = DataprepConfig.model_validate({**_NO_FILTERS, "minhash": {"partitions_per_band": 2}})
    n = len(dedup_inputs)
    _prepare(tmp_path / "new", dedup_inputs, config)
    _prepare(tmp_path / "old", dedup_inputs, config)
    # input 1 as an older version left it: the whole key matrix and the signature file, no key file
    plan = PartitionPlan.from_config(config.minhash)
    sections = read_sections(LocalStore(tmp_path / "old"), layout.dedup_keys(1), key_format(config.minhash),
                             range(plan.count))
    n_docs = sum(len(section) for section in sections[: plan.partitions_per_band])  # column 0's slices
    ids = np.zeros(n_docs, dtype=np.uint64)
    matrix = np.zeros((n_docs, plan.key_bands + 2), dtype=np.uint64)
    signatures = np.zeros((n_docs, config.minhash.num_perm), dtype=np.uint32)
    for p, section in enumerate(sections):
        rows = section.triples[:, 2].astype(np.int64)
        ids[rows] = section.triples[:, 0]
        matrix[rows, plan.describe(p)[0]] = section.triples[:, 1]
        if section.signatures is not None:
            signatures[rows] = section.signatures
    buffer = io.BytesIO()
    np.savez(buffer, doc_ids=ids, keys=matrix)
    (tmp_path / "old" / layout.minhash(1)).write_bytes(buffer.getvalue())
    buffer = io.BytesIO()
    np.save(buffer, signatures)
    (tmp_path / "old" / layout.signatures(1)).write_bytes(buffer.getvalue())
    (tmp_path / "old" / layout.dedup_keys(1)).unlink()
    assert _edges(tmp_path / "old", config, n) == _edges(tmp_path / "new", config, n)


def test_an_input_rerun_after_a_kill_rewrites_its_key_file(dedup_inputs, tmp_path):
    config = DataprepConfig.model_validate(_NO_FILTERS)
    n = len(dedup_inputs)
    _prepare(tmp_path / "ref", dedup_inputs, config)
    reference = _edges(tmp_path / "ref", config, n)
    out = tmp_path / "killed"
    _prepare(out, dedup_inputs, config, only={0, 1})
    # input 1 killed after writing some of its key files, before its completion marker
    (out / layout.input_done(1)).unlink()
    (out / layout.dedup_keys(1)).write_bytes(b"torn")
    kept_before = (out / layout.dedup_keys(0)).stat().st_mtime_ns
    results = _prepare(out, dedup_inputs, config)
    assert [r.skipped for r in results] == [True, False, False]
    assert (out / layout.dedup_keys(0)).stat().st_mtime_ns == kept_before
    assert _edges(out, config, n) == reference
    assert sum(np.load(out / layout.edges(p)).shape[0] for p in reference) > 0


def test_exact_dedup_without_near_duplicate_dedup_finds_the_url_and_content_edges(dedup_inputs, tmp_path):
    """With minhash.enabled=false the URL and content partitions read their own key columns, and find
    the edges they find beside near-duplicate dedup (not band-key collisions named duplicate URLs)."""
    on = DataprepConfig.model_validate(_NO_FILTERS)
    off = DataprepConfig.model_validate({**_NO_FILTERS, "minhash": {"enabled": False}})
    n = len(dedup_inputs)
    _prepare(tmp_path / "on", dedup_inputs, on)
    _prepare(tmp_path / "off", dedup_inputs, off)
    plan = PartitionPlan.from_config(on.minhash)
    exact = [edges for p, edges in _edges(tmp_path / "on", on, n).items() if plan.describe(p)[1] != KIND_NEAR]
    assert list(_edges(tmp_path / "off", off, n).values()) == exact
    assert all(len(np.load(io.BytesIO(edges))) for edges in exact)  # the corpus has a copy and a repeated URL


def _components(root, config: DataprepConfig, n: int, rounds: int | None = None) -> dict | None:
    """The components stage's rounds (every one, or the first `rounds`), then the summary."""
    store = LocalStore(root)
    for r in range(config.components.max_rounds if rounds is None else rounds):
        for task in components_tasks(config, n, r):
            task.run(store, config)
        if settled_by(store, config, r):
            break
    return finish_components(store, config, n) if rounds is None else None


def test_components_write_each_inputs_removed_ids_apart(dedup_inputs, tmp_path):
    """Later tasks on input i read only layout.removed(i): it holds exactly that input's removals."""
    config = DataprepConfig.model_validate({**_NO_FILTERS, "minhash": {"partitions_per_band": 2}})
    n = len(dedup_inputs)
    _prepare(tmp_path, dedup_inputs, config)
    _edges(tmp_path, config, n)
    summary = _components(tmp_path, config, n)
    per_input = [load_removed(LocalStore(tmp_path), i) for i in range(n)]
    for i, (ids, reasons) in enumerate(per_input):
        assert len(ids) == len(reasons)
        assert ((ids >> np.uint64(32)) == i).all(), i
    assert sum(len(ids) for ids, _ in per_input) == summary["removed_total"] > 0
    assert len(per_input[0][0]) == 0 and len(per_input[1][0]) >= 4  # the first copy of each survives


@pytest.mark.parametrize("tasks", [2, 5])
def test_components_over_several_tasks_remove_what_one_task_removes(dedup_inputs, tmp_path, tasks):
    """Components tasks over shares of the nodes find the same clusters, survivors and reasons as
    one task over every edge."""
    n = len(dedup_inputs)
    results = {}
    for k in (1, tasks):
        config = DataprepConfig.model_validate({**_NO_FILTERS, "minhash": {"partitions_per_band": 2},
                                                "components": {"tasks": k}})
        root = tmp_path / f"tasks-{k}"
        _prepare(root, dedup_inputs, config)
        _edges(root, config, n)
        summary = _components(root, config, n)
        removed = [tuple(np.concatenate(load_removed(LocalStore(root), i)).tolist()) for i in range(n)]
        results[k] = ({key: v for key, v in summary.items() if key != "components_tasks"}, removed)
    assert results[1] == results[tasks]
    assert results[1][0]["removed_total"] > 0


def test_the_summary_waits_for_every_round(dedup_inputs, tmp_path):
    config = DataprepConfig.model_validate({**_NO_FILTERS, "minhash": {"partitions_per_band": 2},
                                            "components": {"tasks": 3}})
    _prepare(tmp_path, dedup_inputs, config)
    _edges(tmp_path, config, len(dedup_inputs))
    _components(tmp_path, config, len(dedup_inputs), rounds=1)  # the edge shuffle only
    with pytest.raises(InputError, match=r"components tasks not finished|not settled"):
        finish_components(LocalStore(tmp_path), config, len(dedup_inputs))
    assert not (tmp_path / layout.DEDUP_STATS).exists()
