"""The report's account of a run's tasks (an input's filter pass, an input's tokenization, a shard
partition, a main process's part of a phase) in memory that does not grow with their number.

Tasks are added one row at a time and grouped by (phase, task kind). A group keeps its count, its
errors, the total and maximum of its seconds and peak RSS, a bounded sample of each for the
percentiles (every value up to SAMPLE_SIZE, then a seeded uniform reservoir), and the rows worth
reading: every row while the group has at most FULL_ROWS tasks; beyond that its first
MAX_ERROR_ROWS rows with an error, its NOTABLE slowest and its NOTABLE largest. So a run of
90,000 inputs and one of 9 give a report of about the same size, and the same rows come out
whatever order equal values arrive in (ties go to the earlier task).
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field

FULL_ROWS = 48  # a group with more tasks than this is summarised, not listed
NOTABLE = 10  # slowest and largest rows kept per summarised group
MAX_ERROR_ROWS = 20  # rows with an error kept per group (all are counted)
SAMPLE_SIZE = 1024  # values kept per group and measure for the percentiles
PERCENTILES = (50, 90, 99)


class BoundedSample:
    """At most `capacity` of the values added: all of them while they fit, then a uniform random
    sample of them (reservoir sampling, seeded: the same values in the same order keep the same)."""

    def __init__(self, capacity: int = SAMPLE_SIZE, seed: int = 0):
        self.capacity = capacity
        self.values: list[float] = []
        self.seen = 0
        self._rng = random.Random(seed)

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.values) < self.capacity:
            self.values.append(value)
            return
        slot = self._rng.randrange(self.seen)
        if slot < self.capacity:
            self.values[slot] = value

    def percentile(self, q: float) -> float:
        """The nearest-rank q-th percentile of the sample (0 when empty)."""
        if not self.values:
            return 0.0
        ordered = sorted(self.values)
        return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass
class TaskGroup:
    phase: str
    task: str
    tasks: int = 0
    errors: int = 0
    seconds_total: float = 0.0
    seconds_max: float = 0.0
    peak_rss_max: int = 0
    seconds: BoundedSample = field(default_factory=BoundedSample)
    peak_rss: BoundedSample = field(default_factory=BoundedSample)
    _first: list[tuple[int, dict]] = field(default_factory=list)
    _error_rows: list[tuple[int, dict]] = field(default_factory=list)
    _slowest: list[tuple[float, int, dict]] = field(default_factory=list)  # min-heaps: the smallest goes first
    _largest: list[tuple[float, int, dict]] = field(default_factory=list)

    def add(self, order: int, row: dict) -> None:
        seconds, rss = float(row.get("seconds") or 0.0), int(row.get("peak_rss_bytes") or 0)
        self.tasks += 1
        self.seconds_total += seconds
        self.seconds_max, self.peak_rss_max = max(self.seconds_max, seconds), max(self.peak_rss_max, rss)
        self.seconds.add(seconds)
        self.peak_rss.add(rss)
        if self.tasks <= FULL_ROWS:
            self._first.append((order, row))
        else:
            self._first.clear()  # summarised from now on: only the notable rows stay
        if row.get("error"):
            self.errors += 1
            if len(self._error_rows) < MAX_ERROR_ROWS:
                self._error_rows.append((order, row))
        _keep_top(self._slowest, (seconds, -order, row))
        _keep_top(self._largest, (rss, -order, row))

    @property
    def listed(self) -> list[tuple[int, dict]]:
        """(order, row) of the rows shown: all of them in a small group, else the notable ones."""
        if self.tasks <= FULL_ROWS:
            return self._first
        chosen = dict(self._error_rows)
        chosen.update((-negated, row) for _, negated, row in self._slowest + self._largest)
        return sorted(chosen.items(), key=lambda item: item[0])

    def summary(self) -> dict:
        listed = len(self.listed)
        return {
            "phase": self.phase,
            "task": self.task,
            "tasks": self.tasks,
            "errors": self.errors,
            "rows_listed": listed,
            "all_listed": listed == self.tasks,
            "seconds": {"total": round(self.seconds_total, 4), "max": self.seconds_max,
                        **{f"p{q}": self.seconds.percentile(q) for q in PERCENTILES}},
            "peak_rss_bytes": {"max": self.peak_rss_max,
                               **{f"p{q}": int(self.peak_rss.percentile(q)) for q in PERCENTILES}},
        }


def _keep_top(heap: list, item: tuple) -> None:
    """Keep the NOTABLE largest items of `heap` (a min-heap, so the smallest is the one dropped)."""
    if len(heap) < NOTABLE:
        heapq.heappush(heap, item)
    elif item[:2] > heap[0][:2]:
        heapq.heapreplace(heap, item)


class TaskSummary:
    """Every task row of a run, added one at a time; groups in the order they first appear."""

    def __init__(self) -> None:
        self.groups: dict[tuple[str, str], TaskGroup] = {}
        self._added = 0

    def add(self, row: dict, kind: str | None = None) -> None:
        """Add a task's row to the group of its phase and `kind` (default: its task name)."""
        key = (str(row.get("phase", "")), kind or str(row.get("task", "")))
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = TaskGroup(*key)
        group.add(self._added, row)
        self._added += 1

    def rows(self) -> list[dict]:
        """The rows shown (report.json's `workers`), in the order they were added."""
        listed = [item for group in self.groups.values() for item in group.listed]
        return [row for _, row in sorted(listed, key=lambda item: item[0])]

    def summaries(self) -> list[dict]:
        """One summary per group (report.json's `task_groups`)."""
        return [group.summary() for group in self.groups.values()]
