"""The chart for the tests: rendered in-process (lmforge_pipelines.chart), and checked against the CRDs."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml

from lmforge_pipelines.chart import chart_dir, find, render  # noqa: F401 - re-exported for the tests

CHART = chart_dir()

CRDS = Path(__file__).resolve().parent / "crds"  # upstream CRDs, unmodified (crds/README.md)
CRD_FILES = {
    "PyTorchJob": "kubeflow.org_pytorchjobs.yaml",
    "TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
    "TrainingRuntime": "trainer.kubeflow.org_trainingruntimes.yaml",
    "ClusterTrainingRuntime": "trainer.kubeflow.org_clustertrainingruntimes.yaml",
    "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
    "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
}


def crd_errors(obj: dict) -> list[str]:
    """Where `obj` breaks the upstream CRD's openAPIV3Schema (tests/crds), as messages."""
    validator = _validator(obj["kind"], obj["apiVersion"])
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(obj)]


@cache
def _validator(kind: str, api_version: str):
    """The CRD's schema (some are over half a megabyte of YAML: parsed once per session)."""
    import jsonschema

    crd = yaml.load((CRDS / CRD_FILES[kind]).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group, api_version
    schema = next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version)
    return jsonschema.Draft7Validator(schema)
