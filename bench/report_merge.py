#!/usr/bin/env python3
"""How fast the report folds the per-input step stats of a big run together, and how much memory
it holds: N input summaries as the workers write them (8 steps, each with a score histogram
and 5 kept and 5 removed examples of 300 characters) in a local output directory, read and
merged the way build_report does (report._step_lists + stats.merge_stats: one input at a time,
the bottom-k examples kept).

    .venv/bin/python bench/report_merge.py --inputs 20000
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time

from lmforge.common.local_store import LocalStore
from lmforge.dataprep import layout
from lmforge.dataprep.document import Document
from lmforge.dataprep.report import _step_lists
from lmforge.dataprep.stats import StepStats, merge_stats

STEPS = ["read", "url_dedup", "exact_dedup", "langid", "gopher_repetition", "gopher_quality", "classifier", "minhash"]
EDGES = tuple(i / 20 for i in range(21))


def input_summary(i: int) -> dict:
    steps = []
    for name in STEPS:
        stats = StepStats(name, docs_in=1000, docs_out=900, bytes_in=4_000_000, bytes_out=3_600_000, seconds=0.5)
        stats.dropped["some_reason"] = 100
        for j in range(40):
            doc = Document(i * 1000 + j, f"https://site{j}.example/{i}/{j}", "lorem ipsum dolor sit amet " * 12)
            stats.add_example("kept" if j % 2 else "removed", doc, None if j % 2 else "some_reason")
            stats.add_score("score", j / 40, EDGES)
        steps.append(stats.to_dict())
    return {"input": f"in-{i}.warc.wet.gz", "input_index": i, "input_bytes": 1_000_000, "docs_kept": 900,
            "seconds": 1.0, "peak_rss_bytes": 1, "error": None, "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=20000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = LocalStore(tmp)
        templates = [json.dumps(input_summary(i)) for i in range(100)]
        for i in range(args.inputs):
            store.write_text(layout.input_stats(i), templates[i % len(templates)])
        size = sum(len(templates[i % len(templates)]) for i in range(args.inputs))
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        started = time.perf_counter()
        summaries: list[dict] = []
        merged = merge_stats(_step_lists(store, [layout.input_stats(i) for i in range(args.inputs)], summaries))
        seconds = time.perf_counter() - started
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    examples = max(len(s.examples.get(side, [])) for s in merged for side in ("kept", "removed"))
    print(json.dumps({"inputs": args.inputs, "stats_json_bytes": size, "seconds": round(seconds, 2),
                      "inputs_per_second": round(args.inputs / seconds),
                      "peak_rss_growth_bytes": rss_after - rss_before,
                      "max_examples_per_side": examples}))


if __name__ == "__main__":
    main()
