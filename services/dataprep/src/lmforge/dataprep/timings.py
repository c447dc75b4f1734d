"""Wall-clock, CPU time and peak memory of each phase of a run, as the processes that ran it
recorded them.

Every process that does work in a phase writes one record when its part of the phase ends,
work/timings/<phase>/<host>-<pid>-<start µs>.json: start and end (epoch seconds), CPU seconds
(its own and those of the tasks its pool processes ran for it) and its own peak RSS over the phase
(stats.PeakRss; the pool processes report theirs per task). A phase's wall-clock is the length of
the union of its records' intervals: Indexed-Job pods working side by side count once, and a rerun
after a crash adds its own time.
A process killed mid-phase leaves no record, and a rerun with nothing left to do writes none.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import time
from collections.abc import Iterator

from lmforge.common.store import Store
from lmforge.dataprep.layout import TIMINGS
from lmforge.dataprep.stages import STAGES
from lmforge.dataprep.stats import PeakRss

# Phase → what it does, in run order: the stages (stages.py).
PHASES: dict[str, str] = {stage.name: stage.help for stage in STAGES}


# CPU seconds of the tasks this process handed to its pool processes, as each task reported its
# own when it ended (executor.py). A local run's pool lives across phases, so the pool processes'
# rusage (RUSAGE_CHILDREN) arrives only when the pool is shut down, after the last phase.
_pool_task_cpu = 0.0


def add_pool_task_cpu(seconds: float) -> None:
    global _pool_task_cpu
    _pool_task_cpu += seconds


def process_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu_seconds() -> float:
    return process_cpu_seconds() + _pool_task_cpu


@contextlib.contextmanager
def timed_phase(store: Store, phase: str, items: int) -> Iterator[dict]:
    """Time the block as this process's part of `phase`, doing `items` units of work (0: nothing
    to do, no record). The yielded dict is written with the record: add fields to it."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}")
    started, clock, cpu, peak = time.time(), time.perf_counter(), _cpu_seconds(), PeakRss()
    record: dict = {"items": items}
    yield record
    if items <= 0:
        return
    record.update({
        "phase": phase,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": round(started, 6),
        "ended": round(started + time.perf_counter() - clock, 6),
        "cpu_seconds": round(_cpu_seconds() - cpu, 4),
        "peak_rss_bytes": peak.bytes(),
    })
    name = f"{TIMINGS}/{phase}/{record['host']}-{record['pid']}-{int(started * 1e6)}.json"
    store.write_text(name, json.dumps(record, indent=1, sort_keys=True))


def read_timings(store: Store) -> list[dict]:
    """Every phase record of the run, oldest first."""
    records = [json.loads(store.read_text(rel)) for rel in store.list(TIMINGS + "/") if rel.endswith(".json")]
    return sorted(records, key=lambda r: (r["started"], r["phase"]))


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals: overlapping time counts once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def phase_summary(records: list[dict]) -> dict[str, dict]:
    """Per phase, in run order: wall-clock (union of intervals), CPU seconds, processes, main peak RSS."""
    summary = {}
    for phase in PHASES:
        mine = [r for r in records if r["phase"] == phase]
        summary[phase] = {
            "wall_seconds": round(union_seconds([(r["started"], r["ended"]) for r in mine]), 4),
            "cpu_seconds": round(sum(r["cpu_seconds"] for r in mine), 4),
            "processes": len(mine),
            "peak_rss_bytes": max((r["peak_rss_bytes"] for r in mine), default=0),
        }
    return summary
