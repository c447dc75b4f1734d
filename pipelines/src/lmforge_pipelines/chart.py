"""The lmforge Helm chart, rendered in-process with Helm's own Go SDK (helm-python-sdk): no helm
binary, no cluster. The training launcher renders the run's training job from it; the demo takes
its Prometheus rules from it; the tests everything else.

The chart is found at $LMFORGE_CHART_DIR (the trainer image copies helm/lmforge there), else in
the repository this package is checked out in (helm/lmforge).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

CHART_DIR_ENV = "LMFORGE_CHART_DIR"
_CHECKOUT_CHART = Path(__file__).resolve().parents[3] / "helm" / "lmforge"


def chart_dir() -> Path:
    """$LMFORGE_CHART_DIR, else the checkout's helm/lmforge; it must hold a Chart.yaml."""
    configured = os.environ.get(CHART_DIR_ENV)
    path = Path(configured) if configured else _CHECKOUT_CHART
    if not (path / "Chart.yaml").is_file():
        where = f"${CHART_DIR_ENV} is {configured!r}" if configured else f"${CHART_DIR_ENV} is not set"
        raise FileNotFoundError(f"the lmforge chart is not at {path} ({where}): point {CHART_DIR_ENV} at a copy "
                                "of helm/lmforge")
    return path


def chart_defaults(chart: Path | None = None) -> dict[str, Any]:
    """The chart's values.yaml."""
    return yaml.safe_load(((chart or chart_dir()) / "values.yaml").read_text(encoding="utf-8"))


def render(values: dict[str, Any] | None = None, release: str = "lmforge", namespace: str = "ml",
           chart: Path | None = None) -> list[dict]:
    """Every object the chart renders with `values` (as `helm install` would), parsed. Raises
    helm_python's HelmValuesError / HelmRenderError (with the chart's message) on bad values."""
    from helm_python import Chart

    manifests = Chart.load(chart or chart_dir()).render(values or {}, name=release, namespace=namespace,
                                                        is_install=True)
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects += [obj for obj in yaml.safe_load_all(text) if obj]
    return objects


def find(objects: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
