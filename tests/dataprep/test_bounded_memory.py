"""A worker's memory is bounded whatever its input holds, and the peak RSS it reports is its task's own."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

from lmforge.common.storage import open_store
from lmforge.dataprep import layout
from lmforge.dataprep.config import DataprepConfig
from lmforge.dataprep.executor import PoolExecutor
from lmforge.dataprep.stats import PeakRss
from lmforge.dataprep.steps.reader import WetReader
from lmforge.dataprep.tasks import InputTask
from lmforge.dataprep.worker import process_input
from lmforge.sample_data.wet import write_sample_wet
from tests.dataprep.wet_records import english, wet_record

# the per-input stage alone, outside a run: nothing for "auto" to be chosen from (stage_runs.open_run)
FIXED_PARTITIONS = {"partitions_per_band": 1, "combine_partitions": 1}
RECORD_BYTES = 50 << 20  # one line, as the record: ~180 kB gzipped
LINE = b"All work and no play makes Jack a dull boy, and the garden is wet again today. "


def _huge_record_member(url: str) -> bytes:
    """A gzip member of one WET record of RECORD_BYTES on a single line, compressed a MiB at a time."""
    headers = ("WARC/1.0\r\nWARC-Type: conversion\r\n"
               f"WARC-Target-URI: {url}\r\nWARC-Date: 2024-05-18T01:58:10Z\r\n"
               f"Content-Type: text/plain\r\nContent-Length: {RECORD_BYTES}\r\n\r\n").encode()
    mib = (LINE * ((1 << 20) // len(LINE) + 1))[: 1 << 20]
    deflate = zlib.compressobj(6, zlib.DEFLATED, 31)
    parts = [deflate.compress(headers)]
    parts += [deflate.compress(mib) for _ in range(RECORD_BYTES >> 20)]
    parts += [deflate.compress(b"\r\n\r\n"), deflate.flush()]
    return b"".join(parts)


def _sample_inputs(tmp_path: Path) -> tuple[bytes, bytes]:
    first, second = tmp_path / "a.warc.wet.gz", tmp_path / "b.warc.wet.gz"
    write_sample_wet(first, 40, 1)
    write_sample_wet(second, 40, 2)
    return first.read_bytes(), second.read_bytes()


def _input_stats(out: Path, index: int) -> dict:
    return json.loads((out / layout.input_stats(index)).read_text())


def test_a_huge_single_line_record_is_rejected_unread_and_the_task_stays_small(tmp_path):
    first, second = _sample_inputs(tmp_path)
    normal, huge = tmp_path / "normal.warc.wet.gz", tmp_path / "huge.warc.wet.gz"
    normal.write_bytes(first + second)
    huge.write_bytes(first + _huge_record_member("https://huge.example/") + second)
    out = tmp_path / "out"
    store = open_store(out)
    config = DataprepConfig(reader={"max_record_bytes": 1 << 20}, minhash=FIXED_PARTITIONS)

    without = process_input(store, config, str(normal), 0)  # also loads the steps' models
    result = process_input(store, config, str(huge), 1)

    read = _input_stats(out, 1)["steps"][0]
    assert read["name"] == "read" and read["dropped"] == {"record_too_large": 1}
    assert result.docs_kept == without.docs_kept > 0
    assert _kept_urls(out, 1) == _kept_urls(out, 0)
    # Holding the record once (its bytes) would add RECORD_BYTES; the old reader added 2.5 GB.
    assert result.peak_rss_bytes < without.peak_rss_bytes + RECORD_BYTES, (result, without)
    assert _input_stats(out, 1)["peak_rss_bytes"] == result.peak_rss_bytes


def test_a_wrong_content_length_before_a_huge_line_is_read_through_in_pieces(tmp_path):
    """warcio reads the line after a record whole: here the rest of a 20 MB one-line body."""
    line_bytes = 20 << 20
    path = tmp_path / "badlength.warc.wet"
    with path.open("wb") as out:
        out.write(wet_record("https://a.example/0", english(0)))
        out.write(wet_record("https://a.example/1", b"z" * line_bytes, content_length=100))
        out.write(wet_record("https://a.example/2", english(2)))
    reader, peak = WetReader(), PeakRss()
    before = peak.bytes()
    docs = list(reader.read(str(path), 0))
    assert [d.url for d in docs] == ["https://a.example/0", "https://a.example/2"]
    assert reader.stats.dropped == {"bad_content_length": 1}
    assert peak.bytes() - before < line_bytes // 2


def _kept_urls(out: Path, index: int) -> list[str]:
    import pyarrow.parquet as pq

    return pq.read_table(out / layout.docs(index), columns=["url"]).column("url").to_pylist()


def test_a_pool_task_reports_its_own_peak_not_the_one_its_parent_reached_before_the_pool(tmp_path):
    """A spawned process starts with its parent's ru_maxrss (vfork + exec carries it over)."""
    first, second = _sample_inputs(tmp_path)
    ballast_bytes = 640 << 20  # far above what a worker process needs (~150 MB)
    ballast = b"x" * ballast_bytes  # every page written: resident
    del ballast
    out = tmp_path / "out"
    store, config = open_store(out), DataprepConfig(pipeline=["url_dedup"], minhash=FIXED_PARTITIONS)  # no model
    tasks = [InputTask(str(tmp_path / "a.warc.wet.gz"), 0), InputTask(str(tmp_path / "b.warc.wet.gz"), 1)]
    pool = PoolExecutor(store, config, processes=2)
    try:
        results = pool.run(tasks, on_result=lambda result: None)
    finally:
        pool.close()
    assert len(results) == 2 and all(r.docs_kept > 0 for r in results)
    for task in tasks:
        reported = _input_stats(out, task.index)["peak_rss_bytes"]
        assert 0 < reported < ballast_bytes, reported


def test_a_peak_starts_with_its_task_and_an_enclosing_one_keeps_the_peaks_inside_it():
    block_bytes = 256 << 20
    phase = PeakRss()
    task = PeakRss()
    block = b"x" * block_bytes
    del block
    next_task = PeakRss()
    assert task.bytes() >= block_bytes
    assert next_task.bytes() < task.bytes() - block_bytes // 2
    assert phase.bytes() >= task.bytes()  # although next_task reset the kernel's mark
