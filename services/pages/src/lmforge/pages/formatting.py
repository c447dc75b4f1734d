"""How lmforge's HTML pages write numbers, sizes, shares and durations (the data-prep report, the
training report, the demo's dashboards page). The pages' templates get them as filters
(lmforge.pages.html_pages); the pages' Python code calls them where it composes a text."""

from __future__ import annotations

import math
from typing import Any

SI_SUFFIXES = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"))
DECIMAL_BYTES = ("B", "kB", "MB", "GB", "TB")
BINARY_BYTES = ("B", "KiB", "MiB", "GiB", "TiB")


def to_finite(value: Any) -> float:
    """A finite float, whatever the input (None, strings, NaN and infinities become 0)."""
    try:
        result = float(value)
    except (TypeError, ValueError):
        return 0.0
    return result if math.isfinite(result) else 0.0


def count(value: Any) -> str:
    """An exact count with thousands separators: ``45,000``."""
    return f"{int(to_finite(value)):,}"


def si(value: Any, digits: int = 3) -> str:
    """A compact count with `digits` significant figures: ``4.95 M``, ``812 k``, ``42``."""
    number = to_finite(value)
    for divisor, suffix in SI_SUFFIXES:
        if abs(number) >= divisor:
            scaled = number / divisor
            decimals = max(0, digits - 1 - math.floor(math.log10(abs(scaled))))
            return f"{scaled:.{decimals}f} {suffix}"
    return f"{number:.0f}" if number == int(number) else f"{number:.1f}"


def number(value: float, digits: int = 3) -> str:
    """A measurement (loss, learning rate, a rate): `digits` significant figures, a suffix from
    1,000 on (``12.5 k``), scientific notation below 0.01 (``3.00e-04``)."""
    v = float(value)
    if not math.isfinite(v):
        return str(v)
    if v == 0:
        return "0"
    if abs(v) >= 1e3:
        return si(v, digits)
    if abs(v) < 1e-2:
        return f"{v:.{digits - 1}e}"
    return f"{v:.{digits}g}"


def percent(fraction: Any) -> str:
    """A fraction as a percentage with at most one decimal: ``5.7%``, ``90%``, ``<0.1%``."""
    value = to_finite(fraction) * 100
    if value == 0:
        return "0%"
    if abs(value) < 0.1:
        return "<0.1%"
    return f"{value:.1f}".removesuffix(".0") + "%"


def byte_size(value: Any, *, binary: bool = False, digits: int = 3) -> str:
    """Decimal units with one decimal (``123.5 MB``); `binary`: powers of 1024 with `digits`
    significant figures (``3 MiB``, as Grafana writes its `bytes` unit)."""
    size = to_finite(value)
    base, units = (1024, BINARY_BYTES) if binary else (1000, DECIMAL_BYTES)
    index = 0
    while abs(size) >= base and index < len(units) - 1:
        size, index = size / base, index + 1
    if binary:
        return f"{number(size, digits)} {units[index]}"
    return f"{size:.0f} B" if index == 0 else f"{size:.1f} {units[index]}"


def duration(seconds: Any) -> str:
    """A time span in words: ``250 ms``, ``12.5 s``, ``1 min 30 s``, ``2 h 5 min``."""
    value = to_finite(seconds)
    if value < 1:
        return f"{value * 1000:.0f} ms" if value else "0 s"
    if value < 60:
        return f"{value:.1f} s"
    if value < 3600:
        minutes, rest = divmod(round(value), 60)
        return f"{minutes} min {rest} s"
    hours, rest = divmod(round(value), 3600)
    return f"{hours} h {rest // 60} min"


def short_duration(seconds: float, digits: int = 3) -> str:
    """A time span as one number and a unit (axis ticks): ``250 ms``, ``45 s``, ``1.5 min``, ``2 h``."""
    value = float(seconds)
    if value != 0 and abs(value) < 1:
        return f"{number(value * 1000, digits)} ms"
    if abs(value) >= 3600:
        return f"{number(value / 3600, digits)} h"
    if abs(value) >= 60:
        return f"{number(value / 60, digits)} min"
    return f"{number(value, digits)} s"
