"""The Kubernetes launcher against a fake Kubernetes API, for both operators (a PyTorchJob; a
TrainingRuntime and the TrainJob that owns it): the objects it creates are the chart's training
templates rendered for the run (checked against the upstream CRDs), success, failure with the
node-rank-0 trainer's log tail, the deadline, a retried step; and the local torchrun launcher's
failure path."""

from __future__ import annotations

import copy
import json
import sys

import pytest
from helm_python.errors import HelmRenderError, HelmValuesError
from kubernetes.client.exceptions import ApiException

from lmforge.common.config import cli_overrides
from lmforge_pipelines.chart import CHART_DIR_ENV, chart_dir
from lmforge_pipelines.launcher import (
    OPERATORS,
    PYTORCHJOB,
    TRAINJOB,
    KubernetesLauncher,
    LocalTorchrunLauncher,
    TrainingFailed,
    TrainingJob,
    TrainingTimeout,
    make_launcher,
    training_objects,
)
from tests.helm_chart import crd_errors, find, render

STORE = "s3://lmforge/runs"
OVERRIDES = ["model.preset=tiny", "steps=1000", "parallel.mode=fsdp", 'data.sources=[{"path": "s3://lmforge/d"}]',
             "optim.lr=3e-4", 'tracking.run_name="exp 1"']
BOTH = pytest.mark.parametrize("operator", [PYTORCHJOB, TRAINJOB], ids=lambda o: o.name)


def job(**kwargs) -> TrainingJob:
    return TrainingJob(**{"run": "exp-1", "overrides": OVERRIDES, "checkpoint_store": STORE, "nodes": 1,
                          "nproc_per_node": 2, "gpus_per_process": 1, **kwargs})


def pod_templates(obj: dict) -> dict[str, dict]:
    """role → pod template of a PyTorchJob or TrainingRuntime."""
    if obj["kind"] == "PyTorchJob":
        return {role: r["template"] for role, r in obj["spec"]["pytorchReplicaSpecs"].items()}
    return {r["name"]: r["template"]["spec"]["template"] for r in obj["spec"]["template"]["spec"]["replicatedJobs"]}


def trainer(template: dict) -> dict:
    (container,) = template["spec"]["containers"]
    return container


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class FakeKubernetes:
    """CustomObjectsApi + CoreV1Api, as far as the launcher uses them. `states` are the status
    blocks successive GETs of the job return (an exception instance is raised instead)."""

    def __init__(self, operator, states, log="line 1\nline 2\nTraceback: boom", existing=()):
        self.operator = operator
        self.states = list(states)
        self.log = log
        self.objects: dict[tuple[str, str], dict] = {}
        for obj in existing:
            self.objects[(obj["kind"], obj["metadata"]["name"])] = copy.deepcopy(obj)
        self.created: list[dict] = []
        self.patched: list[tuple[str, str, dict]] = []
        self.deleted: list[tuple[str, str]] = []
        self.pod_selectors: list[str] = []
        self.log_requests: list[dict] = []

    def _kind(self, group, version, plural) -> str:
        (kind,) = [r.kind for o in OPERATORS.values() for r in (o.job, *o.prerequisites)
                   if (r.group, r.version, r.plural) == (group, version, plural)]
        return kind

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        kind = self._kind(group, version, plural)
        assert (kind, f"{group}/{version}", namespace) == (body["kind"], body["apiVersion"], "ml")
        if (kind, body["metadata"]["name"]) in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        if kind == "TrainJob":  # Trainer's webhook: the runtime first
            assert ("TrainingRuntime", body["spec"]["runtimeRef"]["name"]) in self.objects
        created = {**copy.deepcopy(body), "metadata": {**body["metadata"], "uid": f"uid-{len(self.created)}"}}
        self.created.append(copy.deepcopy(body))
        self.objects[(kind, body["metadata"]["name"])] = created
        return copy.deepcopy(created)

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        kind = self._kind(group, version, plural)
        if (kind, name) not in self.objects:
            raise ApiException(status=404, reason="NotFound")
        if kind == self.operator.job.kind and self.states:
            state = self.states.pop(0)
            if isinstance(state, BaseException):
                raise state
            self.objects[(kind, name)]["status"] = state
        return copy.deepcopy(self.objects[(kind, name)])

    def patch_namespaced_custom_object(self, group, version, namespace, plural, name, body):
        self.patched.append((self._kind(group, version, plural), name, body))

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, propagation_policy=None):
        kind = self._kind(group, version, plural)
        self.deleted.append((kind, name))
        self.objects.pop((kind, name), None)

    def create_namespaced_config_map(self, namespace, body):
        assert (body["kind"], namespace) == ("ConfigMap", "ml")
        if ("ConfigMap", body["metadata"]["name"]) in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        self.created.append(copy.deepcopy(body))
        self.objects[("ConfigMap", body["metadata"]["name"])] = copy.deepcopy(body)
        return copy.deepcopy(body)

    def patch_namespaced_config_map(self, name, namespace, body):
        self.patched.append(("ConfigMap", name, body))

    def delete_namespaced_config_map(self, name, namespace):
        self.deleted.append(("ConfigMap", name))
        self.objects.pop(("ConfigMap", name), None)

    def list_namespaced_pod(self, namespace, label_selector):
        self.pod_selectors.append(label_selector)
        return {"items": [{"metadata": {"name": "rank-0-pod"}}]}

    def read_namespaced_pod_log(self, name, namespace, container, tail_lines, previous=False):
        self.log_requests.append({"name": name, "container": container, "tail_lines": tail_lines,
                                  "previous": previous})
        return self.log


def condition(kind: str, status: str = "True", reason: str = "", message: str = "") -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def states(operator):
    """Running, succeeded and failed status blocks as each operator writes them."""
    running = {"conditions": [condition("Created"), condition("Running")]}
    if operator is TRAINJOB:  # Trainer v2 copies the JobSet's Completed / Failed as Complete / Failed
        running = {"conditions": [condition("Suspended", "False")]}
    done = {"conditions": [*running["conditions"], condition(operator.succeeded, reason="JobSetCompleted"
                                                             if operator is TRAINJOB else "PyTorchJobSucceeded")]}
    failed = {"conditions": [*running["conditions"], condition("Failed", reason="FailedJobs",
                                                               message="pod exited with code 1")]}
    return running, done, failed


def launcher(operator, fake: FakeKubernetes, clock: FakeClock, steps=(1000,), **kwargs) -> KubernetesLauncher:
    found = iter(steps)
    return KubernetesLauncher(operator, fake, fake, namespace="ml", poll_s=10, clock=clock, sleep=clock.sleep,
                              log=lambda line: None, find_checkpoint=lambda uri: next(found), **kwargs)


def names(fake: FakeKubernetes) -> list[tuple[str, str]]:
    return [(o["kind"], o["metadata"]["name"]) for o in fake.created]


# ----------------------------------------------------------------------------- the objects

@BOTH
def test_the_objects_are_the_charts_training_templates_rendered_for_the_run(operator):
    """What the launcher submits is what `helm install` renders with training.enabled for the same
    run (one definition of the trainer pod), but for who manages it; it validates against the CRDs."""
    release_values = {"s3": {"endpointUrl": "http://minio:9000", "credentialsSecret": "s3-keys"},
                      "image": {"registry": "ghcr.io/acme", "tag": "1.2.3"},
                      "training": {"checkpoints": {"persistentVolumeClaim": "ckpt"}, "shmSize": "16Gi"}}
    ours = training_objects(job(nodes=3), operator, release_values, namespace="ml")
    assert [o["kind"] for o in ours] == [r.kind for r in (*operator.prerequisites, operator.job)]
    training = {**release_values["training"], "enabled": True, "operator": operator.name, "run": "exp-1",
                "objectStore": STORE, "nodes": 3, "nprocPerNode": 2, "gpusPerProcess": 1,
                "config": cli_overrides(OVERRIDES)}
    # The chart's own default config leaves nothing behind in the run's (see the next test).
    chart = render({**release_values, "training": training}, namespace="ml")
    for obj in ours:
        assert crd_errors(obj) == []
        (theirs,) = find(chart, obj["kind"], obj["metadata"]["name"])
        assert obj["metadata"]["labels"].pop("app.kubernetes.io/managed-by") == "lmforge-pipelines"
        assert theirs["metadata"]["labels"].pop("app.kubernetes.io/managed-by") == "Helm"
        assert not [a for a in obj["metadata"]["annotations"] if a.startswith("helm.sh/")]
        theirs["metadata"]["annotations"] = {k: v for k, v in theirs["metadata"]["annotations"].items()
                                             if not k.startswith("helm.sh/")}
        if obj["kind"] != "TrainJob":  # helm merges the chart's example config in: args compared below
            for template in [*pod_templates(obj).values(), *pod_templates(theirs).values()]:
                trainer(template)["args"] = []
        assert obj == theirs
    pods = pod_templates(ours[0] if operator is TRAINJOB else ours[-1])
    assert set(pods) == ({"node"} if operator is TRAINJOB else {"Master", "Worker"})
    for template in pods.values():
        assert template["spec"]["volumes"][0] == {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}}
        assert trainer(template)["image"] == "ghcr.io/acme/lmforge/trainer:1.2.3"
        assert trainer(template)["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert {"name": "AWS_ENDPOINT_URL", "value": "http://minio:9000"} in trainer(template)["env"]
    if operator is TRAINJOB:
        runtime, trainjob = ours
        assert trainjob["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime",
                                                  "name": runtime["metadata"]["name"]}
        assert trainjob["spec"]["trainer"] == {"numNodes": 3, "numProcPerNode": 2}
        assert trainer(pods["node"])["name"] == "node"
    else:
        assert ours[-1]["spec"]["nprocPerNode"] == "2"
        assert ours[-1]["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
        assert trainer(pods["Master"])["name"] == "pytorch"
    assert ours[-1]["metadata"]["name"] == "lmforge-train-exp-1"


@BOTH
def test_the_trainer_gets_exactly_the_runs_config(operator):
    """The chart's example training.config (eval_every, batch size…) must not leak into a run."""
    (*_, body) = objs = training_objects(job(), operator, namespace="ml")
    template = next(iter(pod_templates(objs[0] if operator is TRAINJOB else body).values()))
    args = trainer(template)["args"]
    assert args[:2] == ["-m", "lmforge.trainer"]
    owned = ["run_dir=/checkpoints/exp-1", "data.cache_dir=/cache/data", "metrics.port=9402", "device=cuda",
             "checkpoint.purge_requires_upload=true"]
    assert args[-len(owned):] == owned
    assert cli_overrides(args[2:-len(owned)]) == cli_overrides(OVERRIDES)


def test_chart_values_from_the_ui_and_the_values_the_launcher_owns():
    # KFP hands dict parameters over with every number a double.
    (body,) = training_objects(job(), PYTORCHJOB, {"training": {"backoffLimit": 5.0,
                                                               "uploader": {"graceSeconds": 120.0}}}, namespace="ml")
    assert body["spec"]["runPolicy"]["backoffLimit"] == 5 and crd_errors(body) == []
    assert body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["terminationGracePeriodSeconds"] == 150
    for owned in ({"run": "x"}, {"nodes": 2}, {"config": {"steps": 1}}, {"operator": "trainjob"}):
        with pytest.raises(ValueError, match="the launcher sets these"):
            training_objects(job(), PYTORCHJOB, {"training": owned})


def test_what_the_chart_refuses_the_launcher_refuses_with_the_charts_message():
    with pytest.raises(HelmRenderError, match="ReadWriteMany"):
        training_objects(job(nodes=2), TRAINJOB)
    with pytest.raises(HelmValuesError, match="objectStore"):
        training_objects(job(checkpoint_store="/tmp/runs"), PYTORCHJOB)
    with pytest.raises(HelmRenderError, match="no elastic training"):
        training_objects(job(), TRAINJOB, {"training": {"elastic": {"enabled": True}}})
    with pytest.raises(ValueError, match="launcher 'slurm'"):
        make_launcher("slurm")


@BOTH
def test_job_names_are_dns_labels_short_enough_for_the_operators_pod_names(operator):
    long_run = "my-run-" + "x" * 55
    names_ = {training_objects(job(run=run), operator)[-1]["metadata"]["name"] for run in (long_run, long_run + "y")}
    assert len(names_) == 2, "two runs never share a job"
    for name in names_:
        assert len(name) <= 50 and name == name.lower() and name[0].isalnum() and name[-1].isalnum()
        assert len(f"{name}-worker-15") <= 63 and len(f"{name}-node-0-15") <= 63


def test_chart_dir_is_the_environments_else_the_checkouts(monkeypatch, tmp_path):
    monkeypatch.delenv(CHART_DIR_ENV, raising=False)
    assert (chart_dir() / "templates" / "trainer.yaml").is_file()
    copy_dir = tmp_path / "chart"
    (copy_dir).mkdir()
    (copy_dir / "Chart.yaml").write_text("name: lmforge\n")
    monkeypatch.setenv(CHART_DIR_ENV, str(copy_dir))
    assert chart_dir() == copy_dir
    monkeypatch.setenv(CHART_DIR_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=CHART_DIR_ENV):
        chart_dir()


# ----------------------------------------------------------------------------- waiting

@BOTH
def test_success_returns_the_newest_uploaded_checkpoint(operator):
    running, done, _ = states(operator)
    fake, clock = FakeKubernetes(operator, [{}, running, running, done]), FakeClock()
    result = launcher(operator, fake, clock, steps=[999]).run(job(), timeout_s=3600)
    assert (result.run_uri, result.step) == (f"{STORE}/exp-1", 999)
    assert names(fake) == [(r.kind, "lmforge-train-exp-1") for r in (*operator.prerequisites, operator.job)]
    assert all(crd_errors(o) == [] for o in fake.created)
    assert clock.sleeps == [10, 10, 10] and fake.deleted == []
    if operator is TRAINJOB:  # the runtime goes when its TrainJob is deleted
        owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "lmforge-train-exp-1",
                 "uid": "uid-1"}
        assert fake.patched == [("TrainingRuntime", "lmforge-train-exp-1",
                                 {"metadata": {"ownerReferences": [owner]}})]


@BOTH
def test_failure_raises_with_the_node_rank_0_trainers_log_tail(operator):
    running, _, failed = states(operator)
    fake, clock = FakeKubernetes(operator, [running, failed]), FakeClock()
    with pytest.raises(TrainingFailed) as info:
        launcher(operator, fake, clock).run(job(), timeout_s=3600)
    message = str(info.value)
    assert "FailedJobs: pod exited with code 1" in message and operator.job.kind in message
    assert "Traceback: boom" in message and info.value.log_tail.endswith("Traceback: boom")
    assert fake.pod_selectors == [{
        "pytorchjob": "training.kubeflow.org/job-name=lmforge-train-exp-1,training.kubeflow.org/job-role=master",
        "trainjob": "jobset.sigs.k8s.io/jobset-name=lmforge-train-exp-1,batch.kubernetes.io/job-completion-index=0",
    }[operator.name]]
    assert fake.log_requests[0] == {"name": "rank-0-pod", "container": {"pytorchjob": "pytorch",
                                                                        "trainjob": "node"}[operator.name],
                                    "tail_lines": 80, "previous": False}
    assert fake.deleted == [], "a failed job stays, with its pods, for inspection"


@BOTH
def test_deadline_deletes_the_job_and_raises_with_the_log_tail(operator):
    running, _, _ = states(operator)
    fake, clock = FakeKubernetes(operator, [running] * 100), FakeClock()
    with pytest.raises(TrainingTimeout, match="did not finish in time") as info:
        launcher(operator, fake, clock).run(job(), timeout_s=35)
    assert clock.now == 35 and clock.sleeps == [10, 10, 10, 5]
    assert fake.deleted == [(r.kind, "lmforge-train-exp-1") for r in (operator.job, *operator.prerequisites)]
    assert "Traceback: boom" in info.value.log_tail


def test_api_hiccups_are_retried_but_a_vanished_job_fails():
    running, done, _ = states(TRAINJOB)
    fake, clock = FakeKubernetes(TRAINJOB, [ApiException(status=503), running, ApiException(status=500), done]), \
        FakeClock()
    assert launcher(TRAINJOB, fake, clock).run(job(), timeout_s=3600).step == 1000
    fake, clock = FakeKubernetes(TRAINJOB, [running, ApiException(status=404)]), FakeClock()
    with pytest.raises(TrainingFailed, match="disappeared"):
        launcher(TRAINJOB, fake, clock).run(job(), timeout_s=3600)


@BOTH
def test_a_retried_step_waits_for_its_existing_job_but_not_for_another_runs(operator):
    _, done, _ = states(operator)
    existing = training_objects(job(), operator, namespace="ml")
    fake = FakeKubernetes(operator, [done], existing=existing)
    assert launcher(operator, fake, FakeClock()).run(job(), timeout_s=60).step == 1000
    assert fake.created == []
    existing[-1]["metadata"]["annotations"]["lmforge.io/run"] = "someone-else"
    fake = FakeKubernetes(operator, [done], existing=existing)
    with pytest.raises(TrainingFailed, match="already exists for another run"):
        launcher(operator, fake, FakeClock()).run(job(), timeout_s=60)


def test_success_without_an_uploaded_checkpoint_fails():
    _, done, _ = states(PYTORCHJOB)
    fake, clock = FakeKubernetes(PYTORCHJOB, [done]), FakeClock()
    with pytest.raises(TrainingFailed, match="no complete checkpoint"):
        launcher(PYTORCHJOB, fake, clock, steps=[None]).run(job(), timeout_s=60)


@BOTH
def test_stopping_the_step_deletes_the_job(operator):
    running, _, _ = states(operator)
    fake, clock = FakeKubernetes(operator, [running, KeyboardInterrupt()]), FakeClock()
    with pytest.raises(KeyboardInterrupt):
        launcher(operator, fake, clock).run(job(), timeout_s=3600)
    assert fake.deleted[0] == (operator.job.kind, "lmforge-train-exp-1")


# ----------------------------------------------------------------------------- local torchrun

def test_local_launcher_failure_carries_the_trainers_log_tail(tmp_path):
    lines: list[str] = []
    local = LocalTorchrunLauncher(log=lines.append)
    bad = TrainingJob(run="bad", checkpoint_store=str(tmp_path), nproc_per_node=1,
                      overrides=["data.sources=[{path: /nonexistent}]", "no_such_field=1"])
    with pytest.raises(TrainingFailed, match="torchrun exited with status") as info:
        local.run(bad, timeout_s=120)
    assert "no_such_field" in info.value.log_tail
    assert (tmp_path / "bad" / "launcher.log").read_text().count("no_such_field") >= 1
    assert local.command(bad, tmp_path / "bad")[:4] == [sys.executable, "-m", "torch.distributed.run", "--standalone"]


def test_local_launcher_timeout_stops_torchrun(tmp_path):
    local = LocalTorchrunLauncher(python=sys.executable, log=lambda line: None)
    local.command = lambda job, run_dir: [sys.executable, "-c", "import time; print('started', flush=True); "
                                          "time.sleep(60)"]
    with pytest.raises(TrainingTimeout) as info:
        local.run(TrainingJob(run="slow", checkpoint_store=str(tmp_path), overrides=[]), timeout_s=2)
    assert "started" in info.value.log_tail


def test_a_run_with_evaluation_creates_its_job_template_first_owned_by_the_job():
    """training.evaluation: the sidecar mounts the run's evaluation Job template, a ConfigMap of the
    run; the launcher creates it before the job (the pod would wait for it), and it goes with the job."""
    release_values = {"training": {"evaluation": {"enabled": True, "weightsEvery": 5}}}
    objs = training_objects(job(), PYTORCHJOB, release_values, namespace="ml")
    assert [(o["kind"], o["metadata"]["name"]) for o in objs] == [
        ("ConfigMap", "lmforge-eval-job-exp-1"), ("PyTorchJob", "lmforge-train-exp-1")]
    assert json.loads(objs[0]["data"]["job.json"])["kind"] == "Job"
    running, _, _ = states(PYTORCHJOB)
    fake, clock = FakeKubernetes(PYTORCHJOB, [running] * 100), FakeClock()
    with pytest.raises(TrainingTimeout):
        launcher(PYTORCHJOB, fake, clock, values=release_values).run(job(), timeout_s=15)
    assert names(fake) == [("ConfigMap", "lmforge-eval-job-exp-1"), ("PyTorchJob", "lmforge-train-exp-1")]
    owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "lmforge-train-exp-1", "uid": "uid-1"}
    assert fake.patched == [("ConfigMap", "lmforge-eval-job-exp-1", {"metadata": {"ownerReferences": [owner]}})]
    assert fake.deleted == [("PyTorchJob", "lmforge-train-exp-1"), ("ConfigMap", "lmforge-eval-job-exp-1")]
