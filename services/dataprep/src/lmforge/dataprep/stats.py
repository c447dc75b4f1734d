"""Per-step counters (documents and bytes in/out, drops per reason, extra counts, seconds)
and the process's peak memory."""

from __future__ import annotations

import resource
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


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
        )


def merge_stats(groups: list[list[dict[str, Any]]]) -> list[StepStats]:
    """Merge per-input lists of step stats (same step order) into one list."""
    merged: dict[str, StepStats] = {}
    for group in groups:
        for item in group:
            stats = StepStats.from_dict(item)
            if stats.name in merged:
                merged[stats.name].merge(stats)
            else:
                merged[stats.name] = stats
    return list(merged.values())


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_maxrss if sys.platform == "darwin" else usage.ru_maxrss * 1024  # Linux: KiB
