"""Token spans: the union of [start, end) intervals. The trace search, the contamination report and the canary's
memorization measure (which speaks to the server over HTTP) all count covered tokens this one way."""

from __future__ import annotations

from collections.abc import Iterable


def covered_tokens(spans: Iterable[tuple[int, int]], min_length: int = 1) -> int:
    """Tokens inside the union of the [start, end) intervals at least `min_length` long."""
    covered, reach = 0, 0
    for start, end in sorted(s for s in spans if s[1] - s[0] >= min_length):
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return covered
