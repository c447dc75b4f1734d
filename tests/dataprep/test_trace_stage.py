"""The trace-index stage on a real (tiny) data-prep run: one index per shard partition from the shards and their
lineage, index.json assembled by the report, a window of a training document traced back to its URL and WARC
record id, reruns skipping finished partitions, nothing at all when disabled, and lineage written before
record_id still read."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from warcio.archiveiterator import ArchiveIterator

from lmforge.common.errors import InputError
from lmforge.common.local_store import LocalStore
from lmforge.dataprep import layout
from lmforge.dataprep.config import DataprepConfig
from lmforge.dataprep.parquet_io import LINEAGE_SCHEMA, read_lineage
from lmforge.dataprep.stage_runs import open_run, stage_task_count
from lmforge.dataprep.trace_index import shard_documents
from lmforge.sample_data.wet import write_sample_wet
from lmforge.trace.engine import TraceIndex
from lmforge.trace.format import ENTRY, PARTITION_FILES, read_index_json
from lmforge.trace.query import trace_tokens
from tests.dataprep.helpers import lineage_rows, run_cli, shard_tokens

SMALL = ["--set", "tokenizer.vocab_size=600", "--set", "shards.shard_tokens=20000", "--set", "shards.val_fraction=0.1",
         "--set", "minhash.enabled=false"]
TRACE = ["--set", "trace_index.enabled=true"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[Path]:
    base = tmp_path_factory.mktemp("trace-inputs")
    paths = [base / f"in-{seed}.warc.wet.gz" for seed in (1, 2)]
    for seed, path in enumerate(paths, start=1):
        write_sample_wet(path, 40, seed)
    return paths


@pytest.fixture(scope="module")
def traced(inputs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("traced") / "out"
    assert run_cli("run", "--input", *inputs, "--output", out, "--workers", 1, *SMALL, *TRACE) == 0
    return out


def _record_ids(inputs: list[Path]) -> dict[str, str]:
    """WARC-Target-URI → WARC-Record-ID of every conversion record of the inputs."""
    found = {}
    for path in inputs:
        with open(path, "rb") as fh:
            for record in ArchiveIterator(fh):
                if record.rec_type == "conversion":
                    found[record.rec_headers.get_header("WARC-Target-URI")] = \
                        record.rec_headers.get_header("WARC-Record-ID")
    return found


def test_one_index_per_shard_partition_and_index_json_from_the_report(traced):
    partitions = sorted(p.name for p in (traced / "trace-index").iterdir() if p.is_dir())
    assert partitions == ["partition-000000", "partition-000001"]  # one per input (inputs_per_partition 1)
    info = read_index_json((traced / layout.TRACE_INDEX_JSON).read_text())
    assert [e["name"] for e in info["partitions"]] == partitions
    for entry in info["partitions"]:
        folder = traced / "trace-index" / entry["name"]
        assert json.loads((folder / ENTRY).read_text()) == entry
        for name in PARTITION_FILES:
            data = (folder / name).read_bytes()
            assert entry["files"][name] == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    # the train split only, each document without its end-of-text token
    train = [row for row in lineage_rows(traced) if row["shard"].startswith("shards/train_")]
    assert info["documents"] == len(train) > 0
    assert info["tokens"] == sum(row["token_count"] for row in train)
    tokenizer = (traced / "tokenizer.json").read_bytes()
    assert (traced / layout.TRACE_INDEX_TOKENIZER).read_bytes() == tokenizer
    assert info["tokenizer_sha256"] == hashlib.sha256(tokenizer).hexdigest()
    assert info["data_manifest_sha256"] == hashlib.sha256((traced / "manifest.json").read_bytes()).hexdigest()

    report = json.loads((traced / "report.json").read_text())
    section = report["trace_index"]
    assert section["enabled"] and section["partitions"] == 2
    assert (section["tokens"], section["documents"], section["bytes"]) == (info["tokens"], info["documents"],
                                                                           info["bytes"])
    assert section["bytes_per_token"] == round(info["bytes"] / info["tokens"], 3)
    phase = next(p for p in report["phases"] if p["name"] == "trace-index")
    assert phase["tokens"] == info["tokens"] and phase["processes"] >= 1
    groups = {g["task"]: g for g in report["task_groups"] if g["phase"] == "trace-index"}
    assert groups["trace-index"]["tasks"] == 2 and "main process" in groups
    assert "Trace index" in (traced / "report.html").read_text()


def test_a_window_of_a_training_document_traces_to_its_url_and_record_id(traced, inputs):
    train = [row for row in lineage_rows(traced) if row["shard"].startswith("shards/train_")]
    row = max(train, key=lambda r: r["token_count"])
    assert row["token_count"] >= 60
    assert row["record_id"] == _record_ids(inputs)[row["url"]] != ""  # carried from the WET record to lineage
    start = row["token_offset"] + 10
    window = shard_tokens(traced, row["shard"])[start : start + 40].tolist()

    result = trace_tokens(TraceIndex.open(traced / "trace-index"), window, min_span_tokens=40, span_density=None,
                          max_documents=50)
    (span,) = result.spans
    assert (span.start, span.end) == (0, 40)
    found = {(d.url, d.record_id, d.doc_id, d.shard, d.token_offset) for d in span.documents}
    assert (row["url"], row["record_id"], row["doc_id"], row["shard"], row["token_offset"]) in found


def test_grouped_shard_partitions_make_one_index_partition_that_traces_the_same(traced, inputs, tmp_path):
    out = tmp_path / "out"
    assert run_cli("run", "--input", *inputs, "--output", out, "--workers", 1, *SMALL, *TRACE,
                   "--set", "trace_index.shard_partitions_per_index=2") == 0
    grouped = read_index_json((out / layout.TRACE_INDEX_JSON).read_text())
    single = read_index_json((traced / layout.TRACE_INDEX_JSON).read_text())
    assert [e["name"] for e in grouped["partitions"]] == ["partition-000000"]
    assert (grouped["tokens"], grouped["documents"]) == (single["tokens"], single["documents"])
    stats = json.loads((out / layout.trace_index_stats(0)).read_text())
    train_shards = {r["shard"] for r in lineage_rows(out) if r["shard"].startswith("shards/train_")}
    assert stats["shard_partitions"] == [0, 2] and stats["shards"] == len(train_shards)
    assert {s.split("_")[1] for s in train_shards} == {"000000", "000001"}
    with open_run(str(out), None, None) as run:
        assert stage_task_count(run, "trace-index") == 1

    # a window of a document of the second shard partition: same span, count and sources as the ungrouped index
    row = max((r for r in lineage_rows(traced) if r["shard"].startswith("shards/train_000001")),
              key=lambda r: r["token_count"])
    window = shard_tokens(traced, row["shard"])[row["token_offset"] : row["token_offset"] + 30].tolist()
    traces = [trace_tokens(TraceIndex.open(root / "trace-index"), window, min_span_tokens=30, span_density=None,
                           max_documents=50) for root in (traced, out)]
    spans = [[(s.start, s.end, s.count, sorted((d.url, d.shard, d.token_offset) for d in s.documents))
              for s in t.spans] for t in traces]
    assert spans[0] == spans[1] and spans[0][0][:2] == (0, 30)
    assert (row["url"], row["shard"], row["token_offset"]) in spans[1][0][3]


def test_a_rerun_skips_every_built_partition(traced):
    entries = sorted((traced / "trace-index").glob(f"*/{ENTRY}"))
    before = {p: p.stat().st_mtime_ns for p in sorted((traced / "trace-index").rglob("*"))}
    assert run_cli("trace-index", "--output", traced, "--workers", 1) == 0
    assert run_cli("trace-index", "--output", traced, "--worker-index", 1, "--num-workers", 2) == 0
    assert {p: p.stat().st_mtime_ns for p in before} == before and len(entries) == 2
    with open_run(str(traced), None, None) as run:
        assert stage_task_count(run, "trace-index") == 2


def test_the_report_refuses_a_missing_partition_in_one_line(traced, tmp_path, capsys):
    copy = tmp_path / "out"
    shutil.copytree(traced, copy)
    (copy / "trace-index" / "partition-000001" / ENTRY).unlink()
    assert run_cli("report", "--output", copy) != 0
    err = capsys.readouterr().err
    assert "1 trace-index partition(s) not built yet (e.g. [1]): run the trace-index stage first" in err


def test_disabled_builds_nothing_and_the_report_links_contamination_reports(inputs, tmp_path):
    out = tmp_path / "out"
    assert run_cli("run", "--input", inputs[0], "--output", out, "--workers", 1, *SMALL) == 0
    assert not (out / "trace-index").exists()
    with open_run(str(out), None, None) as run:
        assert stage_task_count(run, "trace-index") == 0
    assert run_cli("trace-index", "--output", out, "--worker-index", 0, "--num-workers", 1) == 0
    assert not (out / "trace-index").exists()
    report = json.loads((out / "report.json").read_text())
    assert report["trace_index"] == {"enabled": False} and report["contamination_reports"] == []

    (out / "reports").mkdir()
    (out / "reports" / "contamination-trivia.html").write_text("<html></html>")
    (out / "reports" / "contamination-trivia.json").write_text("{}")
    assert run_cli("report", "--output", out) == 0
    assert json.loads((out / "report.json").read_text())["contamination_reports"] == [
        "reports/contamination-trivia.html"]
    assert '<a href="reports/contamination-trivia.html">contamination-trivia</a>' in (out / "report.html").read_text()


def test_lineage_written_before_record_id_still_reads(traced, tmp_path):
    store = LocalStore(tmp_path)
    shard = layout.shard("train", 0, 0)
    lineage = layout.lineage("train", 0, 0)
    for rel in (shard, shard.removesuffix(".bin") + ".idx"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(traced / rel, tmp_path / rel)
    current = pq.read_table(traced / lineage)
    old = current.drop_columns(["record_id"])  # the schema before record_id: its first six columns
    assert old.schema.names == LINEAGE_SCHEMA.names[:-1]
    (tmp_path / lineage).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(old, tmp_path / lineage)

    table = read_lineage(store, lineage)
    assert table.schema.names == LINEAGE_SCHEMA.names
    assert set(table.column("record_id").to_pylist()) == {""}
    assert table.drop_columns(["record_id"]).equals(old)

    info = json.loads((traced / "work/stats/global_tokenizer.json").read_text())
    docs = list(shard_documents(store, shard, lineage, info["eot_id"]))
    assert [m["record_id"] for _, m in docs] == [""] * current.num_rows
    assert [m["url"] for _, m in docs] == current.column("url").to_pylist()
    tokens = shard_tokens(traced, shard)
    first = current.column("token_count")[0].as_py()
    assert np.array_equal(docs[0][0], tokens[:first])

    # a lineage that does not describe the shard is refused, not indexed under the wrong source
    shifted = old.set_column(old.schema.get_field_index("token_offset"), "token_offset",
                             pa.array([o + 1 for o in old.column("token_offset").to_pylist()], pa.uint64()))
    pq.write_table(shifted, tmp_path / lineage)
    with pytest.raises(InputError, match="the lineage and the shard disagree"):
        list(shard_documents(store, shard, lineage, info["eot_id"]))


def test_trace_index_config_defaults():
    settings = DataprepConfig().trace_index
    assert (settings.enabled, settings.splits, settings.part_tokens, settings.threads) == (False, ["train"],
                                                                                           25_000_000, 1)
    with pytest.raises(ValueError, match="more than once"):
        DataprepConfig.model_validate({"trace_index": {"splits": ["train", "train"]}})


def test_documents_kept_before_record_id_are_tokenized_and_sharded_with_an_empty_one(traced, tmp_path):
    # a run whose per-input stage ran before record_id, resumed at tokenize by this version
    out = tmp_path / "out"
    shutil.copytree(traced, out)
    docs = out / layout.docs(0)
    pq.write_table(pq.read_table(docs).drop_columns(["record_id"]), docs)
    for rel in (layout.tokenize_done(0), layout.shard_entries(0)):
        (out / rel).unlink()
    assert run_cli("tokenize", "--output", out, "--workers", 1) == 0
    assert run_cli("shards", "--output", out, "--worker-index", 0, "--num-workers", 2) == 0
    by_partition: dict[int, set[str]] = {0: set(), 1: set()}
    for path in (out / "lineage").glob("*.parquet"):  # lineage/{split}_{partition}_{k}.parquet
        by_partition[int(path.name.split("_")[1])].update(pq.read_table(path).column("record_id").to_pylist())
    assert by_partition[0] == {""} and "" not in by_partition[1]


def test_the_stage_reads_and_writes_an_object_store(traced, s3):
    # the shards, lineage and state of the local run copied to S3, then the stage run against the bucket
    from lmforge.common.storage import open_store

    _, make_bucket = s3
    make_bucket("lmf-trace")
    store = open_store("s3://lmf-trace/out")
    wanted = ("shards/", "lineage/", "work/shards/", "work/stats/global_tokenizer.json", layout.CONFIG, layout.INPUTS)
    for path in sorted(traced.rglob("*")):
        rel = path.relative_to(traced).as_posix()
        if path.is_file() and rel.startswith(wanted):
            store.upload_file(path, rel)
    assert run_cli("trace-index", "--output", "s3://lmf-trace/out", "--workers", 1) == 0
    for p in (0, 1):
        local = json.loads((traced / layout.trace_entry(p)).read_text())
        assert json.loads(store.read_text(layout.trace_entry(p))) == local  # the same bytes, verified on upload
        for name, described in local["files"].items():
            assert store.listing(layout.trace_partition(p))[layout.trace_partition_file(p, name)].size == \
                described["bytes"]
