#!/usr/bin/env python3
"""How long refreshing the training report blocks rank 0 at a committed checkpoint, by the
length of the run: drawing inline (write_report, what the trainer did first) against the
ReportRefresher (the draw runs in a thread; the loop only requests it), side by side on the
same synthetic metrics.jsonl (one step record per 10 steps, a checkpoint per 1,000 steps).

    .venv/bin/python bench/report_stall.py [--records 10000 100000]

Prints a Markdown table: seconds the caller is blocked, median of --rounds.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from lmforge.trainer.report_html import ReportRefresher, write_report


def synthetic_run(run_dir: Path, records: int) -> None:
    rng = random.Random(0)
    with open(run_dir / "metrics.jsonl", "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"kind": "start", "attempt": 1, "timestamp": 0, "resumed_from": None, "first_step": 0,
                             "steps": records * 10, "world_size": 8, "restart_count": 0}) + "\n")
        for step in range(0, records * 10, 10):
            fh.write(json.dumps({"kind": "step", "attempt": 1, "step": step, "loss": 3 + rng.random(), "lr": 3e-4,
                                 "grad_norm": 1.0, "tokens_per_second": 1e6, "mfu": 0.4, "timestamp": step}) + "\n")
            if step % 1000 == 0:
                fh.write(json.dumps({"kind": "checkpoint", "attempt": 1, "step": step, "timestamp": step}) + "\n")


def blocked_seconds(fn, *args) -> float:
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("| step records | inline draw (s) | ReportRefresher.request() (s) |")
    print("|---|---|---|")
    for records in args.records:
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp)
            synthetic_run(run_dir, records)
            inline, requested = [], []
            for _ in range(args.rounds):
                inline.append(blocked_seconds(write_report, run_dir))
                refresher = ReportRefresher(run_dir, on_error=print)
                requested.append(blocked_seconds(refresher.request))
                refresher.close()  # (the thread's draw and the final one, outside the timing)
            print(f"| {records:,} | {statistics.median(inline):.3f} | {statistics.median(requested):.5f} |")


if __name__ == "__main__":
    main()
