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


CRDS = Path(__file__).resolve().parents[2] / "shared" / "crds"
CRD_FILES = {
    "PyTorchJob": "kubeflow.org_pytorchjobs.yaml",
    "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
    "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
}


def crd_errors(obj: dict) -> list[str]:
    """Where `obj` breaks the upstream CRD's openAPIV3Schema (../shared/crds), as messages."""
    import jsonschema

    crd = yaml.safe_load((CRDS / CRD_FILES[obj["kind"]]).read_text())
    group, version = obj["apiVersion"].split("/")
    assert crd["spec"]["group"] == group, obj["apiVersion"]
    schema = next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version)
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(obj)]
