"""The project's Helm chart, rendered in-process with Helm's own Go SDK (helm-python-sdk): no
binary, no cluster. The demo takes its Prometheus rule file from it; the tests everything else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[5]
CHART = REPO_ROOT / "helm" / "lmforge"
RULES_KEY = "lmforge.rules.yaml"


def render(values: dict[str, Any] | None = None, release: str = "lmforge", namespace: str = "ml") -> list[dict]:
    """Every object the chart renders with `values`, parsed."""
    from helm_python import Chart

    manifests = Chart.load(CHART).render(values or {}, name=release, namespace=namespace, is_install=True)
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects += [obj for obj in yaml.safe_load_all(text) if obj]
    return objects


def find(objects: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def rule_file(values: dict[str, Any] | None = None, release: str = "lmforge") -> str:
    """The chart's alerting and recording rules as a plain Prometheus rule file (the text of its
    `<release>-prometheus-rules` ConfigMap)."""
    (configmap,) = find(render(values, release=release), "ConfigMap", f"{release}-prometheus-rules")
    return configmap["data"][RULES_KEY]
