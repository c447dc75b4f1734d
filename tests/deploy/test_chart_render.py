"""The Helm chart rendered in-process (Helm's Go SDK) for several value sets: every object is valid
against the Kubernetes 1.30 OpenAPI schema or its upstream CRD, lint is clean, the schema rejects
bad values by name, and the workloads keep the platform's security, access and wiring contracts."""

from __future__ import annotations

import re
import typing

import helm_python
import kubernetes_validate
import pytest
from helm_python import Chart, HelmRenderError, HelmValuesError

from lmforge.dataprep.stages import DEFAULT_MAX_ROUNDS, GLOBAL_STAGES, ROUNDS, chart_json, stage
from lmforge_pipelines.chart import chart_defaults
from tests.deploy.chart_values import (
    CRD_KINDS,
    KUBE_VERSION,
    NAMESPACE,
    VALUE_SETS,
    container,
    containers,
    pod_specs,
    pod_templates,
    rendered,
)
from tests.helm_chart import CHART, crd_errors, find, render

SETS = sorted(VALUE_SETS)
MISSING_DEPENDENCIES = ("chart directory is missing these dependencies: "
                        "kube-prometheus-stack,opentelemetry-collector,prometheus-pushgateway")


def workloads(name: str) -> list[dict]:
    return [o for o in rendered(name) if pod_specs(o)]


def all_pods(name: str):
    for obj in workloads(name):
        for where, pod in pod_specs(obj):
            yield f"{obj['metadata']['name']} ({where})", pod


# -- validity --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SETS)
def test_every_object_validates_against_kubernetes_or_its_crd(name):
    objects = rendered(name)
    assert objects
    for obj in objects:
        label = f"{obj['kind']}/{obj['metadata']['name']}"
        assert obj["metadata"].get("namespace") == NAMESPACE, label
        if obj["kind"] in CRD_KINDS:
            assert crd_errors(obj) == [], label
        else:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("name", SETS)
def test_lint_is_clean_but_for_the_dependency_charts_it_cannot_fetch(name):
    report = helm_python.lint(CHART, VALUE_SETS[name], strict=True, namespace=NAMESPACE, kube_version=KUBE_VERSION)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    # No network here: `helm dependency build` cannot fill charts/; that warning is the only one.
    assert [m["error"] for m in problems] == [MISSING_DEPENDENCIES]
    assert report["errors"] == [MISSING_DEPENDENCIES]


def test_value_sets_render_what_they_turn_on():
    kinds = {name: {o["kind"] for o in rendered(name)} for name in SETS}
    platform = {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "CronJob", "NetworkPolicy",
                "ServiceAccount", "Role", "RoleBinding", "ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"}
    assert platform <= kinds["default"] and not {"Job", "PyTorchJob"} & kinds["default"]
    assert {"Job", "PyTorchJob"} <= kinds["cpu-only"] and {"Job", "PyTorchJob"} <= kinds["multi-node-gpu"]
    assert {"TrainJob", "TrainingRuntime"} <= kinds["trainjob-kueue"] and "PyTorchJob" not in kinds["trainjob-kueue"]
    assert not {"TrainJob", "TrainingRuntime"} & set().union(*(kinds[n] for n in SETS if n != "trainjob-kueue"))
    assert not {"ServiceMonitor", "PodMonitor", "PrometheusRule"} & kinds["observability-off"]
    # No rules file, no dashboards: the canary's eval set is the only ConfigMap left.
    assert [c["metadata"]["name"] for c in find(list(rendered("observability-off")), "ConfigMap")] \
        == ["lmforge-canary-eval-set"]
    assert "CronJob" not in kinds["canary-off"]
    assert "HorizontalPodAutoscaler" not in kinds["cpu-only"]


# -- the schema --------------------------------------------------------------------------------

BAD_VALUES = [
    ({"training": {"nodes": 0}}, "/training/nodes"),
    ({"inference": {"replicas": "two"}}, "/inference/replicas"),
    ({"replicas": 3}, "'replicas' not allowed"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"training": {"gpusPerProcess": 2}}, "/training/gpusPerProcess"),
    ({"training": {"restartPolicy": "Sometimes"}}, "/training/restartPolicy"),
    ({"training": {"objectStore": "/data/runs"}}, "/training/objectStore"),
    ({"training": {"operator": "mpijob"}}, "/training/operator"),
    ({"training": {"scheduling": {"kueue": {"queueName": "Team A"}}}}, "/training/scheduling/kueue/queueName"),
    ({"training": {"scheduling": {"volcano": {"minAvailable": -1}}}}, "/training/scheduling/volcano/minAvailable"),
    ({"training": {"scheduling": {"yunikorn": {}}}}, "/training/scheduling"),
    ({"training": {"shmSize": "lots"}}, "/training/shmSize"),
    ({"inference": {"resources": {"limits": None}}}, "/inference/resources"),
    ({"training": {"resources": {"requests": {"memory": "lots"}}}}, "/training/resources/requests/memory"),
    ({"inference": {"port": 70000}}, "/inference/port"),
    ({"inference": {"backend": "tgi"}}, "/inference/backend"),
    ({"inference": {"vllm": {"gpuMemoryUtilization": 1.5}}}, "/inference/vllm/gpuMemoryUtilization"),
    ({"inference": {"startupProbe": {"loadTimeoutSeconds": 0}}}, "/inference/startupProbe/loadTimeoutSeconds"),
    ({"inference": {"pdb": {"minAvailable": "half"}}}, "/inference/pdb/minAvailable"),
    ({"inference": {"autoscaling": {"targetCPUUtilizationPercentage": 0}}}, "/inference/autoscaling"),
    ({"canary": {"schedule": "every day"}}, "/canary/schedule"),
    ({"canary": {"evalSet": {"held_out": [], "checks": []}}}, "/canary/evalSet"),
    ({"dataprep": {"input": ["/local/file.wet"]}}, "/dataprep/input"),
    ({"networkPolicy": {"ingressFrom": [{"namespace": "ingress"}]}}, "/networkPolicy/ingressFrom"),
    ({"podSecurityContext": {"runAsUser": 0}}, "/podSecurityContext/runAsUser"),
    ({"podSecurityContext": {"runAsNonRoot": False}}, "'runAsNonRoot' not allowed"),
    ({"alerts": {"canary": {"stale": {"for": "half an hour"}}}}, "/alerts/canary/stale/for"),
    ({"monitoring": {"serviceMonitors": {"interval": 30}}}, "/monitoring/serviceMonitors/interval"),
    ({"prometheus-pushgateway": {"enabled": "yes"}}, "/prometheus-pushgateway/enabled"),
    # services' config: sections, their schema generated from each service's model
    ({"dataprep": {"config": {"steps": {"langid": {"treshold": 0.5}}}}}, "'treshold' not allowed"),
    ({"dataprep": {"config": {"steps": {"langid": {"threshold": 1.5}}}}}, "/dataprep/config/steps/langid/threshold"),
    ({"training": {"config": {"optim": {"schedule": "linear"}}}}, "/training/config/optim/schedule"),
    ({"training": {"config": {"data": {"sources": []}}}}, "/training/config/data/sources"),
    ({"training": {"uploader": {"config": {"transfer": {"concurrency": 0}}}}},
     "/training/uploader/config/transfer/concurrency"),
    ({"inference": {"config": {"engine": {"max_running": "eight"}}}}, "/inference/config/engine/max_running"),
    ({"canary": {"config": {"tolerance": {"max_score_drop": "a lot"}}}}, "/canary/config/tolerance/max_score_drop"),
]


@pytest.mark.parametrize("values, field", BAD_VALUES, ids=[f for _, f in BAD_VALUES])
def test_the_schema_rejects_bad_values_naming_the_field(chart, values, field):
    with pytest.raises(HelmValuesError) as caught:
        chart.validate_schema(values)
    assert field in str(caught.value)
    with pytest.raises(HelmValuesError):  # install renders fail the same way
        render(values)


def test_the_schema_accepts_every_value_set_and_open_dependency_sections(chart):
    for values in VALUE_SETS.values():
        chart.validate_schema(values)
    chart.validate_schema({"kube-prometheus-stack": {"enabled": True, "grafana": {"adminPassword": "x"}},
                           "opentelemetry-collector": {"enabled": True, "mode": "daemonset"}})


@pytest.mark.parametrize("values, message", [
    ({"training": {"enabled": True, "nodes": 2}}, "training.checkpoints.persistentVolumeClaim"),
    ({"training": {"enabled": True, "elastic": {"enabled": True, "minNodes": 2, "maxNodes": 4}}}, "minNodes"),
    ({"training": {"enabled": True, "config": {"run_dir": "/x"}}}, "training.config.run_dir is set by the chart"),
    ({"training": {"enabled": True, "config": {"metrics": {"port": 1}}}}, "training.metricsPort"),
    ({"training": {"enabled": True, "uploader": {"config": {"metrics_port": 1}}}}, "training.uploader.metricsPort"),
    ({"training": {"enabled": True, "operator": "trainjob", "elastic": {"enabled": True}}}, "no elastic training"),
    ({"training": {"enabled": True, "operator": "trainjob", "restartPolicy": "ExitCode"}}, "OnFailure or Never"),
    ({"training": {"enabled": True, "scheduling": {"kueue": {"queueName": "q"}, "volcano": {"queue": "q"}}}},
     "not both"),
    ({"training": {"enabled": True, "scheduling": {"volcano": {"queue": "q", "minAvailable": 2}}}},
     "more than the job's 1 pods"),
    ({"training": {"enabled": True, "operator": "trainjob", "nodes": 2,
                   "checkpoints": {"persistentVolumeClaim": "c"},
                   "scheduling": {"volcano": {"queue": "q", "minAvailable": 1}}}}, "Trainer v2 gangs every pod"),
    ({"inference": {"config": {"api_keys_file": "/k"}}}, "inference.apiKeys.secretName"),
    ({"dataprep": {"enabled": True, "workers": 2, "parallelism": 4}}, "dataprep.parallelism"),
    ({"dataprep": {"enabled": True, "stages": {"tokenize": {"tasks": 4, "parallelism": 9}}}},
     "dataprep.stages.tokenize.parallelism (9) must not exceed its tasks (4)"),
    ({"inference": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}}, "minReplicas"),
])
def test_inconsistent_values_fail_the_render_with_a_message(values, message):
    with pytest.raises(HelmRenderError) as caught:
        render(values)
    assert message in str(caught.value)


# -- security ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SETS)
def test_every_pod_is_locked_down_and_every_container_has_resources(name):
    pods = list(all_pods(name))
    assert len(pods) >= 1
    for where, pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["runAsUser"] != 0, where
        assert pod["automountServiceAccountToken"] is False, where
        for c in containers(pod):
            label = f"{where} container {c['name']}"
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True, label
            assert sc["readOnlyRootFilesystem"] is True, label
            assert sc["allowPrivilegeEscalation"] is False, label
            assert sc["capabilities"] == {"drop": ["ALL"]}, label
            assert "privileged" not in sc, label
            resources = c["resources"]
            assert resources["requests"].keys() >= {"cpu", "memory"}, label
            assert resources["limits"].keys() >= {"cpu", "memory"}, label
            mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
            assert "/tmp" in mounts, label  # the only writable place besides data volumes
            assert c["command"] and "args" in c, label  # never dependent on an image's entrypoint


SECRETISH = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|CREDENTIAL", re.IGNORECASE)


@pytest.mark.parametrize("name", SETS)
def test_credentials_only_by_secret_reference(name):
    assert find(list(rendered(name)), "Secret") == []
    for where, pod in all_pods(name):
        for c in containers(pod):
            for env in c.get("env", []):
                if SECRETISH.search(env["name"]):
                    assert set(env) == {"name", "valueFrom"} and "secretKeyRef" in env["valueFrom"], (where, env)
            assert "envFrom" not in c or all("secretRef" in e for e in c["envFrom"])
            for arg in c["args"]:
                assert not re.search(r"(api_key|secret|password)=", arg, re.IGNORECASE), (where, arg)


def test_s3_keys_and_api_keys_come_from_the_named_secrets():
    objects = list(rendered("multi-node-gpu"))
    for where, pod in all_pods("multi-node-gpu"):
        for c in containers(pod):
            refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"]
                    if "secretKeyRef" in e.get("valueFrom", {})}  # the uploader's identity is a fieldRef
            assert refs == {"AWS_ACCESS_KEY_ID": {"name": "lmforge-s3", "key": "AWS_ACCESS_KEY_ID"},
                            "AWS_SECRET_ACCESS_KEY": {"name": "lmforge-s3", "key": "AWS_SECRET_ACCESS_KEY"}}, where
    (deployment,) = find(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"] == {"secretName": "lmforge-api-keys", "items": [{"key": "api-keys", "path": "keys"}]}
    server = container(pod, "inference")
    (mount,) = [m for m in server["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] and "subPath" not in mount  # a rotated Secret reaches the file
    assert f"api_keys_file={mount['mountPath']}/keys" in server["args"]
    (cron,) = find(objects, "CronJob")
    canary_pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (key_volume,) = [v for v in canary_pod["volumes"] if "secret" in v]
    assert key_volume["secret"]["secretName"] == "lmforge-canary-key"
    # The default set: no keys anywhere, pod identity for S3.
    for _, pod in all_pods("default"):
        for c in containers(pod):
            assert not any("secretKeyRef" in e.get("valueFrom", {}) for e in c["env"])
            assert not any("secret" in v for v in pod.get("volumes", []))


@pytest.mark.parametrize("name", SETS)
def test_rbac_is_one_namespaced_role_with_exactly_the_pipeline_verbs(name):
    objects = list(rendered(name))
    assert find(objects, "ClusterRole") == [] and find(objects, "ClusterRoleBinding") == []
    (role,) = find(objects, "Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    rules = {(group, resource): sorted(rule["verbs"])
             for rule in role["rules"] for group in rule["apiGroups"] for resource in rule["resources"]}
    assert rules == {
        ("kubeflow.org", "pytorchjobs"): sorted(["create", "get", "list", "watch", "delete"]),
        ("trainer.kubeflow.org", "trainjobs"): sorted(["create", "get", "list", "watch", "delete"]),
        # patch: the launcher makes each TrainJob the owner of its runtime
        ("trainer.kubeflow.org", "trainingruntimes"): sorted(["create", "get", "list", "watch", "delete", "patch"]),
        ("batch", "jobs"): sorted(["create", "get", "list", "watch", "delete"]),
        ("", "pods"): sorted(["get", "list", "watch"]),
        ("", "pods/log"): ["get"],
        # The rollout step reads this release's inference Deployment and runs a Job from its canary
        # CronJob; lmforge-serve follows the pointer (no patch), vLLM is restarted (patch) and
        # called with the key from its API keys Secret (test_the_rollout_may_restart_only_a_vllm_deployment).
        ("apps", "deployments"): ["get", "patch"] if name == "vllm" else ["get"],
        **({("", "secrets"): ["get"]} if name == "vllm" else {}),
        **({} if name == "canary-off" else {("batch", "cronjobs"): ["get"]}),
    }
    assert all("*" not in r["verbs"] for r in role["rules"])
    for rule in role["rules"]:
        if rule["resources"] == ["deployments"]:
            assert rule["resourceNames"] == ["lmforge-inference"]
        elif rule["resources"] == ["cronjobs"]:
            assert rule["resourceNames"] == ["lmforge-canary"]
        elif rule["resources"] == ["secrets"]:
            assert rule["resourceNames"] == ["lmforge-api-keys"]
        else:
            assert "resourceNames" not in rule
    (binding,) = find(objects, "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "lmforge-pipeline-runner",
                                    "namespace": NAMESPACE}]
    accounts = {sa["metadata"]["name"]: sa for sa in find(objects, "ServiceAccount")}
    assert set(accounts) == {"lmforge-pipeline-runner", "lmforge-workloads"}
    assert accounts["lmforge-workloads"]["automountServiceAccountToken"] is False
    for where, pod in all_pods(name):
        assert pod["serviceAccountName"] == "lmforge-workloads", where  # the runner's rights stay with the runner


READ_DEPLOYMENT = {"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": ["lmforge-inference"],
                   "verbs": ["get"]}
RESTART_DEPLOYMENT = {**READ_DEPLOYMENT, "verbs": ["get", "patch"]}
READ_KEY_SECRET = {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["lmforge-api-keys"], "verbs": ["get"]}


def _runner_rules(values: dict) -> list[dict]:
    (role,) = find(render(values), "Role")
    return role["rules"]


def test_the_rollout_may_restart_only_a_vllm_deployment_and_read_only_its_key_secret():
    """backend vllm turns the Deployment's get into get+patch (the rollout's restart) and adds get on
    the API keys Secret (its test completion's key), both by name; backend lmforge has neither."""
    vllm = VALUE_SETS["vllm"]
    lmforge = {**vllm, "inference": {**vllm["inference"], "backend": "lmforge"}}  # same apiKeys Secret
    keyless = {**vllm, "inference": {**vllm["inference"], "apiKeys": {"secretName": ""}}}
    vllm_rules, lmforge_rules, keyless_rules = _runner_rules(vllm), _runner_rules(lmforge), _runner_rules(keyless)
    assert [r for r in vllm_rules if r not in lmforge_rules] == [RESTART_DEPLOYMENT, READ_KEY_SECRET]
    assert [r for r in lmforge_rules if r not in vllm_rules] == [READ_DEPLOYMENT]
    assert [r for r in keyless_rules if r not in lmforge_rules] == [RESTART_DEPLOYMENT]  # no Secret to read
    assert [r for r in lmforge_rules if r not in keyless_rules] == [READ_DEPLOYMENT]


def test_rbac_and_service_accounts_can_be_left_to_the_cluster():
    objects = render({"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "existing"}})
    assert not find(objects, "Role") and not find(objects, "RoleBinding") and not find(objects, "ServiceAccount")
    (deployment,) = find(objects, "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "existing"


def _ports(rule: dict) -> set[int]:
    return {p["port"] for p in rule.get("ports", [])}


@pytest.mark.parametrize("name", SETS)
def test_network_policies_admit_only_the_gateway_canary_and_prometheus(name):
    objects = list(rendered(name))
    policies = {p["metadata"]["name"]: p for p in find(objects, "NetworkPolicy")}
    assert set(policies) == {"lmforge-inference", "lmforge-trainer", "lmforge-batch"}
    for policy in policies.values():
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert all(rule.get("from") for rule in policy["spec"]["ingress"])  # no "from anywhere" rule
    inference = policies["lmforge-inference"]["spec"]
    assert inference["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "inference"
    api, metrics = inference["ingress"]
    # vLLM serves /metrics on its API port.
    assert _ports(api) == {8000} and _ports(metrics) == ({8000} if name == "vllm" else {9400})
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}} in api["from"]
    assert any(peer.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component") == "canary"
               for peer in api["from"])
    assert metrics["from"] == [{"namespaceSelector": {},
                                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    trainer = policies["lmforge-trainer"]["spec"]
    peers, scrape = trainer["ingress"]
    assert peers["from"] == [{"podSelector": {"matchLabels": trainer["podSelector"]["matchLabels"]}}]
    assert _ports(scrape) == {9402, 9401} and scrape["from"] == metrics["from"]
    batch = policies["lmforge-batch"]["spec"]
    assert batch["ingress"] == []
    assert batch["podSelector"]["matchExpressions"][0]["values"] == ["dataprep", "canary", "checkpoint-eval"]
    # Every pod the chart runs is selected by one of them.
    for obj in workloads(name):
        for where, template in pod_templates(obj):
            labels = template["metadata"]["labels"]
            assert any(_selects(p["spec"]["podSelector"], labels) for p in policies.values()), where


def _scraped(monitor: dict, labels: dict) -> bool:
    """Whether the monitor's `keep` relabelings keep the target of a pod with `labels` (Prometheus
    joins the source labels with ";" and matches the whole string)."""
    meta = {"__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", k): v for k, v in labels.items()}
    for rule in monitor["podMetricsEndpoints"][0].get("relabelings", []):
        if rule.get("action") == "keep":
            value = rule.get("separator", ";").join(meta.get(s, "") for s in rule["sourceLabels"])
            if not re.fullmatch(rule.get("regex", "(.*)"), value):
                return False
    return _selects(monitor["selector"], labels)


def _selects(selector: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    return all(labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", []))


def test_network_policies_can_be_turned_off():
    assert find(render({"networkPolicy": {"enabled": False}}), "NetworkPolicy") == []


# -- the workloads ---------------------------------------------------------------------------


def _pytorchjob(name: str) -> dict:
    (job,) = find(list(rendered(name)), "PyTorchJob")
    return job


def test_pytorchjob_multi_node_gpu():
    job = _pytorchjob("multi-node-gpu")
    assert job["apiVersion"] == "kubeflow.org/v1"
    spec = job["spec"]
    assert spec["nprocPerNode"] == "8"
    replicas = spec["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"}
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 3
    # Named after the run: a new run is a new job.
    assert job["metadata"]["name"] == "lmforge-train-cc-1p3b-v1"
    assert job["metadata"]["labels"]["lmforge.io/run"] == "cc-1p3b-v1"
    assert spec["elasticPolicy"] == {"rdzvBackend": "c10d", "rdzvHost": "lmforge-train-cc-1p3b-v1-master-0",
                                     "rdzvPort": 23456, "minReplicas": 2, "maxReplicas": 4, "maxRestarts": 5}
    # Gang-scheduled by Volcano: the operator's PodGroup, which the pods join.
    assert spec["runPolicy"]["schedulingPolicy"] == {"queue": "training", "minAvailable": 2,
                                                     "priorityClass": "training-high"}
    assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]
    for role, replica in replicas.items():
        pod = replica["template"]["spec"]
        trainer = container(pod, "pytorch")
        assert [c["name"] for c in pod["containers"]] == ["pytorch"]
        assert trainer["image"] == "ghcr.io/example/lmforge/trainer:1.2.3"
        assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert trainer["resources"]["requests"]["nvidia.com/gpu"] == "8"
        assert {"name": "pytorchjob-port", "containerPort": 23456, "protocol": "TCP"} in trainer["ports"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
        assert volumes["checkpoints"] == {"name": "checkpoints",
                                          "persistentVolumeClaim": {"claimName": "lmforge-checkpoints"}}
        assert {"mountPath": "/dev/shm", "name": "shm"} in trainer["volumeMounts"]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
        assert "podAntiAffinity" in pod["affinity"] and pod["priorityClassName"] == "training-high"
        assert pod["imagePullSecrets"] == [{"name": "ghcr"}]
        assert "device=cuda" in trainer["args"]
        assert pod["schedulerName"] == "volcano"
        assert replica["template"]["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == job["metadata"]["name"]
        # On the shared claim the Master alone restores and uploads.
        init = [c["name"] for c in pod.get("initContainers", [])]
        assert init == (["restore", "uploader"] if role == "Master" else []), role


def test_pytorchjob_single_node_cpu_with_restore_and_native_uploader_sidecar():
    job = _pytorchjob("cpu-only")
    spec = job["spec"]
    assert "elasticPolicy" not in spec
    assert set(spec["pytorchReplicaSpecs"]) == {"Master"}
    master = spec["pytorchReplicaSpecs"]["Master"]
    assert master["replicas"] == 1 and master["restartPolicy"] == "OnFailure"
    assert spec["nprocPerNode"] == "2"
    pod = master["template"]["spec"]
    trainer = container(pod, "pytorch")
    assert "nvidia.com/gpu" not in trainer["resources"]["limits"] and "device=cpu" in trainer["args"]
    restore, uploader = pod["initContainers"]
    assert restore["name"] == "restore" and "restartPolicy" not in restore  # runs to completion first
    assert uploader["name"] == "uploader" and uploader["restartPolicy"] == "Always"  # a native sidecar
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["checkpoints"] and volumes["shm"]["emptyDir"]["medium"] == "Memory"
    for c in (restore, uploader, trainer):
        assert {"name": "checkpoints", "mountPath": "/checkpoints"} in c["volumeMounts"], c["name"]
    assert restore["args"][:5] == ["restore", "--src", "s3://lmforge/runs/default-run",
                                   "--dir", "/checkpoints/default-run/checkpoints"]
    assert uploader["args"][:5] == ["watch", "--dir", "/checkpoints/default-run/checkpoints",
                                    "--dest", "s3://lmforge/runs/default-run"]
    assert "run_dir=/checkpoints/default-run" in trainer["args"]
    assert "checkpoint.purge_requires_upload=true" in trainer["args"]
    # The sidecar outlives the trainer only as long as its grace period, which the pod allows.
    assert pod["terminationGracePeriodSeconds"] >= 300 + 30
    assert "grace_seconds=300" in uploader["args"]


def test_trainjob_runs_lmforges_pod_on_its_own_runtime_admitted_by_kueue():
    objects = list(rendered("trainjob-kueue"))
    (runtime,) = find(objects, "TrainingRuntime")
    (trainjob,) = find(objects, "TrainJob")
    name = "lmforge-train-trainer-v2-run"
    assert runtime["metadata"]["name"] == trainjob["metadata"]["name"] == name
    assert trainjob["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime",
                                              "name": name}
    # torchrun's settings where Trainer v2 reads them: PET_NNODES / PET_NPROC_PER_NODE come from these.
    assert trainjob["spec"]["trainer"] == {"numNodes": 2, "numProcPerNode": 4}
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 2, "torch": {}}
    # Kueue admits the TrainJob whole; no Volcano.
    assert trainjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-ml"
    assert "podGroupPolicy" not in runtime["spec"]
    # The runtime exists before the TrainJob: Helm creates it with the release, the TrainJob after.
    assert trainjob["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    assert "helm.sh/hook" not in runtime["metadata"].get("annotations", {})
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"
    assert node["template"]["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    assert node["template"]["spec"]["backoffLimit"] == 2
    pod = node["template"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and "schedulerName" not in pod
    trainer = container(pod, "node")  # Trainer v2 finds the trainer container by this name
    assert [c["name"] for c in pod["containers"]] == ["node"]
    assert trainer["image"] == "registry.example.com/ml/lmforge/trainer:1.2.3"
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert {p["name"] for p in trainer["ports"]} == {"metrics"}  # Trainer adds its own rendezvous port
    assert not {e["name"] for e in trainer["env"]} & {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK",
                                                       "PET_MASTER_ADDR", "PET_MASTER_PORT"}  # Trainer's own
    assert pod["volumes"][0] == {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "lmforge-checkpoints"}}
    assert pod["priorityClassName"] == "training-high" and pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    # One template for every node: on the shared claim the restore and the uploader act on node
    # rank 0 only, which they learn from the pod's completion index.
    rank = {"name": "LMFORGE_NODE_RANK", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}
    for name_ in ("restore", "uploader"):
        sidecar = container(pod, name_)
        assert rank in sidecar["env"]
        at = sidecar["args"].index("--node-rank")
        assert sidecar["args"][at + 1] == "$(LMFORGE_NODE_RANK)"


def test_trainjob_gang_scheduled_by_volcano():
    objects = render({"training": {"enabled": True, "operator": "trainjob", "nodes": 2,
                                   "checkpoints": {"persistentVolumeClaim": "c"},
                                   "scheduling": {"volcano": {"queue": "research"}}}})
    (runtime,) = find(objects, "TrainingRuntime")
    (trainjob,) = find(objects, "TrainJob")
    assert crd_errors(runtime) == [] and crd_errors(trainjob) == []
    # Trainer creates the PodGroup (all pods) in the queue its runtime names.
    assert runtime["spec"]["podGroupPolicy"] == {"volcano": {}}
    assert runtime["spec"]["template"]["metadata"]["annotations"] == {"scheduling.volcano.sh/queue-name": "research"}
    template = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert template["spec"]["schedulerName"] == "volcano"
    assert template["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == trainjob["metadata"]["name"]
    assert "kueue.x-k8s.io/queue-name" not in trainjob["metadata"]["labels"]


def test_pytorchjob_admitted_by_kueue():
    (job,) = find(render({"training": {"enabled": True, "scheduling": {"kueue": {"queueName": "team-ml"}}}}),
                  "PyTorchJob")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-ml" and crd_errors(job) == []
    assert "schedulingPolicy" not in job["spec"]["runPolicy"]
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    assert "schedulerName" not in pod["spec"] and "kueue.x-k8s.io/queue-name" not in pod["metadata"]["labels"]


def test_pytorchjob_without_uploader_neither_restores_nor_waits_for_uploads():
    (job,) = find(render({"training": {"enabled": True, "uploader": {"enabled": False}}}), "PyTorchJob")
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert "initContainers" not in pod
    assert "checkpoint.purge_requires_upload=false" in container(pod, "pytorch")["args"]


def test_monitor_selectors_match_the_pods_and_ports_they_scrape():
    objects = list(rendered("multi-node-gpu"))
    (service,) = find(objects, "Service")
    (service_monitor,) = find(objects, "ServiceMonitor")
    assert service_monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {p["name"] for p in service["spec"]["ports"]} == {"http", "metrics"}
    assert service_monitor["spec"]["endpoints"][0]["port"] == "metrics"
    (deployment,) = find(objects, "Deployment")
    server = container(deployment["spec"]["template"]["spec"], "inference")
    assert {p["name"]: p["containerPort"] for p in server["ports"]} == {"http": 8000, "metrics": 9400}
    assert "metrics_port=9400" in server["args"]

    replicas = _pytorchjob("multi-node-gpu")["spec"]["pytorchReplicaSpecs"]
    master, worker = (replicas[r]["template"] for r in ("Master", "Worker"))
    trainer_monitor = find(objects, "PodMonitor", "lmforge-trainer")[0]["spec"]
    uploader_monitor = find(objects, "PodMonitor", "lmforge-uploader")[0]["spec"]
    assert _selects(trainer_monitor["selector"], master["metadata"]["labels"])
    assert _selects(uploader_monitor["selector"], master["metadata"]["labels"])
    # Of the trainer pods, only global rank 0's target is kept: the Master's, or the TrainJob's pod
    # of completion index 0 (labels as the operator and the Job controller set them).
    (runtime,) = find(list(rendered("trainjob-kueue")), "TrainingRuntime")
    node = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert _selects(trainer_monitor["selector"], node["metadata"]["labels"])
    pods = {"master": {**master["metadata"]["labels"], "training.kubeflow.org/replica-type": "master"},
            "worker": {**worker["metadata"]["labels"], "training.kubeflow.org/replica-type": "worker"},
            "node 0": {**node["metadata"]["labels"], "batch.kubernetes.io/job-completion-index": "0"},
            "node 1": {**node["metadata"]["labels"], "batch.kubernetes.io/job-completion-index": "1"}}
    assert {pod for pod, labels in pods.items() if _scraped(trainer_monitor, labels)} == {"master", "node 0"}
    master_ports = {p["name"]: p["containerPort"] for c in containers(master["spec"]) for p in c.get("ports", [])}
    assert master_ports["metrics"] == 9402 and master_ports["uploader-metrics"] == 9401
    assert trainer_monitor["podMetricsEndpoints"][0]["port"] == "metrics"
    assert uploader_monitor["podMetricsEndpoints"][0]["port"] == "uploader-metrics"
    assert "metrics.port=9402" in container(master["spec"], "pytorch")["args"]
    assert "metrics_port=9401" in container(master["spec"], "uploader")["args"]


def _stage_jobs(name: str = "multi-node-gpu", prefix: str = "lmforge-dataprep-cc-main-2024-22-") -> dict:
    jobs = {j["metadata"]["name"]: j for j in find(list(rendered(name)), "Job")}
    return {name.removeprefix(prefix): job for name, job in jobs.items() if name.startswith(prefix)}


def _expected_roles(rounds: int = DEFAULT_MAX_ROUNDS, trace_index: bool = False) -> list[str]:
    """The global stages' Jobs in order, as lmforge.dataprep.stages declares them (trace-index's only
    with config trace_index.enabled: tests/deploy/test_chart_trace.py)."""
    return [f"{stage.name}-{r:02d}" if stage.kind == ROUNDS else stage.name
            for stage in GLOBAL_STAGES for r in range(rounds if stage.kind == ROUNDS else 1)
            if stage.name != "trace-index" or trace_index]


def test_dataprep_indexed_workers_then_one_hook_job_per_global_stage():
    stages = _stage_jobs()
    workers = stages.pop("workers")
    spec = workers["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == 64 and spec["parallelism"] == 32
    assert spec["template"]["spec"]["restartPolicy"] == "Never" and spec["backoffLimitPerIndex"] == 2
    args = container(spec["template"]["spec"], "dataprep")["args"]
    assert args[args.index("--num-workers") + 1] == "64" and args[args.index("--workers") + 1] == "4"
    assert "--worker-index" not in args  # JOB_COMPLETION_INDEX, set by Kubernetes
    assert "annotations" not in workers["metadata"]  # not a hook: --wait-for-jobs waits for it first

    # No single pod runs the global stages: one hook Job each (one per round for the components),
    # run by Helm in ascending weight, in the declared order.
    expected = _expected_roles()
    weights = {name: int(job["metadata"]["annotations"]["helm.sh/hook-weight"]) for name, job in stages.items()}
    assert sorted(stages, key=weights.get) == expected and len(set(weights.values())) == len(expected)
    tasks = {"combine": 8, "dedup": 32, "components": 8, "tokenize": 8, "shards": 64}  # the set's and chart's defaults
    parallelism = {"combine": 8, "dedup": 16, "components": 8, "tokenize": 8, "shards": 32}
    for role, job in stages.items():
        # a rounds stage's Job is <stage>-NN; stage names may hold dashes (trace-index)
        name, _, round_ = role.rpartition("-") if role[-2:].isdigit() else (role, "", "")
        annotations, spec = job["metadata"]["annotations"], job["spec"]
        assert annotations["helm.sh/hook"] == "post-install,post-upgrade", name
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation", name
        pod = spec["template"]["spec"]
        (c,) = containers(pod)
        output = args[args.index("--output") + 1]
        assert c["command"] == ["lmforge-dataprep"] and c["args"][:3] == [name, "--output", output]
        assert "--worker-index" not in c["args"] and "--set" not in c["args"]  # the workers' recorded config
        assert c["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}
        assert {v["name"]: v["emptyDir"]["sizeLimit"] for v in pod["volumes"]} == {"tmp": "10Gi"}
        rules = spec["podFailurePolicy"]["rules"]
        assert rules[0] == {"action": "FailJob", "onExitCodes": {"containerName": c["name"], "operator": "In",
                                                                  "values": [2, 3]}}
        assert rules[1]["action"] == "Ignore" and rules[1]["onPodConditions"][0]["type"] == "DisruptionTarget"
        if stage(name).split:
            assert spec["completionMode"] == "Indexed", name
            assert (spec["completions"], spec["parallelism"]) == (tasks[name], parallelism[name])
            assert spec["backoffLimitPerIndex"] == 2 and spec["maxFailedIndexes"] == 0
            rounds = ["--round", str(int(round_))] if round_ else []
            assert c["args"][3:] == ["--num-workers", str(tasks[name]),
                                     "--workers", "2" if name == "shards" else "1", *rounds]
        else:
            assert "completionMode" not in spec and "completions" not in spec, name
            assert spec["backoffLimit"] == 2 and c["args"][3:] == []


def _stage_jobs_from(values: dict, prefix: str = "lmforge-dataprep-cc-main-2024-22-") -> list[str]:
    jobs = find(render(values, namespace=NAMESPACE), "Job")
    return [j["metadata"]["name"].removeprefix(prefix) for j in jobs]


def test_dataprep_rounds_follow_the_recorded_config_and_every_stage_needs_settings():
    values = {"dataprep": {"enabled": True, "config": {"components": {"max_rounds": 3}}}}
    roles = [r for r in _stage_jobs_from(values) if r != "workers"]
    assert roles == _expected_roles(3)
    missing = {"dataprep": {"enabled": True, "stages": {"combine": None}}}
    with pytest.raises((HelmValuesError, HelmRenderError), match=r"combine"):  # the schema refuses it first
        _stage_jobs_from(missing)


def test_chart_stage_list_is_the_declared_one():
    """helm/lmforge/dataprep-stages.json is lmforge.dataprep.stages' (make docs writes it), and the
    values have one settings entry per stage, of the stage's kind."""
    from lmforge.tooling.chart_values import DataprepIndexedStage, DataprepStages

    assert (CHART / "dataprep-stages.json").read_text() == chart_json()
    hints = typing.get_type_hints(DataprepStages)  # Required[Annotated[...]] → the section type
    assert list(hints) == [s.name for s in GLOBAL_STAGES]
    defaults = chart_defaults()["dataprep"]["stages"]
    assert list(defaults) == [s.name for s in GLOBAL_STAGES]
    for s in GLOBAL_STAGES:
        assert ("tasks" in defaults[s.name]) == s.split, s.name
        assert (hints[s.name] is DataprepIndexedStage) == s.split, s.name


@pytest.mark.parametrize("name", ["default", "multi-node-gpu", "cpu-only"])
def test_inference_probes_service_hpa_and_pdb(name):
    objects = list(rendered(name))
    (deployment,) = find(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    server = container(pod, "inference")
    assert server["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert server["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://lmforge-opentelemetry-collector:4318"} \
        in server["env"]
    (pdb,) = find(objects, "PodDisruptionBudget")
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    hpas = find(objects, "HorizontalPodAutoscaler")
    if name == "cpu-only":
        assert hpas == [] and deployment["spec"]["replicas"] == 1
    else:
        (hpa,) = hpas
        assert "replicas" not in deployment["spec"]  # the HPA owns the count
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                                 "name": deployment["metadata"]["name"]}
    if name == "multi-node-gpu":
        assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "lmforge_inference_requests_waiting"
        assert server["resources"]["limits"]["nvidia.com/gpu"] == "1" and pdb["spec"]["minAvailable"] == "50%"


@pytest.mark.parametrize("name", ["default", "multi-node-gpu", "cpu-only"])
def test_inference_startup_probe_waits_for_the_model_load_before_liveness(name):
    (deployment,) = find(list(rendered(name)), "Deployment")
    server = container(deployment["spec"]["template"]["spec"], "inference")
    startup = server["startupProbe"]
    # The same endpoint as readiness (the model is loaded); liveness only starts after it.
    assert startup["httpGet"] == server["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # the default load timeout, 10 minutes


@pytest.mark.parametrize("timeout, period", [(600, 10), (1800, 7), (45, 60), (1, 1)])
def test_inference_startup_budget_covers_the_configured_load_timeout(timeout, period):
    objects = render({"inference": {"startupProbe": {"loadTimeoutSeconds": timeout, "periodSeconds": period,
                                                     "timeoutSeconds": 3}}})
    (deployment,) = find(objects, "Deployment")
    startup = container(deployment["spec"]["template"]["spec"], "inference")["startupProbe"]
    assert startup["periodSeconds"] == period and startup["timeoutSeconds"] == 3
    budget = startup["periodSeconds"] * startup["failureThreshold"]
    assert timeout <= budget < timeout + period  # the load timeout, rounded up to a whole period
    kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)


def test_inference_replicas_spread_over_zones_and_nodes_by_default():
    (deployment,) = find(list(rendered("multi-node-gpu")), "Deployment")
    pod = deployment["spec"]["template"]
    constraints = pod["spec"]["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in constraints] == ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
    for c in constraints:
        assert c["whenUnsatisfiable"] == "ScheduleAnyway" and c["maxSkew"] == 1
        assert c["labelSelector"] == deployment["spec"]["selector"]  # this release's inference pods
        assert _selects(c["labelSelector"], pod["metadata"]["labels"])
        assert c["matchLabelKeys"] == ["pod-template-hash"]  # a rolling update spreads the new revision too


def test_inference_topology_spread_is_configurable():
    def constraints(spread: dict) -> list[dict] | None:
        (deployment,) = find(render({"inference": {"topologySpread": spread}}), "Deployment")
        kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)
        return deployment["spec"]["template"]["spec"].get("topologySpreadConstraints")

    strict = constraints({"whenUnsatisfiable": "DoNotSchedule", "maxSkew": 2,
                          "topologyKeys": ["kubernetes.io/hostname"]})
    assert [(c["topologyKey"], c["maxSkew"], c["whenUnsatisfiable"]) for c in strict] \
        == [("kubernetes.io/hostname", 2, "DoNotSchedule")]
    own = [{"topologyKey": "example.com/rack", "maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "inference"}}}]
    assert constraints({"constraints": own}) == own
    assert constraints({"enabled": False}) is None
    with pytest.raises(HelmValuesError, match="/inference/topologySpread/whenUnsatisfiable"):
        render({"inference": {"topologySpread": {"whenUnsatisfiable": "Sometimes"}}})


def test_canary_cronjob_daily_forbid_with_the_eval_set_mounted():
    objects = list(rendered("default"))
    (cron,) = find(objects, "CronJob")
    spec = cron["spec"]
    minute, hour, day, month, weekday = spec["schedule"].split()
    assert minute.isdigit() and hour.isdigit() and (day, month, weekday) == ("*", "*", "*")  # once a day
    assert spec["concurrencyPolicy"] == "Forbid"
    job = spec["jobTemplate"]["spec"]
    exits = job["podFailurePolicy"]["rules"][0]
    assert exits["action"] == "FailJob" and 1 in exits["onExitCodes"]["values"]  # a regression is not retried
    assert 4 not in exits["onExitCodes"]["values"]  # an unreachable endpoint is
    pod = job["template"]["spec"]
    args = container(pod, "canary")["args"]
    assert args[args.index("--endpoint") + 1] == "http://lmforge-inference:8000"
    assert args[args.index("--pushgateway") + 1] == "http://lmforge-prometheus-pushgateway:9091"
    (volume,) = [v for v in pod["volumes"] if "configMap" in v]
    assert find(objects, "ConfigMap", volume["configMap"]["name"])
    observability_off = find(list(rendered("observability-off")), "CronJob")[0]
    off_args = container(observability_off["spec"]["jobTemplate"]["spec"]["template"]["spec"], "canary")["args"]
    assert "--pushgateway" not in off_args  # nothing to push to: the run still prints its verdict


def test_telemetry_endpoints_can_point_at_existing_services():
    objects = render({"telemetry": {"otlpEndpoint": "http://otel.observability:4318",
                                    "pushgateway": "http://pushgateway.monitoring:9091"},
                      "opentelemetry-collector": {"enabled": False}, "prometheus-pushgateway": {"enabled": False}})
    (deployment,) = find(objects, "Deployment")
    env = container(deployment["spec"]["template"]["spec"], "inference")["env"]
    assert {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel.observability:4318"} in env
    (cron,) = find(objects, "CronJob")
    args = container(cron["spec"]["jobTemplate"]["spec"]["template"]["spec"], "canary")["args"]
    assert args[args.index("--pushgateway") + 1] == "http://pushgateway.monitoring:9091"


def test_notes_tell_how_to_reach_the_api_grafana_logs_and_the_canary():
    manifests = Chart.load(CHART).render(VALUE_SETS["multi-node-gpu"], name="lmforge", namespace=NAMESPACE,
                                         is_install=True)
    notes = manifests["lmforge/templates/NOTES.txt"]
    assert "kubectl -n ml port-forward service/lmforge-inference 8000:8000" in notes
    assert 'Authorization: Bearer $API_KEY' in notes and "get secret lmforge-api-keys" in notes
    assert "grafana_dashboard=1" in notes
    assert "| jq" in notes and "kubectl -n ml logs" in notes
    assert "LmforgeCanaryRegression" in notes and "cronjob/lmforge-canary" in notes
    assert "PyTorchJob lmforge-train-cc-1p3b-v1" in notes
