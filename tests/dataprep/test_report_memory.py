"""The report task's memory and page stay the same size however many inputs a run had: the real
report code (report.write_report) over synthetic per-input stats files of 64 and of 16 × 64
inputs, every other file it reads written as the stages write them (write_manifest, the token
indexes)."""

from __future__ import annotations

import json
import random
import tracemalloc

import pytest

from lmforge.common.local_store import LocalStore
from lmforge.common.shard_index import parse_manifest, split_totals
from lmforge.dataprep import layout
from lmforge.dataprep.config import DataprepConfig
from lmforge.dataprep.document import Document, make_doc_id
from lmforge.dataprep.parquet_io import ArrowRowWriter
from lmforge.dataprep.report import write_report
from lmforge.dataprep.report_tasks import FULL_ROWS, MAX_ERROR_ROWS, NOTABLE, BoundedSample, TaskSummary
from lmforge.dataprep.run import Run
from lmforge.dataprep.shard_writer import partitions, write_manifest
from lmforge.dataprep.stats import StepStats
from lmforge.dataprep.tokenize import TOKEN_INDEX_SCHEMA

BASE_INPUTS = 64  # above FULL_ROWS: the tasks are summarised at both sizes
DOCS = 40  # records per input
ERROR_EVERY = 3  # inputs 0, 3, 6, ... could not be opened: more than MAX_ERROR_ROWS at either size
TOKENIZER = {"path": None, "sha256": "ab" * 32, "vocab_size": 8192, "eot_token": "<|endoftext|>", "eot_id": 0,
             "trained": True, "sample_bytes": 1 << 20}


def _step(name: str, input_index: int, docs_in: int, dropped: int, rng: random.Random) -> StepStats:
    stats = StepStats(name, docs_in=docs_in, docs_out=docs_in - dropped, bytes_in=docs_in * 3000,
                      bytes_out=(docs_in - dropped) * 3000, seconds=rng.uniform(0.01, 0.2))
    if dropped:
        stats.dropped[f"{name}_reason_{input_index % 3}"] = dropped
    if name == "langid":
        stats.counters.update({"lang:en": docs_in - dropped, f"lang:x{input_index % 40:02d}": dropped})
    if name in ("gopher_quality", "fineweb_quality"):
        for _ in range(docs_in):
            stats.add_score("score", rng.random(), tuple(i / 20 for i in range(21)))
    for record in range(4):
        doc = Document(make_doc_id(input_index, record), f"https://site-{input_index}.example/{record}",
                       f"document {record} of input {input_index} " * 20)
        stats.add_example("kept", doc)
        stats.add_example("removed", doc, f"{name}_reason")
    return stats


def _write_input(store: LocalStore, config: DataprepConfig, i: int, uri: str) -> None:
    rng = random.Random(i)
    failed = i % ERROR_EVERY == 0
    docs = 0 if failed else DOCS
    steps, docs_in = [], docs
    read = _step("read", i, docs, 0, rng)
    read.counters.update({"input_bytes": 50_000, "input_files": 1, "bad_input:unreadable": int(failed)})
    steps.append(read)
    for name in [*config.pipeline, "minhash"]:
        dropped = min(docs_in, 2) if name != "minhash" else 0
        steps.append(_step(name, i, docs_in, dropped, rng))
        docs_in -= dropped
    store.write_text(layout.input_stats(i), json.dumps({
        "input": uri, "input_index": i, "input_bytes": 50_000, "docs_kept": docs_in,
        "seconds": round(rng.uniform(1, 100), 4), "peak_rss_bytes": rng.randrange(100 << 20, 900 << 20),
        "error": f"cannot open input {uri}: NoSuchKey" if failed else None, "steps": [s.to_dict() for s in steps]}))
    tokenize = [_step("global_dedup", i, docs_in, min(docs_in, 1), rng), _step("tokenize", i, docs_in - 1, 0, rng)]
    tokenize[1].counters["tokens"] = 500 * docs_in
    store.write_text(layout.tokenize_stats(i), json.dumps({
        "input_index": i, "tokens": 500 * docs_in, "seconds": round(rng.uniform(0.5, 20), 4),
        "peak_rss_bytes": rng.randrange(100 << 20, 400 << 20), "steps": [s.to_dict() for s in tokenize]}))
    with ArrowRowWriter(store, layout.token_index(i), TOKEN_INDEX_SCHEMA, 1000) as index:
        for record in range(max(docs_in - 1, 0)):
            index.add({"doc_id": make_doc_id(i, record), "url": f"https://site-{i}.example/{record}",
                       "content_sha256": "cd" * 32, "token_start": 500 * record, "token_count": 100 + 37 * record,
                       "record_id": f"<urn:uuid:{i:06d}-{record:08d}>"})


def synthetic_run(root, n_inputs: int) -> Run:
    """A run of `n_inputs` inputs whose stages all finished, as the report stage finds it."""
    store, config = LocalStore(root), DataprepConfig()
    inputs = [f"s3://crawl/CC-MAIN-2024-10/segment-{i:06d}.warc.wet.gz" for i in range(n_inputs)]
    for i, uri in enumerate(inputs):
        _write_input(store, config, i, uri)
    for p, members in enumerate(partitions(n_inputs, config.shards.inputs_per_partition)):
        shard = {"path": layout.shard("train", p, 0), "split": "train", "tokens": 1000, "documents": 10,
                 "sha256": "ab" * 32, "block_bytes": 4 << 20, "blocks_sha256": "cd" * 32}
        store.write_text(layout.shard_entries(p), json.dumps({
            "partition": p, "inputs": [members.start, members.stop], "entries": {"train": [shard], "val": []},
            "documents": 10, "tokens": 1000, "seconds": 0.5 + p % 7, "peak_rss_bytes": (200 + p % 50) << 20}))
    store.write_text(layout.DEDUP_STATS, json.dumps({"removed": {"near_duplicate": n_inputs}, "clusters": n_inputs,
                                                     "near_duplicate_groups": n_inputs, "seconds": 1.0}))
    store.write_text(layout.TOKENIZER_STATS, json.dumps(TOKENIZER))
    write_manifest(store, config, n_inputs, TOKENIZER)
    return Run(store, config, inputs)


def report_peak(run: Run) -> tuple[int, dict]:
    """Peak Python heap (tracemalloc) of writing the report, and the report."""
    tracemalloc.start()
    try:
        report = write_report(run)
        return tracemalloc.get_traced_memory()[1], report
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {n: synthetic_run(tmp_path_factory.mktemp(f"run-{n}"), n) for n in (BASE_INPUTS, 16 * BASE_INPUTS)}


def test_writing_the_report_takes_the_same_memory_at_16x_the_inputs(runs):
    small, large = runs[BASE_INPUTS], runs[16 * BASE_INPUTS]
    write_report(small)  # the first report compiles the page's templates: not a cost of either size
    small_peak, small_report = report_peak(small)
    large_peak, large_report = report_peak(large)
    print(f"report peak heap: {BASE_INPUTS} inputs {small_peak / 2**20:.2f} MiB, "
          f"{16 * BASE_INPUTS} inputs {large_peak / 2**20:.2f} MiB")
    assert large_peak <= 1.10 * small_peak, (small_peak, large_peak)
    # and the numbers are the whole run's, merged input by input
    for n, report in ((BASE_INPUTS, small_report), (16 * BASE_INPUTS, large_report)):
        failed = len(range(0, n, ERROR_EVERY))
        assert report["inputs"]["records"] == DOCS * (n - failed)
        assert report["inputs"]["bad_input"]["unreadable"] == failed
        assert report["inputs"]["gzip_file_bytes"] == 50_000 * n
        groups = {(g["phase"], g["task"]): g for g in report["task_groups"]}
        filters = groups[("inputs", "filter")]
        assert filters["tasks"] == n and filters["errors"] == failed and not filters["all_listed"]
        assert groups[("tokenize", "tokenize")]["tasks"] == groups[("shards", "shards")]["tasks"] == n
        rows = [w for w in report["workers"] if w["phase"] == "inputs"]
        assert len(rows) <= MAX_ERROR_ROWS + 2 * NOTABLE
        assert sum(1 for w in rows if w["error"]) >= min(failed, MAX_ERROR_ROWS)  # (a slowest one may fail too)
        assert report["totals"]["train_shards"] == n == split_totals(
            parse_manifest((run_root(runs[n]) / "manifest.json").read_bytes(), "manifest.json"))["train"]["shards"]


def run_root(run: Run):
    return run.store.root


def test_the_page_stops_growing_once_tasks_are_summarised(runs):
    sizes = {}
    for n, run in runs.items():
        write_report(run)
        sizes[n] = {name: (run_root(run) / name).stat().st_size for name in ("report.html", "report.json")}
    small, large = sizes[BASE_INPUTS], sizes[16 * BASE_INPUTS]
    print(f"report.html {small['report.html']} → {large['report.html']} bytes, "
          f"report.json {small['report.json']} → {large['report.json']} bytes")
    assert large["report.html"] <= 1.05 * small["report.html"]
    assert large["report.json"] <= 1.05 * small["report.json"]
    page = (run_root(runs[16 * BASE_INPUTS]) / "report.html").read_text()
    assert "3,072 tasks, summarised per phase" in page and "rows listed" in page  # filter, tokenize, shards


def test_a_group_of_few_tasks_lists_every_one_and_a_large_one_its_notable_ones():
    few, many = TaskSummary(), TaskSummary()
    for i in range(FULL_ROWS):
        few.add({"phase": "inputs", "task": "filter", "seconds": float(i), "peak_rss_bytes": i, "error": None})
    assert len(few.rows()) == FULL_ROWS and few.summaries()[0]["all_listed"]
    for i in range(5000):  # every task as slow as the next, but for the few that stand out
        row = {"phase": "inputs", "task": "filter", "input": str(i), "seconds": 1.0, "peak_rss_bytes": 100,
               "error": "broken" if i % 100 == 7 else None}
        if i in (4000, 4001):
            row["seconds"] = 60.0
        if i == 12:
            row["peak_rss_bytes"] = 10**9
        many.add(row)
    rows = many.rows()
    listed = [int(r["input"]) for r in rows]
    assert listed == sorted(listed)  # in the order the tasks were added
    assert {4000, 4001, 12} <= set(listed)
    assert [r["input"] for r in rows if r["error"]] == [str(i) for i in range(7, 5000, 100)][:MAX_ERROR_ROWS]
    assert len(rows) <= MAX_ERROR_ROWS + 2 * NOTABLE
    [summary] = many.summaries()
    assert summary["tasks"] == 5000 and summary["errors"] == 50 and summary["rows_listed"] == len(rows)
    assert summary["seconds"]["max"] == 60.0 and summary["seconds"]["p50"] == 1.0
    assert summary["seconds"]["total"] == pytest.approx(4998 + 120)
    assert summary["peak_rss_bytes"]["max"] == 10**9


def test_a_bounded_sample_is_exact_while_it_fits_then_keeps_its_size():
    sample = BoundedSample(capacity=100)
    for value in range(1, 101):
        sample.add(float(value))
    assert [sample.percentile(q) for q in (50, 90, 99, 100)] == [50.0, 90.0, 99.0, 100.0]
    for value in range(101, 100_001):
        sample.add(float(value))
    assert len(sample.values) == 100 and sample.seen == 100_000
    assert 30_000 < sample.percentile(50) < 70_000  # a uniform sample of 1..100,000
