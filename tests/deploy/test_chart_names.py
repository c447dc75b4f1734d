"""Names of what the chart renders: nameOverride / fullnameOverride rename every object, and
every reference between them (selectors, bindings, URLs, volumes) follows; with neither set the
names are <release>-<component> as before. Run objects (the data-prep Jobs) are named per run, so
an upgrade that starts another run never changes an existing Job's immutable template."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest
import yaml
from helm_python import Chart

from lmforge.dataprep.stages import DEFAULT_MAX_ROUNDS, GLOBAL_STAGES, ROUNDS
from tests.deploy.chart_values import (
    KUBE_VERSION,
    MULTI_NODE_GPU,
    NAMESPACE,
    container,
    containers,
    pod_specs,
    pod_templates,
)
from tests.helm_chart import CHART, CRD_FILES, crd_errors, find, render

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Everything the chart can render at once: the platform, a data-prep run and a training run
# (a PyTorchJob, or a Trainer v2 TrainJob with its TrainingRuntime).
EVERYTHING = {**MULTI_NODE_GPU, "dataprep": {**MULTI_NODE_GPU["dataprep"], "run": "cc-2024-22"}}
OPERATORS = {
    "pytorchjob": EVERYTHING,
    "trainjob": {**EVERYTHING, "training": {
        "enabled": True, "operator": "trainjob", "run": "v2-run", "nodes": 2, "nprocPerNode": 4, "gpusPerProcess": 1,
        "checkpoints": {"persistentVolumeClaim": "lmforge-checkpoints"}, "scheduling": {"kueue": {"queueName": "ml"}}}},
}
# The metrics' job labels: fixed, so the rules, dashboards and the demo select on them whatever the names.
METRIC_JOBS = {"lmforge-inference", "lmforge-trainer", "lmforge-uploader"}

# (release, overrides, the expected prefix of every name, the expected app.kubernetes.io/name)
RENAMES = [
    ("lmforge", {"fullnameOverride": "llm"}, "llm", "lmforge"),
    ("prod", {"nameOverride": "forge"}, "prod-forge", "forge"),
    ("forge-prod", {"nameOverride": "forge"}, "forge-prod", "forge"),  # the release contains the name
    ("prod", {"nameOverride": "forge", "fullnameOverride": "serving"}, "serving", "forge"),
]


def _render(values: dict, release: str = "lmforge") -> list[dict]:
    return render(values, release=release, namespace=NAMESPACE)


def _upgrade(values: dict, release: str = "lmforge") -> list[dict]:
    manifests = Chart.load(CHART).render(values, name=release, namespace=NAMESPACE, revision=2, is_upgrade=True)
    return [o for path, text in sorted(manifests.items()) if not path.endswith("NOTES.txt")
            for o in yaml.safe_load_all(text) if o]


def _pod_labels(obj: dict) -> list[dict]:
    return [template["metadata"]["labels"] for _, template in pod_templates(obj)]


def _selects(selector: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    return all(labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", []))


def _strings(node, skip=("command",)):
    """Every string in an object, except under the keys in `skip` (commands name CLIs, not objects)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key not in skip:
                yield from _strings(value, skip)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item, skip)
    elif isinstance(node, str):
        yield node


def _references(obj: dict):
    """The strings of an object that may name other objects: not the rules' and dashboards'
    queries and the monitors' job relabelings, which use the fixed metric job labels."""
    if obj["kind"] == "PrometheusRule":
        return
    if obj["kind"] == "ConfigMap":
        yield from _strings(obj["metadata"])
        return
    if obj["kind"] in ("ServiceMonitor", "PodMonitor"):
        obj = {**obj, "spec": {k: v for k, v in obj["spec"].items() if k not in ("endpoints", "podMetricsEndpoints")}}
    yield from _strings(obj)


# -- defaults ----------------------------------------------------------------------------------


def test_without_overrides_names_are_release_and_component_as_before():
    objects = _render(EVERYTHING, release="prod")
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {("Deployment", "prod-inference"), ("Service", "prod-inference"), ("ServiceAccount", "prod-workloads"),
            ("ServiceAccount", "prod-pipeline-runner"), ("CronJob", "prod-canary"), ("NetworkPolicy", "prod-batch"),
            ("ConfigMap", "prod-prometheus-rules"), ("PrometheusRule", "prod-rules")} <= names
    assert all(o["metadata"]["name"].startswith("prod-") for o in objects)
    assert {o["metadata"]["labels"]["app.kubernetes.io/name"] for o in objects} == {"lmforge"}


# -- overrides ---------------------------------------------------------------------------------


@pytest.mark.parametrize("operator", sorted(OPERATORS))
@pytest.mark.parametrize("release, overrides, prefix, app_name", RENAMES, ids=[p for *_, p, _ in RENAMES])
def test_overrides_rename_every_object_and_no_reference_is_left_behind(release, overrides, prefix, app_name,
                                                                       operator):
    defaults = _render(OPERATORS[operator], release=release)
    default_names = {o["metadata"]["name"] for o in defaults}
    objects = _render({**OPERATORS[operator], **overrides}, release=release)
    assert len(objects) == len(defaults) > 20
    for obj in objects:
        name = obj["metadata"]["name"]
        assert name.startswith(f"{prefix}-") and DNS_LABEL.match(name) and len(name) <= 63, name
        assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == app_name, name
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == release, name
        for labels in _pod_labels(obj):
            assert labels["app.kubernetes.io/name"] == app_name, name
    # No string in any object still names an object by its default name.
    stale = default_names - {o["metadata"]["name"] for o in objects}
    assert stale or prefix == release
    for obj in objects:
        tokens = {t for s in _references(obj) for t in re.split(r"[^A-Za-z0-9-]+", s)}
        assert not tokens & stale, (obj["kind"], obj["metadata"]["name"], sorted(tokens & stale))


@pytest.mark.parametrize("operator", sorted(OPERATORS))
@pytest.mark.parametrize("release, overrides, prefix, app_name", RENAMES, ids=[p for *_, p, _ in RENAMES])
def test_overrides_keep_selectors_bindings_and_endpoints_consistent(release, overrides, prefix, app_name, operator):
    objects = _render({**OPERATORS[operator], **overrides}, release=release)
    (deployment,) = find(objects, "Deployment", f"{prefix}-inference")
    (service,) = find(objects, "Service", f"{prefix}-inference")
    inference_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert _selects(deployment["spec"]["selector"], inference_labels)
    assert _selects({"matchLabels": service["spec"]["selector"]}, inference_labels)
    (monitor,) = find(objects, "ServiceMonitor")
    assert _selects(monitor["spec"]["selector"], service["metadata"]["labels"])
    (pdb,) = find(objects, "PodDisruptionBudget")
    assert _selects(pdb["spec"]["selector"], inference_labels)
    (hpa,) = find(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    for constraint in deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]:
        assert _selects(constraint["labelSelector"], inference_labels)

    workloads = [o for o in objects if pod_specs(o)]
    trainer_pods = [labels for o in workloads for labels in _pod_labels(o)
                    if labels.get("app.kubernetes.io/component") == "trainer"]
    assert trainer_pods
    for pod_monitor in find(objects, "PodMonitor"):
        assert any(_selects(pod_monitor["spec"]["selector"], labels) for labels in trainer_pods), \
            pod_monitor["metadata"]["name"]
    # The metrics' job labels do not follow the names: the rules and dashboards select on them.
    jobs = {r["replacement"] for m in find(objects, "ServiceMonitor") + find(objects, "PodMonitor")
            for e in m["spec"].get("endpoints", []) + m["spec"].get("podMetricsEndpoints", [])
            for r in e["relabelings"] if r.get("targetLabel") == "job"}
    assert jobs == METRIC_JOBS

    policies = find(objects, "NetworkPolicy")
    for obj in workloads:
        for labels in _pod_labels(obj):
            assert any(_selects(p["spec"]["podSelector"], labels) for p in policies), obj["metadata"]["name"]
    (inference_policy,) = find(objects, "NetworkPolicy", f"{prefix}-inference")
    (cron,) = find(objects, "CronJob")
    canary_labels = cron["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    assert _selects(inference_policy["spec"]["podSelector"], inference_labels)
    assert any(_selects(peer["podSelector"], canary_labels)
               for rule in inference_policy["spec"]["ingress"] for peer in rule["from"] if "podSelector" in peer)

    accounts = {sa["metadata"]["name"] for sa in find(objects, "ServiceAccount")}
    assert accounts == {f"{prefix}-workloads", f"{prefix}-pipeline-runner"}
    (role,) = find(objects, "Role")
    (binding,) = find(objects, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert {s["name"] for s in binding["subjects"]} == {f"{prefix}-pipeline-runner"}
    names = {o["metadata"]["name"] for o in objects}
    for rule in role["rules"]:
        assert set(rule.get("resourceNames", [])) <= names, rule
    for obj in workloads:
        for where, pod in pod_specs(obj):
            assert pod["serviceAccountName"] == f"{prefix}-workloads", where
            for volume in pod.get("volumes", []):
                if "configMap" in volume:
                    assert find(objects, "ConfigMap", volume["configMap"]["name"]), where

    args = container(cron["spec"]["jobTemplate"]["spec"]["template"]["spec"], "canary")["args"]
    assert args[args.index("--endpoint") + 1] == f"http://{service['metadata']['name']}:8000"


@pytest.mark.parametrize("operator", sorted(OPERATORS))
@pytest.mark.parametrize("release, overrides, prefix, app_name", RENAMES, ids=[p for *_, p, _ in RENAMES])
def test_renamed_objects_validate_against_kubernetes_and_the_crds(release, overrides, prefix, app_name, operator):
    for obj in _render({**OPERATORS[operator], **overrides}, release=release):
        label = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in CRD_FILES:
            assert crd_errors(obj) == [], label
        else:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_the_rules_keep_selecting_the_fixed_metric_jobs_whatever_the_names():
    from lmforge.demo.chart import rule_file

    rules = rule_file({"fullnameOverride": "llm", "nameOverride": "forge"}, release="prod")
    assert rules == rule_file({}, release="prod")  # the rules do not depend on names at all
    assert set(re.findall(r'job="([a-z-]+)"', rules)) >= {"lmforge-inference", "lmforge-trainer"}


def test_long_names_are_cut_to_dns_labels():
    objects = _render({**EVERYTHING, "fullnameOverride": "x" * 63,
                       "dataprep": {**EVERYTHING["dataprep"], "run": "r" * 40}})
    for obj in objects:
        name = obj["metadata"]["name"]
        assert DNS_LABEL.match(name) and len(name) <= 63, name
    # The fullname is cut, not the component: no two objects of a kind share a name.
    kinds_names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(set(kinds_names)) == len(kinds_names)
    assert {n.rsplit("-", 1)[-1] for k, n in kinds_names if k == "NetworkPolicy"} == {"inference", "trainer", "batch"}


def test_dependency_services_follow_their_own_name_overrides():
    values = {"canary": {"enabled": True}, "prometheus-pushgateway": {"enabled": True, "fullnameOverride": "pgw"},
              "opentelemetry-collector": {"enabled": True, "nameOverride": "otel"}}
    objects = _render({**values, "fullnameOverride": "llm"}, release="prod")
    (deployment,) = find(objects, "Deployment")
    env = container(deployment["spec"]["template"]["spec"], "inference")["env"]
    assert {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://prod-otel:4318"} in env
    (cron,) = find(objects, "CronJob")
    args = container(cron["spec"]["jobTemplate"]["spec"]["template"]["spec"], "canary")["args"]
    assert args[args.index("--pushgateway") + 1] == "http://pgw:9091"
    # Without overrides, the dependency charts' <release>-<chart> (as their own fullname helpers).
    (cron,) = find(_render({}, release="prod"), "CronJob")
    args = container(cron["spec"]["jobTemplate"]["spec"]["template"]["spec"], "canary")["args"]
    assert args[args.index("--pushgateway") + 1] == "http://prod-prometheus-pushgateway:9091"


@pytest.mark.parametrize("value", ["Has_Caps", "-dash", "x" * 64])
def test_the_schema_rejects_names_that_are_not_dns_labels(value):
    chart = Chart.load(CHART)
    for key in ("nameOverride", "fullnameOverride"):
        with pytest.raises(Exception, match=key):
            chart.validate_schema({key: value})


# -- runs ----------------------------------------------------------------------------------------


def _dataprep_jobs(objects: list[dict]) -> dict[str, dict]:
    return {j["metadata"]["name"]: j for j in find(objects, "Job")
            if j["metadata"]["labels"]["app.kubernetes.io/component"] == "dataprep"}


def _dataprep(**settings) -> dict:
    return {"dataprep": {"enabled": True, "workers": 4, "parallelism": 2, **settings}}


# trace-index's Job exists only with config trace_index.enabled (test_chart_trace.py).
ROLES = ("workers", *(f"{s.name}-{r:02d}" if s.kind == ROUNDS else s.name for s in GLOBAL_STAGES
                     for r in range(DEFAULT_MAX_ROUNDS if s.kind == ROUNDS else 1) if s.name != "trace-index"))


def test_dataprep_jobs_are_named_after_the_run_default_the_output():
    jobs = _dataprep_jobs(_render(_dataprep(output="s3://lmforge/datasets/CC-MAIN-2024-22/")))
    assert set(jobs) == {f"lmforge-dataprep-cc-main-2024-22-{role}" for role in ROLES}
    for job in jobs.values():
        assert job["metadata"]["labels"]["lmforge.io/run"] == "cc-main-2024-22"
        assert job["spec"]["template"]["metadata"]["labels"]["lmforge.io/run"] == "cc-main-2024-22"
    named = _dataprep_jobs(_render(_dataprep(run="2024")))
    assert set(named) == {f"lmforge-dataprep-2024-{role}" for role in ROLES}
    assert {j["metadata"]["labels"]["lmforge.io/run"] for j in named.values()} == {"2024"}  # a string label


def test_an_upgrade_that_starts_another_run_never_changes_an_existing_job():
    """Kubernetes refuses a change to a Job's pod template: an upgrade may only create Jobs, keep
    identical ones, or (Helm) delete ones no longer rendered."""
    first = _dataprep_jobs(_render(_dataprep(run="first", output="s3://lmforge/datasets/first")))
    second = _dataprep_jobs(_upgrade({"image": {"tag": "2.0.0"},
                                      **_dataprep(run="second", output="s3://lmforge/datasets/second", workers=8)}))
    assert len(first) == len(second) == len(ROLES) and not set(first) & set(second)
    # The same run upgraded with the same values renders the same Jobs, unchanged.
    again = _dataprep_jobs(_upgrade(_dataprep(run="first", output="s3://lmforge/datasets/first")))
    assert again == first
    # A new output alone (the default run name) is a new run too.
    moved = _dataprep_jobs(_upgrade(_dataprep(output="s3://lmforge/datasets/cc-main-2024-26")))
    default = _dataprep_jobs(_render(_dataprep()))
    assert not set(moved) & set(default)


def test_long_run_names_are_cut_distinct_and_leave_room_for_the_worker_index():
    names = []
    for run in ("a" * 40, "a" * 39 + "b"):
        jobs = _dataprep_jobs(_render({**_dataprep(run=run), "fullnameOverride": "f" * 40}))
        assert len(jobs) == len(ROLES) and all(DNS_LABEL.match(n) for n in jobs), jobs
        for name, job in jobs.items():
            # Indexed-Job pods take the host name <job>-<index>, a DNS label of at most 63 characters.
            if job["spec"].get("completionMode") == "Indexed":
                assert len(f"{name}-{9999999}") <= 63, name
        names.append(next(n for n in jobs if n.endswith("-workers")))
    assert names[0] != names[1]


def test_the_schema_rejects_a_run_that_is_not_a_dns_label():
    chart = Chart.load(CHART)
    with pytest.raises(Exception, match="/dataprep/run"):
        chart.validate_schema({"dataprep": {"run": "My Run"}})


def test_every_dataprep_pod_keeps_the_run_label_and_the_batch_network_policy():
    objects = _render({**_dataprep(run="r1"), "nameOverride": "forge"})
    (batch,) = [p for p in find(objects, "NetworkPolicy") if p["metadata"]["name"].endswith("-batch")]
    for job in _dataprep_jobs(objects).values():
        labels = job["spec"]["template"]["metadata"]["labels"]
        assert labels["lmforge.io/run"] == "r1" and _selects(batch["spec"]["podSelector"], labels)
        assert [c["name"] for c in containers(job["spec"]["template"]["spec"])] == ["dataprep"]
