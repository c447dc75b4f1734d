"""Per-step counters (documents and bytes in/out, drops per reason, extra counts, seconds,
score histograms, a few examples of kept and removed documents) and a task's peak memory."""

from __future__ import annotations

import bisect
import resource
import sys
import weakref
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

EXAMPLES_PER_SIDE = 5
EXAMPLE_CHARS = 300
_MASK64 = (1 << 64) - 1


def _example_rank(doc_id: int) -> int:
    """A fixed pseudo-random rank per document (a 64-bit multiplicative hash of its id): the
    examples kept are the lowest ranks, a uniform sample that merges across inputs by keeping the
    lowest ranks again (a bottom-k sketch), so the report shows the same ones however the run was split."""
    return ((doc_id + 1) * 0x9E3779B97F4A7C15) & _MASK64


@dataclass
class StepStats:
    name: str
    docs_in: int = 0
    docs_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    dropped: Counter = field(default_factory=Counter)  # reason -> documents dropped
    counters: Counter = field(default_factory=Counter)  # extra counts (pii kinds, eval-set hits, ...)
    # score name -> {"edges": [...], "counts": [...] (one per bin, out-of-range values in the end bins)}
    histograms: dict[str, dict[str, list]] = field(default_factory=dict)
    # "kept" / "removed" -> up to EXAMPLES_PER_SIDE {"rank", "doc_id", "url", "reason", "preview"}
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {"kept": [], "removed": []})

    def add_score(self, key: str, value: float, edges: tuple[float, ...]) -> None:
        histogram = self.histograms.get(key)
        if histogram is None:
            histogram = self.histograms[key] = {"edges": list(edges), "counts": [0] * (len(edges) - 1)}
        bins = len(histogram["counts"])
        histogram["counts"][min(max(bisect.bisect_right(histogram["edges"], value) - 1, 0), bins - 1)] += 1

    def add_example(self, side: str, doc, reason: str | None = None) -> None:
        chosen = self.examples.setdefault(side, [])
        rank = _example_rank(doc.doc_id)
        if len(chosen) >= EXAMPLES_PER_SIDE and rank >= chosen[-1]["rank"]:
            return
        chosen.append({"rank": rank, "doc_id": doc.doc_id, "url": doc.url, "reason": reason,
                       "preview": doc.text[:EXAMPLE_CHARS]})
        chosen.sort(key=lambda example: example["rank"])
        del chosen[EXAMPLES_PER_SIDE:]

    @property
    def docs_dropped(self) -> int:
        return sum(self.dropped.values())

    def merge(self, other: StepStats) -> StepStats:
        self.docs_in += other.docs_in
        self.docs_out += other.docs_out
        self.bytes_in += other.bytes_in
        self.bytes_out += other.bytes_out
        self.seconds += other.seconds
        self.dropped.update(other.dropped)
        self.counters.update(other.counters)
        for key, theirs in other.histograms.items():
            mine = self.histograms.setdefault(key, {"edges": theirs["edges"], "counts": [0] * len(theirs["counts"])})
            mine["counts"] = [a + b for a, b in zip(mine["counts"], theirs["counts"], strict=True)]
        for side, theirs in other.examples.items():
            chosen = sorted(self.examples.get(side, []) + theirs, key=lambda example: example["rank"])
            self.examples[side] = chosen[:EXAMPLES_PER_SIDE]
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "docs_in": self.docs_in,
            "docs_out": self.docs_out,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "seconds": round(self.seconds, 6),
            "dropped": dict(sorted(self.dropped.items())),
            "counters": dict(sorted(self.counters.items())),
            "histograms": self.histograms,
            "examples": self.examples,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepStats:
        return cls(
            name=data["name"],
            docs_in=data.get("docs_in", 0),
            docs_out=data.get("docs_out", 0),
            bytes_in=data.get("bytes_in", 0),
            bytes_out=data.get("bytes_out", 0),
            seconds=data.get("seconds", 0.0),
            dropped=Counter(data.get("dropped", {})),
            counters=Counter(data.get("counters", {})),
            histograms={key: {"edges": list(h["edges"]), "counts": list(h["counts"])}
                        for key, h in data.get("histograms", {}).items()},
            examples={side: list(items) for side, items in data.get("examples", {"kept": [], "removed": []}).items()},
        )


def merge_stats(groups: Iterable[list[dict[str, Any]]]) -> list[StepStats]:
    """Merge per-input lists of step stats (same step order) into one list, one group at a time
    (a generator of groups keeps memory to the merged stats: StepStats.merge keeps the bottom-k examples)."""
    merged: dict[str, StepStats] = {}
    for group in groups:
        for item in group:
            stats = StepStats.from_dict(item)
            if stats.name in merged:
                merged[stats.name].merge(stats)
            else:
                merged[stats.name] = stats
    return list(merged.values())


class PeakRss:
    """This process's peak resident memory from the moment the PeakRss is made: a task's or a
    phase's own figure.

    getrusage's ru_maxrss will not do: a spawned pool process starts with its parent's high-water
    mark (vfork + exec carries it over) and keeps the peaks of every task it ran before. Linux
    keeps a high-water mark per address space too (VmHWM in /proc/self/status: a process's own
    since its exec), which writing "5" to /proc/self/clear_refs resets to the current RSS. A
    PeakRss resets it when made and reads it; a reset hands the mark it clears to every PeakRss
    still open, so a phase's figure keeps the peaks of the tasks run inside it. Where the mark
    cannot be reset (a read-only /proc) the figure is the process's peak since its exec; without
    /proc (macOS), ru_maxrss."""

    _open: weakref.WeakSet[PeakRss] = weakref.WeakSet()

    def __init__(self) -> None:
        self._cleared = 0  # the highest mark reset while this one was open
        mark = _high_water_mark()
        try:
            with open(_CLEAR_REFS, "w") as clear_refs:
                clear_refs.write("5")
        except OSError:
            pass
        else:
            for other in PeakRss._open:
                other._cleared = max(other._cleared, mark)
        PeakRss._open.add(self)

    def bytes(self) -> int:
        return max(self._cleared, _high_water_mark())


_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def _high_water_mark() -> int:
    """VmHWM in bytes; ru_maxrss where there is no /proc."""
    try:
        with open(_STATUS, "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_maxrss if sys.platform == "darwin" else usage.ru_maxrss * 1024  # Linux: KiB
