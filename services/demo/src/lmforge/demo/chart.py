"""The project's Helm chart, rendered in-process (lmforge_pipelines.chart: Helm's own Go SDK, no
binary, no cluster). The demo takes its Prometheus rule file from it; the tests everything else."""

from __future__ import annotations

from typing import Any

from lmforge_pipelines.chart import chart_dir, find, render

CHART = chart_dir()
RULES_KEY = "lmforge.rules.yaml"

__all__ = ["CHART", "RULES_KEY", "find", "render", "rule_file"]


def rule_file(values: dict[str, Any] | None = None, release: str = "lmforge") -> str:
    """The chart's alerting and recording rules as a plain Prometheus rule file (the text of its
    `<fullname>-prometheus-rules` ConfigMap, found by its key whatever the name overrides)."""
    (configmap,) = [c for c in find(render(values, release=release), "ConfigMap") if RULES_KEY in c.get("data", {})]
    return configmap["data"][RULES_KEY]
