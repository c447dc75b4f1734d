"""Axis scales for the inline SVG charts of lmforge's self-contained HTML pages (the training
report, the demo's dashboards page): round ticks, the y range, the digits a tick label needs."""

from __future__ import annotations

import math


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About `count` ticks between lo and hi at a round step (1, 2, 2.5 or 5 times a power of ten)."""
    raw = (hi - lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def y_range(values: list[float], pad: float = 0.05) -> tuple[float, float]:
    """The y axis for `values`: padded by a fraction of their span, starting at 0 rather than
    just below it for non-negative data, and a band around a constant series."""
    lo, hi = min(values), max(values)
    if lo == hi:
        margin = abs(lo) * 0.1 or 1.0
        return lo - margin, hi + margin
    margin = (hi - lo) * pad
    return (0.0 if lo >= 0 and lo - margin < 0 else lo - margin), hi + margin


def tick_digits(ticks: list[float], least: int = 3) -> int:
    """Significant digits that write `ticks` apart: from the largest tick's magnitude down to
    the step's (5,000 and 5,005 need four), and at least `least`."""
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else 0.0
    top = max((abs(t) for t in ticks), default=0.0)
    if step == 0 or top == 0:
        return least
    return max(least, math.floor(math.log10(top)) - math.floor(math.log10(step)) + 1)
