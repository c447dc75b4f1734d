"""End to end: generated WET in two inputs → two Indexed-Job workers → global stages.

Ground truth comes from the generator (which records are planted duplicates of which)."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from lmforge.common.shards import open_shard
from lmforge.sample_data.wet import write_sample_wet
from tests.dataprep.helpers import (
    doc_ids_in,
    kept_doc_ids,
    lineage_rows,
    manifest,
    run_cli,
    split_wet,
)

SMALL = ["--set", "tokenizer.vocab_size=1024", "--set", "shards.shard_tokens=40000",
         "--set", "shards.val_fraction=0.05"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    base = tmp_path_factory.mktemp("corpus")
    summary = write_sample_wet(base / "all.warc.wet", 1200, 11)
    inputs = [base / "part-a.warc.wet.gz", base / "part-b.warc.wet.gz"]
    doc_ids = split_wet(base / "all.warc.wet", inputs)
    return summary, inputs, doc_ids


def _texts_by_url(path) -> dict[str, str]:
    from warcio.archiveiterator import ArchiveIterator

    with open(path, "rb") as fh:
        return {r.rec_headers.get_header("WARC-Target-URI"): r.content_stream().read().decode()
                for r in ArchiveIterator(fh) if r.rec_type == "conversion"}


@pytest.fixture(scope="module")
def eval_set(corpus, tmp_path_factory):
    """An eval set quoting 40 words from the middle of three planted prose documents."""
    summary, _, _ = corpus
    texts = _texts_by_url(summary.path)
    prose = [r["url"] for r in summary.records if r["kind"] == "prose"][:3]
    path = tmp_path_factory.mktemp("evals") / "trivia.jsonl"
    lines = []
    for url in prose:
        words = texts[url].split()
        lines.append(json.dumps({"text": " ".join(words[60:100])}))
    path.write_text("\n".join(lines) + "\n")
    return path, prose


@pytest.fixture(scope="module")
def two_worker_run(corpus, eval_set, tmp_path_factory):
    _, inputs, _ = corpus
    out = tmp_path_factory.mktemp("run") / "out"
    contamination = ["--set", f"steps.contamination.eval_sets=[{eval_set[0]}]"]
    for index in (1, 0):  # order must not matter
        assert run_cli("run", "--input", *inputs, "--output", out, "--worker-index", index,
                       "--num-workers", 2, "--workers", 1, *SMALL, *contamination) == 0
    assert not (out / "manifest.json").exists()  # workers only do the per-input stage
    assert run_cli("finalize", "--output", out, "--workers", 1) == 0
    return out


def _clusters(summary, doc_ids):
    """Planted duplicate groups: original record → its duplicates, by doc id."""
    groups = defaultdict(set)
    for rec in summary.records:
        if rec["kind"] in ("exact_dup", "near_dup", "url_dup"):
            groups[doc_ids[rec["original_index"]]].add(doc_ids[rec["index"]])
    return groups


def test_outputs_follow_the_design_layout(two_worker_run):
    out = two_worker_run
    for rel in ("tokenizer.json", "manifest.json", "report.json", "report.html"):
        assert (out / rel).is_file(), rel
    man = manifest(out)
    assert {s["split"] for s in man["shards"]} == {"train", "val"}
    for shard in man["shards"]:
        header, tokens = open_shard(out / shard["path"])
        assert header.token_count == shard["tokens"] == len(tokens)
        assert header.tokenizer_sha256 == man["tokenizer"]["sha256"]
        assert header.dtype.name == man["dtype"] == "uint16"
    assert man["totals"]["tokens"] == sum(s["tokens"] for s in man["shards"])
    reasons = {(r["stage"], r["reason"]) for p in (out / "rejects").glob("*.parquet")
               for r in pq.read_table(p, columns=["stage", "reason"]).to_pylist()}
    assert ("langid", "language_not_kept") in reasons
    assert ("global_dedup", "near_duplicate") in reasons or ("exact_dedup", "duplicate_content") in reasons


def test_planted_duplicates_removed_and_distinct_docs_kept(corpus, two_worker_run):
    summary, _, doc_ids = corpus
    out = two_worker_run
    passed_filters = doc_ids_in(out, "work/docs")
    kept = kept_doc_ids(out)
    groups = _clusters(summary, doc_ids)
    duplicates = survivors_extra = 0
    for original, dups in groups.items():
        members = ({original} | dups) & passed_filters
        if len(members) < 2:
            continue  # the filters already removed all but one
        duplicates += len(members) - 1
        survivors_extra += len(members & kept) - 1
        assert len(members & kept) >= 1, "a duplicate cluster lost every member"
    assert duplicates >= 50
    recall = 1 - survivors_extra / duplicates
    assert recall >= 0.95, recall

    planted = set(groups) | {d for dups in groups.values() for d in dups}
    distinct = [doc_ids[r["index"]] for r in summary.records
                if r["kind"] in ("prose", "boilerplate", "pii") and doc_ids[r["index"]] not in planted]
    distinct = [d for d in distinct if d in passed_filters]
    assert len(distinct) >= 200
    boilerplate = [doc_ids[r["index"]] for r in summary.records if r["kind"] == "boilerplate"]
    assert len(set(boilerplate) & passed_filters) >= 30, "boilerplate pages must reach dedup for this test to mean much"
    wrongly_dropped = [d for d in distinct if d not in kept]
    assert len(wrongly_dropped) / len(distinct) <= 0.01


def test_dedup_is_global_across_workers(corpus, two_worker_run):
    summary, _, doc_ids = corpus
    kept = kept_doc_ids(two_worker_run)
    passed = doc_ids_in(two_worker_run, "work/docs")
    cross = 0
    for original, dups in _clusters(summary, doc_ids).items():
        for dup in dups:
            if (dup >> 32) != (original >> 32) and {dup, original} <= passed:
                cross += 1
                assert not {dup, original} <= kept, "a cross-worker duplicate pair survived"
    assert cross >= 20


def test_tokens_decode_back_to_exactly_the_kept_text(two_worker_run):
    out = two_worker_run
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    eot = manifest(out)["tokenizer"]["eot_id"]
    texts = {}
    for path in (out / "work" / "docs").glob("*.parquet"):
        for row in pq.read_table(path, columns=["content_sha256", "text"]).to_pylist():
            texts[row["content_sha256"]] = row["text"]
    shards = {}
    rows = lineage_rows(out)
    assert rows
    for row in rows:
        if row["shard"] not in shards:
            shards[row["shard"]] = np.asarray(open_shard(out / row["shard"])[1])
        tokens = shards[row["shard"]][row["token_offset"] : row["token_offset"] + row["token_count"] + 1]
        assert tokens[-1] == eot and eot not in tokens[:-1]
        assert tokenizer.decode(tokens[:-1].tolist(), skip_special_tokens=False) == texts[row["content_sha256"]]


def test_lineage_covers_every_token(two_worker_run):
    out = two_worker_run
    man = manifest(out)
    per_shard = defaultdict(int)
    for row in lineage_rows(out):
        per_shard[row["shard"]] += row["token_count"] + 1
    assert dict(per_shard) == {s["path"]: s["tokens"] for s in man["shards"]}


def test_report_counts_add_up(two_worker_run):
    report = json.loads((two_worker_run / "report.json").read_text())
    stages = {s["name"]: s for s in report["stages"]}
    order = ["read", "url_dedup", "exact_dedup", "url_filter", "langid", "gopher_repetition", "gopher_quality",
             "c4_quality", "fineweb_quality", "pii", "contamination", "minhash", "global_dedup", "tokenize"]
    assert [s["name"] for s in report["stages"]][: len(order)] == order
    for before, after in zip(order, order[1:]):
        assert stages[before]["docs_out"] == stages[after]["docs_in"], (before, after)
    for stage in stages.values():
        assert stage["docs_in"] - stage["docs_out"] == sum(stage["dropped"].values()), stage["name"]
    assert report["totals"]["kept_docs"] == stages["tokenize"]["docs_out"]
    assert report["languages"]["en"] > 0 and len(report["languages"]) >= 5
    assert report["pii"]["items_scrubbed"].get("email", 0) > 0
    assert sum(report["doc_length_tokens"]["counts"]) == report["totals"]["kept_docs"]
    html = (two_worker_run / "report.html").read_text()
    assert "gopher_quality" in html and "<svg" in html


def test_sample_command_prints_kept_and_dropped(two_worker_run, capsys):
    assert run_cli("sample", "--output", two_worker_run, "--n", 20, "--seed", 3) == 0
    printed = capsys.readouterr().out
    assert printed.count("KEPT ") == 10 and printed.count("DROPPED ") == 10
    assert "langid/language_not_kept" in printed or "gopher" in printed


def test_contaminated_documents_are_dropped(two_worker_run, eval_set):
    _, contaminated_urls = eval_set
    out = two_worker_run
    rejected = {}
    for path in (out / "rejects").glob("*.parquet"):
        for row in pq.read_table(path, columns=["url", "stage", "reason"]).to_pylist():
            rejected[row["url"]] = (row["stage"], row["reason"])
    assert all(rejected.get(url) == ("contamination", "contaminated") for url in contaminated_urls)
    lineage_urls = {row["url"] for row in lineage_rows(out)}
    assert not set(contaminated_urls) & lineage_urls
    report = json.loads((out / "report.json").read_text())
    contamination = report["contamination"]
    assert contamination["enabled"] and contamination["documents_removed"] == 3
    assert contamination["documents_per_eval_set"] == {"trivia": 3}
