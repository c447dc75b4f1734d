"""Step 2: the WET files the data pipeline reads, placed where its fetch step looks for them
(<data>/wet/), so that step takes them: generated (`lmforge-sample-data --files N`), or the crawl's
first files (`lmforge-dataprep fetch`, needs network)."""

from __future__ import annotations

import gzip
import sys
from dataclasses import dataclass
from pathlib import Path

from lmforge.demo.config import DataSection
from lmforge.demo.processes import Supervisor
from lmforge_pipelines.component_bodies import SAMPLE_CRAWL, WET_DIR, WET_SUFFIX


@dataclass
class Corpus:
    files: list[Path]
    compressed_bytes: int
    text_bytes: int


def make_corpus(supervisor: Supervisor, data: DataSection, data_dir: Path) -> Corpus:
    wet_dir = data_dir / WET_DIR
    wet_dir.mkdir(parents=True, exist_ok=True)
    if data.crawl == SAMPLE_CRAWL:
        supervisor.run("sample-data", [sys.executable, "-m", "lmforge.sample_data", "--output", str(wet_dir),
                                       "--files", str(data.wet_files), "--docs", str(data.docs_per_file)])
    else:
        supervisor.run("fetch", [sys.executable, "-m", "lmforge.dataprep", "fetch", "--crawl", data.crawl,
                                 "--shards", str(data.wet_files), "--output", str(wet_dir)], timeout=3600)
    files = sorted(wet_dir.glob(f"*{WET_SUFFIX}"))
    return Corpus(files, sum(p.stat().st_size for p in files), sum(_text_bytes(p) for p in files))


def _text_bytes(path: Path) -> int:
    size = 0
    with gzip.open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            size += len(chunk)
    return size
