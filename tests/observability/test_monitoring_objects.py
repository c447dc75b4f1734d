"""The scrape objects and the collector configuration the chart ships: valid against the
upstream CRDs, selecting the right pods, with the fixed job names the rules select on."""

from __future__ import annotations

import pytest

from tests.helm_chart import crd_errors, find, render

JOBS = {"lmforge-inference", "lmforge-trainer", "lmforge-uploader"}


def job_of(monitor: dict) -> str:
    endpoints = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
    (relabel,) = [r for r in endpoints[0]["relabelings"] if r.get("targetLabel") == "job"]
    return relabel["replacement"]


def test_monitors_validate_and_carry_the_contract_job_names():
    objects = render({"monitoring": {"additionalLabels": {"release": "kube-prometheus-stack"}}})
    monitors = find(objects, "ServiceMonitor") + find(objects, "PodMonitor")
    assert {job_of(m) for m in monitors} == JOBS
    for monitor in monitors:
        assert crd_errors(monitor) == [], monitor["metadata"]["name"]
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ml"]}
    (inference,) = find(objects, "ServiceMonitor")
    assert inference["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "inference"
    (ready,) = [r for r in inference["spec"]["endpoints"][0]["relabelings"] if r.get("action") == "keep"]
    assert "__meta_kubernetes_endpoint_ready" in ready["sourceLabels"]  # not-ready pods are not targets
    trainer = find(objects, "PodMonitor", "lmforge-trainer")[0]
    # Only global rank 0 serves metrics: the PyTorchJob's Master or the TrainJob's completion index 0.
    (rank0,) = [r for r in trainer["spec"]["podMetricsEndpoints"][0]["relabelings"] if r.get("action") == "keep"]
    assert rank0["sourceLabels"] == ["__meta_kubernetes_pod_label_training_kubeflow_org_job_role",
                                     "__meta_kubernetes_pod_label_batch_kubernetes_io_job_completion_index"]
    assert rank0["regex"] == "master;.*|;0"


def test_a_broken_monitor_is_caught_by_the_crd_schema():
    (monitor,) = find(render(), "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["interval"] = 30  # the CRD wants a duration string
    assert any("interval" in error for error in crd_errors(monitor))


def test_monitors_can_be_turned_off():
    objects = render({"monitoring": {"serviceMonitors": {"enabled": False}}})
    assert find(objects, "ServiceMonitor") == [] and find(objects, "PodMonitor") == []


@pytest.fixture(scope="module")
def collector():
    from helm_python import Chart

    from tests.helm_chart import CHART

    return Chart.load(CHART).values["opentelemetry-collector"]


def test_collector_pipeline_is_complete_and_memory_limited_first(collector):
    config = collector["config"]
    assert collector["mode"] == "deployment" and collector["image"]["repository"]
    traces = config["service"]["pipelines"]["traces"]
    assert traces["receivers"] == ["otlp"] and set(config["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}
    assert traces["processors"][0] == "memory_limiter" and "batch" in traces["processors"]
    for kind in ("receivers", "processors", "exporters"):
        assert set(traces[kind]) <= set(config[kind]), kind
