"""The chart rendered in-process with Helm's own Go SDK (helm-python-sdk): no binary, no cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "helm" / "lmforge"


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
