"""The chart for the tests: rendered in-process (lmforge.demo.chart), and checked against the CRDs."""

from __future__ import annotations

from pathlib import Path

import yaml

from lmforge.demo.chart import CHART, find, render  # noqa: F401 - re-exported for the tests

CRDS = Path(__file__).resolve().parent / "crds"  # upstream CRDs, unmodified (crds/README.md)
CRD_FILES = {
    "PyTorchJob": "kubeflow.org_pytorchjobs.yaml",
    "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
    "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
}


def crd_errors(obj: dict) -> list[str]:
    """Where `obj` breaks the upstream CRD's openAPIV3Schema (tests/crds), as messages."""
    import jsonschema

    crd = yaml.safe_load((CRDS / CRD_FILES[obj["kind"]]).read_text())
    group, version = obj["apiVersion"].split("/")
    assert crd["spec"]["group"] == group, obj["apiVersion"]
    schema = next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version)
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(obj)]
