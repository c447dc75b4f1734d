"""The PyTorchJob (v1) launcher against a fake Kubernetes API: the object it creates (checked
against the upstream CRD schema and against the chart's own trainer pod spec), success, failure
with the Master's log tail, the deadline, a retried step, and the local torchrun launcher's
failure path."""

from __future__ import annotations

import copy
import sys

import pytest
from kubernetes.client.exceptions import ApiException

from lmforge.common.config import cli_overrides
from lmforge_pipelines.launcher import (
    LocalTorchrunLauncher,
    PodSettings,
    PyTorchJobLauncher,
    TrainingFailed,
    TrainingJob,
    TrainingTimeout,
    job_name,
    make_launcher,
    pytorchjob_manifest,
)
from tests.helm_chart import crd_errors, find, render

STORE = "s3://lmforge/runs"
OVERRIDES = ["model.preset=tiny", "steps=1000", "parallel.mode=fsdp", 'data.sources=[{"path": "s3://lmforge/d"}]']


def job(**kwargs) -> TrainingJob:
    return TrainingJob(**{"run": "exp-1", "overrides": OVERRIDES, "checkpoint_store": STORE, "nodes": 1,
                          "nproc_per_node": 2, "gpus_per_process": 1, **kwargs})


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
    blocks successive GETs return (an exception instance is raised instead)."""

    def __init__(self, states, log="line 1\nline 2\nTraceback: boom", existing=None):
        self.states = list(states)
        self.log = log
        self.objects: dict[str, dict] = {}
        if existing:
            self.objects[existing["metadata"]["name"]] = existing
        self.created: list[dict] = []
        self.deleted: list[str] = []
        self.log_requests: list[dict] = []

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        assert (group, version, plural) == ("kubeflow.org", "v1", "pytorchjobs")
        assert namespace == body["metadata"]["namespace"]
        if body["metadata"]["name"] in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        self.created.append(copy.deepcopy(body))
        self.objects[body["metadata"]["name"]] = copy.deepcopy(body)
        return body

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        if name not in self.objects:
            raise ApiException(status=404, reason="NotFound")
        if self.states:
            state = self.states.pop(0)
            if isinstance(state, BaseException):
                raise state
            self.objects[name]["status"] = state
        return copy.deepcopy(self.objects[name])

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, propagation_policy=None):
        self.deleted.append(name)
        self.objects.pop(name, None)

    def list_namespaced_pod(self, namespace, label_selector):
        assert "training.kubeflow.org/job-role=master" in label_selector
        return {"items": [{"metadata": {"name": "lmforge-train-exp-1-master-0"}}]}

    def read_namespaced_pod_log(self, name, namespace, container, tail_lines, previous=False):
        self.log_requests.append({"name": name, "container": container, "tail_lines": tail_lines,
                                  "previous": previous})
        return self.log


def condition(kind: str, status: str = "True", reason: str = "", message: str = "") -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": message}


RUNNING = {"conditions": [condition("Created"), condition("Running")]}
SUCCEEDED = {"conditions": [condition("Created"), condition("Running", "False"),
                            condition("Succeeded", reason="PyTorchJobSucceeded")]}
FAILED = {"conditions": [condition("Created"), condition("Running", "False"),
                         condition("Failed", reason="PyTorchJobFailed", message="pod exited with code 1")]}


def launcher(fake: FakeKubernetes, clock: FakeClock, steps=(1000,), **kwargs) -> PyTorchJobLauncher:
    found = iter(steps)
    return PyTorchJobLauncher(fake, fake, PodSettings(namespace="ml"), poll_s=10, clock=clock, sleep=clock.sleep,
                              log=lambda line: None, find_checkpoint=lambda uri: next(found), **kwargs)


# ----------------------------------------------------------------------------- the object

@pytest.mark.parametrize("nodes", [1, 3])
def test_manifest_validates_against_the_crd(nodes):
    settings = PodSettings(namespace="ml", checkpoint_pvc="ckpt" if nodes > 1 else "")
    body = pytorchjob_manifest(job(nodes=nodes), settings)
    assert crd_errors(body) == []
    replicas = body["spec"]["pytorchReplicaSpecs"]
    assert body["spec"]["nprocPerNode"] == "2"
    assert replicas["Master"]["replicas"] == 1
    assert ("Worker" in replicas) == (nodes > 1)
    if nodes > 1:
        assert replicas["Worker"]["replicas"] == nodes - 1
        worker = replicas["Worker"]["template"]
        assert "initContainers" not in worker["spec"], "on a shared claim only the Master restores and uploads"
        assert "training.kubeflow.org/job-role" not in worker["metadata"]["labels"]
        assert worker["spec"]["volumes"][0] == {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}}
    master = replicas["Master"]["template"]
    trainer = master["spec"]["containers"][0]
    assert trainer["name"] == "pytorch"
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert trainer["args"][:2] == ["-m", "lmforge.trainer"]
    assert "run_dir=/checkpoints/exp-1" in trainer["args"] and "device=cuda" in trainer["args"]
    assert not any(a.startswith(("RANK", "WORLD_SIZE", "MASTER_ADDR")) for a in trainer["args"])
    assert [c["name"] for c in master["spec"]["initContainers"]] == ["restore", "uploader"]
    assert master["spec"]["initContainers"][1]["restartPolicy"] == "Always"
    assert master["spec"]["initContainers"][0]["args"][:3] == ["restore", "--src", f"{STORE}/exp-1"]
    assert body["metadata"]["name"] == "lmforge-train-exp-1"


def test_manifest_refuses_what_the_chart_refuses():
    with pytest.raises(ValueError, match="ReadWriteMany"):
        pytorchjob_manifest(job(nodes=2), PodSettings())
    with pytest.raises(ValueError, match="s3://"):
        pytorchjob_manifest(job(checkpoint_store="/tmp/runs"), PodSettings())
    with pytest.raises(ValueError, match="unknown Kubernetes setting"):
        PodSettings.from_dict({"namespce": "ml"})
    with pytest.raises(ValueError, match="launcher 'trainjob'"):
        make_launcher("trainjob")


def test_job_name_is_a_dns_label_short_enough_for_the_operators_pod_names():
    name = job_name(PodSettings(), "My_Run." + "x" * 80)
    assert len(name) <= 50 and name == name.lower() and name[0].isalnum() and name[-1].isalnum()
    assert len(f"{name}-worker-15") <= 63


def test_pod_spec_matches_the_charts_trainer_pod():
    """The launcher builds what helm/lmforge/templates/trainer.yaml renders for the same run:
    same containers, commands, volumes, security, resources; the trainer's overrides parse to
    the same config. A change to the chart's pod shows up here."""
    config = {"model": {"preset": "tiny"}, "steps": 1000, "parallel": {"mode": "fsdp"},
              "data": {"sources": [{"path": "s3://lmforge/d"}], "seq_len": 256, "batch_size": 8},
              "checkpoint": {"every": 100}, "eval_every": 100}
    values = {"training": {"enabled": True, "run": "exp-1", "objectStore": STORE, "nodes": 1, "nprocPerNode": 2,
                           "gpusPerProcess": 1, "config": config}}
    chart = find(render(values, namespace="ml"), "PyTorchJob")[0]
    ours = pytorchjob_manifest(job(overrides=[f"{k}={v}" for k, v in _dotted(config).items()]),
                               PodSettings(namespace="ml"))
    assert ours["spec"]["nprocPerNode"] == chart["spec"]["nprocPerNode"]
    assert ours["spec"]["runPolicy"] == chart["spec"]["runPolicy"]
    assert set(ours["spec"]["pytorchReplicaSpecs"]) == set(chart["spec"]["pytorchReplicaSpecs"])
    theirs_master = chart["spec"]["pytorchReplicaSpecs"]["Master"]
    ours_master = ours["spec"]["pytorchReplicaSpecs"]["Master"]
    assert ours_master["restartPolicy"] == theirs_master["restartPolicy"]
    theirs, mine = copy.deepcopy(theirs_master["template"]), copy.deepcopy(ours_master["template"])
    # The chart's selector labels (PodMonitor, NetworkPolicy) select our pods too.
    for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
                "training.kubeflow.org/job-role"):
        assert mine["metadata"]["labels"][key] == theirs["metadata"]["labels"][key], key
    their_args = theirs["spec"]["containers"][0].pop("args")
    my_args = mine["spec"]["containers"][0].pop("args")
    owned = 5  # run_dir, data.cache_dir, metrics.port, device, checkpoint.purge_requires_upload
    assert my_args[:2] == their_args[:2] and my_args[-owned:] == their_args[-owned:]
    assert cli_overrides(my_args[2:-owned]) == cli_overrides(their_args[2:-owned])
    assert mine["spec"] == theirs["spec"]


def _dotted(tree: dict, prefix: str = "") -> dict:
    import json

    out = {}
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            out.update(_dotted(value, path))
        else:
            out[path] = json.dumps(value)
    return out


# ----------------------------------------------------------------------------- waiting

def test_success_returns_the_newest_uploaded_checkpoint():
    fake, clock = FakeKubernetes([{}, RUNNING, RUNNING, SUCCEEDED]), FakeClock()
    result = launcher(fake, clock, steps=[999]).run(job(), timeout_s=3600)
    assert (result.run_uri, result.step) == (f"{STORE}/exp-1", 999)
    assert len(fake.created) == 1 and crd_errors(fake.created[0]) == []
    assert clock.sleeps == [10, 10, 10] and fake.deleted == []


def test_failure_raises_with_the_master_pods_log_tail():
    fake, clock = FakeKubernetes([RUNNING, FAILED]), FakeClock()
    with pytest.raises(TrainingFailed) as info:
        launcher(fake, clock).run(job(), timeout_s=3600)
    message = str(info.value)
    assert "PyTorchJobFailed: pod exited with code 1" in message
    assert "Traceback: boom" in message and info.value.log_tail.endswith("Traceback: boom")
    assert fake.log_requests[0] == {"name": "lmforge-train-exp-1-master-0", "container": "pytorch",
                                    "tail_lines": 80, "previous": False}
    assert fake.deleted == [], "a failed job stays, with its pods, for inspection"


def test_deadline_deletes_the_job_and_raises_with_the_log_tail():
    fake, clock = FakeKubernetes([RUNNING] * 100), FakeClock()
    with pytest.raises(TrainingTimeout, match="did not finish in time") as info:
        launcher(fake, clock).run(job(), timeout_s=35)
    assert clock.now == 35 and clock.sleeps == [10, 10, 10, 5]
    assert fake.deleted == ["lmforge-train-exp-1"]
    assert "Traceback: boom" in info.value.log_tail


def test_api_hiccups_are_retried_but_a_vanished_job_fails():
    fake, clock = FakeKubernetes([ApiException(status=503), RUNNING, ApiException(status=500), SUCCEEDED]), FakeClock()
    assert launcher(fake, clock).run(job(), timeout_s=3600).step == 1000
    fake, clock = FakeKubernetes([RUNNING, ApiException(status=404)]), FakeClock()
    with pytest.raises(TrainingFailed, match="disappeared"):
        launcher(fake, clock).run(job(), timeout_s=3600)


def test_a_retried_step_waits_for_its_existing_job_but_not_for_another_runs():
    body = pytorchjob_manifest(job(), PodSettings(namespace="ml"))
    fake, clock = FakeKubernetes([SUCCEEDED], existing=copy.deepcopy(body)), FakeClock()
    assert launcher(fake, clock).run(job(), timeout_s=60).step == 1000
    assert fake.created == []
    body["metadata"]["annotations"]["lmforge.io/run"] = "someone-else"
    fake = FakeKubernetes([SUCCEEDED], existing=body)
    with pytest.raises(TrainingFailed, match="already exists for another run"):
        launcher(fake, FakeClock()).run(job(), timeout_s=60)


def test_success_without_an_uploaded_checkpoint_fails():
    fake, clock = FakeKubernetes([SUCCEEDED]), FakeClock()
    with pytest.raises(TrainingFailed, match="no complete checkpoint"):
        launcher(fake, clock, steps=[None]).run(job(), timeout_s=60)


def test_stopping_the_step_deletes_the_job():
    fake, clock = FakeKubernetes([RUNNING, KeyboardInterrupt()]), FakeClock()
    with pytest.raises(KeyboardInterrupt):
        launcher(fake, clock).run(job(), timeout_s=3600)
    assert fake.deleted == ["lmforge-train-exp-1"]


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
