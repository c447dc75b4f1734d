"""Every step of a run the user composed, in the report and in `lmforge-dataprep sample`: a custom
pipeline order with a step type from outside lmforge (tests.dataprep.scoring_step) that records a
score, checked against the rejects and docs Parquet files the run wrote."""

from __future__ import annotations

import json
import re

import pyarrow.parquet as pq
import pytest

from lmforge.common.local_store import LocalStore
from lmforge.dataprep import layout
from lmforge.dataprep.report import _step_lists
from lmforge.dataprep.stats import EXAMPLES_PER_SIDE, StepStats, _example_rank, merge_stats
from lmforge.sample_data.wet import write_sample_wet
from tests.dataprep.helpers import doc_ids_in, run_cli
from tests.dataprep.test_report_html import parse, section, text_of

PIPELINE = ["url_dedup", "exact_dedup", "gopher_quality", "distinct", "langid"]  # gopher before langid
STEP_IDS = ["read", *PIPELINE, "global_dedup"]
SMALL = ["--workers", 1, "--set", "tokenizer.vocab_size=300"]


@pytest.fixture(scope="module")
def scored_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("steps") / "out"
    (out / "wet").mkdir(parents=True)
    write_sample_wet(out / "wet" / "a.warc.wet.gz", 120, 3)
    write_sample_wet(out / "wet" / "b.warc.wet.gz", 60, 4)
    assert run_cli("run", "--input", str(out / "wet" / "*.warc.wet.gz"), "--output", out, *SMALL,
                   "--set", f"pipeline=[{','.join(PIPELINE)}]",
                   "--set", "steps.distinct.type=tests.dataprep.scoring_step:DistinctWordsFilter") == 0
    return out


@pytest.fixture(scope="module")
def report(scored_run):
    return json.loads((scored_run / "report.json").read_text())


@pytest.fixture(scope="module")
def rejects(scored_run) -> list[dict]:
    paths = sorted((scored_run / "rejects").glob("*.parquet"))
    return [row for path in paths for row in pq.read_table(path).to_pylist()]


def _ids(rows, stages) -> set[int]:
    return {row["doc_id"] for row in rows if row["stage"] in stages}


def test_report_steps_cover_the_pipeline_in_order(report, rejects):
    steps = report["steps"]
    assert [s["id"] for s in steps] == STEP_IDS
    types = {s["id"]: s["type"] for s in steps}
    assert types["distinct"] == "tests.dataprep.scoring_step:DistinctWordsFilter" and types["langid"] == "langid"
    for before, step in zip(steps, steps[1:]):
        assert step["docs_in"] == before["docs_out"], step["id"]
    for step in steps:
        assert step["docs_in"] - step["docs_out"] == step["docs_dropped"] == sum(step["dropped"].values())
        assert step["bytes_out"] <= step["bytes_in"]
        assert step["dropped"] == {reason: sum(1 for r in rejects if r["stage"] == step["id"] and r["reason"] == reason)
                                   for reason in step["dropped"]}
    by_id = {s["id"]: s for s in steps}
    assert by_id["distinct"]["dropped"] and by_id["gopher_quality"]["dropped"] and by_id["global_dedup"]["dropped"]
    histogram = by_id["distinct"]["histograms"]["distinct_words"]
    assert sum(histogram["counts"]) == by_id["distinct"]["docs_in"] and len(histogram["edges"]) == 21
    assert report["languages"] and sum(report["languages"].values()) == by_id["langid"]["docs_in"]
    assert [s["name"] for s in report["stages"]][:len(PIPELINE) + 1] == ["read", *PIPELINE]


def test_step_examples_are_the_bottom_k_of_the_whole_run(report, rejects, scored_run):
    """Two inputs merged: each step's removed examples are the lowest-ranked of all its rejects,
    its kept examples documents that passed it."""
    final = doc_ids_in(scored_run, "work/docs")
    for step in report["steps"][1:]:
        removed = _ids(rejects, {step["id"]})
        expected = sorted(removed, key=_example_rank)[:EXAMPLES_PER_SIDE]
        assert [e["doc_id"] for e in step["examples"]["removed"]] == expected, step["id"]
        assert {e["reason"] for e in step["examples"]["removed"]} <= set(step["dropped"])
        later = STEP_IDS[STEP_IDS.index(step["id"]) + 1:]
        passed = (final | _ids(rejects, set(later))) - _ids(rejects, {step["id"]})
        kept = [e["doc_id"] for e in step["examples"]["kept"]]
        assert len(kept) == EXAMPLES_PER_SIDE and set(kept) <= passed, step["id"]
        assert all(e["preview"] and e["url"].startswith("https://") for e in step["examples"]["kept"])


def test_html_report_has_a_block_per_step_with_histogram_and_examples(scored_run, report):
    page = (scored_run / "report.html").read_text()
    assert parse(page).errors == []
    steps = section(page, "steps")
    blocks = re.split(r'<div class="step" id="step-\d+">', steps)[1:]
    assert len(blocks) == len(STEP_IDS)
    for block, step in zip(blocks, report["steps"]):
        text = text_of(block)
        assert text.split(" ")[1] == step["id"]
        assert f"{step['docs_in']:,} docs in → {step['docs_out']:,} out" in text
        assert ("<svg" in block) == bool(step["histograms"])
        for reason in step["dropped"]:
            assert reason in text
        for example in step["examples"]["removed"] + step["examples"]["kept"]:
            assert example["url"] in text
    distinct = text_of(blocks[STEP_IDS.index("distinct")])
    assert "score: distinct_words" in distinct and "removed (5 shown of" in distinct and "kept (5 shown of" in distinct


def _sample(capsys, out, *args) -> list[dict]:
    capsys.readouterr()
    assert run_cli("sample", "--output", out, "--json", *args) == 0
    captured = capsys.readouterr()
    return [json.loads(line) for line in captured.out.splitlines()]


def test_sample_removed_by_a_step_is_its_rejects(capsys, scored_run, rejects):
    rows = _sample(capsys, scored_run, "--step", "gopher_quality", "--side", "removed", "--n", 1000)
    assert {r["side"] for r in rows} == {"removed"} and {r["step"] for r in rows} == {"gopher_quality"}
    assert {r["doc_id"] for r in rows} == _ids(rejects, {"gopher_quality"})
    assert all(r["reason"] and r["text"] for r in rows)
    assert len(_sample(capsys, scored_run, "--step", "gopher_quality", "--side", "removed", "--n", 3)) == 3


def test_sample_kept_by_a_step_is_what_passed_it(capsys, scored_run, rejects):
    rows = _sample(capsys, scored_run, "--step", "gopher_quality", "--side", "kept", "--n", 1000)
    passed = doc_ids_in(scored_run, "work/docs") | _ids(rejects, {"distinct", "langid"})
    assert {r["side"] for r in rows} == {"kept"} and {r["step"] for r in rows} == {"gopher_quality"}
    assert {r["doc_id"] for r in rows} == passed and len(rows) == len(passed)
    assert not passed & _ids(rejects, {"gopher_quality", "url_dedup", "exact_dedup"})
    # the global dedup: what it removed (in the docs Parquet) is no longer kept
    dedup = _sample(capsys, scored_run, "--step", "global_dedup", "--n", 1000)
    removed = {r["doc_id"] for r in dedup if r["side"] == "removed"}
    assert removed == _ids(rejects, {"global_dedup"}) and removed
    assert {r["doc_id"] for r in dedup if r["side"] == "kept"} == doc_ids_in(scored_run, "work/docs") - removed


def test_sample_text_output_and_unknown_step(capsys, scored_run):
    capsys.readouterr()
    assert run_cli("sample", "--output", scored_run, "--step", "distinct", "--n", 4, "--chars", 40) == 0
    out = capsys.readouterr().out
    assert out.count("KEPT ") == 2 and out.count("DROPPED  distinct/repetitive ") == 2
    assert re.search(r"# 2 kept and 2 dropped shown, of \d+ kept and \d+ dropped at step distinct\n$", out)
    assert run_cli("sample", "--output", scored_run, "--step", "nope") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"lmforge-dataprep sample: error: unknown step 'nope'; this run's steps: {', '.join(STEP_IDS)}"


def test_a_pipeline_without_langid_reports_and_samples(tmp_path, capsys):
    out = tmp_path / "out"
    write_sample_wet(tmp_path / "a.warc.wet.gz", 40, 5)
    assert run_cli("run", "--input", tmp_path / "a.warc.wet.gz", "--output", out, *SMALL,
                   "--set", "pipeline=[exact_dedup,gopher_repetition]") == 0
    report = json.loads((out / "report.json").read_text())
    assert [s["id"] for s in report["steps"]] == ["read", "exact_dedup", "gopher_repetition", "global_dedup"]
    assert report["languages"] == {}
    assert "no data" in section((out / "report.html").read_text(), "languages")
    rows = _sample(capsys, out, "--step", "exact_dedup", "--side", "kept", "--n", 5)
    assert len(rows) == 5 and {r["step"] for r in rows} == {"exact_dedup"}


def test_merging_many_inputs_keeps_only_the_bottom_k_examples():
    """The report merges one input's stats at a time: whatever the number of inputs, a step holds
    EXAMPLES_PER_SIDE examples per side, the lowest-ranked of all."""
    def one_input(i: int) -> list[dict]:
        stats = StepStats("step")
        stats.examples["removed"] = [{"rank": _example_rank(i * 10 + j), "doc_id": i * 10 + j, "url": "u",
                                      "reason": "r", "preview": "p"} for j in range(EXAMPLES_PER_SIDE)]
        return [stats.to_dict()]

    [merged] = merge_stats(one_input(i) for i in range(2000))
    expected = sorted(range(2000 * 10), key=_example_rank)
    expected = [d for d in expected if d % 10 < EXAMPLES_PER_SIDE][:EXAMPLES_PER_SIDE]
    assert [e["doc_id"] for e in merged.examples["removed"]] == expected


def test_report_reads_task_summaries_one_at_a_time(scored_run):
    """build_report keeps each input's summary without its steps (examples, histograms): those
    are folded into the merged stats as they are read."""
    store = LocalStore(scored_run)
    summaries: list[dict] = []
    groups = _step_lists(store, [layout.input_stats(0), layout.input_stats(1)], summaries.append)
    first = next(groups)
    assert [s["name"] for s in first][:2] == ["read", "url_dedup"] and len(summaries) == 1
    merged = merge_stats([first, *groups])
    assert len(summaries) == 2 and all("steps" not in s and "read_counters" in s for s in summaries)
    assert all(len(s.examples.get("kept", [])) <= EXAMPLES_PER_SIDE for s in merged)
