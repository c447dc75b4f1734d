"""Step 3: the data pipeline through kfp.local (the pipeline code Kubeflow runs): data-prep
workers in a ParallelFor, then dedup, tokenizer, shards and the report. The workers push their
counters to the Pushgateway (LMFORGE_PUSHGATEWAY)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from lmforge.demo.config import DataSection
from lmforge.demo.processes import Supervisor


@dataclass
class PreparedData:
    path: Path  # the data-prep output: manifest.json, shards/, tokenizer.json, report.html
    report: dict

    @property
    def funnel(self) -> list[tuple[str, int, int]]:
        """(stage, documents in, documents out) per stage."""
        return [(s["name"], s["docs_in"], s["docs_out"]) for s in self.report["stages"]]


def run_data_pipeline(supervisor: Supervisor, data: DataSection, workdir: Path, pushgateway: str) -> None:
    """Writes WORKDIR/data (the prepared data, with the WET files already in WORKDIR/data/wet) and
    WORKDIR/kfp (kfp.local's pipeline root)."""
    supervisor.run("data-pipeline", [
        sys.executable, "-m", "lmforge_pipelines.run_local", "--workdir", str(workdir), "--data-only",
        "--crawl", data.crawl, "--shards", str(data.wet_files), "--docs-per-shard", str(data.docs_per_file),
        "--workers", str(data.workers), "--languages", data.languages, "--vocab-size", str(data.vocab_size),
        "--shard-tokens", str(data.shard_tokens), "--val-fraction", str(data.val_fraction),
        *(["--trace-index"] if data.trace_index else [])],
        env={"LMFORGE_PUSHGATEWAY": pushgateway}, timeout=1800)


def read_prepared(path: Path) -> PreparedData:
    return PreparedData(path, json.loads((path / "report.json").read_text()))
