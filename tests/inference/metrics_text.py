"""Reading one sample out of a Prometheus text exposition."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str, name: str) -> list:
    return [s for family in text_string_to_metric_families(text) for s in family.samples if s.name == name]


def sample_value(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 when there are none)."""
    wanted = labels or {}
    return sum(s.value for s in samples(text, name) if all(s.labels.get(k) == v for k, v in wanted.items()))
