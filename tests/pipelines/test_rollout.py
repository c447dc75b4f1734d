"""Rolling the inference service to a new model through its model pointer, against moto S3 and real
lmforge-serve replicas that follow it: the package is verified before the pointer moves, the step
waits until every replica serves it, the canary (the real lmforge-canary) runs against it and a
regression rolls the pointer back; an explicit rollback; `helm upgrade` after a rollout keeps the
rolled-out model. The Kubernetes side (the Deployment's ready replicas, the canary Job from the
chart's CronJob) against a fake API serving the chart's own objects."""

from __future__ import annotations

import copy
import json

import pytest
from kubernetes.client import ApiClient

from lmforge.model.pointer import point_to, read_pointer
from lmforge_pipelines import component_bodies as bodies
from lmforge_pipelines import rollout
from lmforge_pipelines.rollout import (
    CanaryFailed,
    Cluster,
    RolloutFailed,
    canary_job,
    roll_back,
    roll_out,
    served_package,
)
from tests.canary.helpers import run_canary, write_eval_set
from tests.helm_chart import CHART, find, render
from tests.serving import corrupted_copy, perturbed_package, running_server, train_tiny_package, upload_package

BUCKET = "rollouts"
POINTER = f"s3://{BUCKET}/models/current"
FOLLOW = ("pointer_poll_seconds=0.2", "model_name=lm")
FAST = dict(timeout_s=90, poll_s=0.2)


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """A good model, a worse one (the canary fails it) and a corrupt copy of the good one."""
    root = tmp_path_factory.mktemp("rollout-models")
    good = train_tiny_package(root / "good")
    return good, perturbed_package(good, root / "worse", 0.5), corrupted_copy(good, root / "corrupt")


@pytest.fixture
def store(s3, packages):
    """The packages in the bucket (two versions of the good one) and no pointer yet."""
    _, make_bucket = s3
    client = make_bucket(BUCKET)
    client.delete_object(Bucket=BUCKET, Key="models/current")
    good, worse, corrupt = packages
    return {"r1": upload_package(client, BUCKET, "models/r1-step300", good),
            "r2": upload_package(client, BUCKET, "models/r2-step300", good),
            "worse": upload_package(client, BUCKET, "models/r3-step300", worse),
            "corrupt": upload_package(client, BUCKET, "models/r4-step300", corrupt)}


def serving(*urls: str) -> list[str | None]:
    return [served_package(url)[0] for url in urls]


@pytest.mark.slow
def test_roll_out_waits_for_every_replica_runs_the_canary_and_rolls_back_a_regression(store, tmp_path):
    point_to(POINTER, store["r1"], set_by="install")
    # each replica its own download cache, as each pod has its own /tmp: a replica deletes the
    # download of the model it retires
    with running_server(POINTER, *FOLLOW, f"cache_dir={tmp_path / 'one'}") as one, \
            running_server(POINTER, *FOLLOW, f"cache_dir={tmp_path / 'two'}") as two:
        eval_set = write_eval_set(tmp_path / "eval-set.yaml")
        baseline = tmp_path / "baseline.json"
        recorded = run_canary("make-baseline", "--endpoint", one, "--eval-set", str(eval_set),
                              "--output", str(baseline))
        assert recorded.code == 0, str(recorded)
        canaries = []

        def canary():  # what the canary Job does, against a replica; records which model it judged
            canaries.append(serving(one, two))
            result = run_canary("run", "--endpoint", one, "--eval-set", str(eval_set), "--baseline", str(baseline))
            if result.code != 0:
                raise CanaryFailed(f"exit {result.code}: {result.event('canary_result')['reasons']}")

        lines = []
        pointer = roll_out(POINTER, store["r2"], set_by="run 2", replicas=lambda: [one, two], canary=canary,
                           log=lines.append, **FAST)
        assert [p.model for p in pointer.previous] == [store["r1"]]
        assert serving(one, two) == [store["r2"]] * 2
        assert canaries == [[store["r2"]] * 2]  # the canary ran once both replicas served the new model
        assert any("2 replica(s) serve" in line for line in lines)

        with pytest.raises(RolloutFailed, match="the canary failed on .*r3-step300; rolled back to .*r2-step300"):
            roll_out(POINTER, store["worse"], set_by="run 3", replicas=lambda: [one, two], canary=canary, **FAST)
        assert canaries[-1] == [store["worse"]] * 2
        assert read_pointer(POINTER).model == store["r2"] and serving(one, two) == [store["r2"]] * 2

        with pytest.raises(RolloutFailed, match="r4-step300.*sha256 does not match"):
            roll_out(POINTER, store["corrupt"], set_by="run 4", replicas=lambda: [one, two], **FAST)
        assert read_pointer(POINTER).model == store["r2"]  # never pointed at it

        back = roll_back(POINTER, set_by="ops", replicas=lambda: [one, two], **FAST)
        assert back.model == store["r1"] and serving(one, two) == [store["r1"]] * 2
        assert back.previous == ()
        with pytest.raises(RolloutFailed, match="no previous model"):
            roll_back(POINTER, set_by="ops")


def test_wait_names_the_replicas_that_lag(store):
    point_to(POINTER, store["r1"], set_by="install")
    with running_server(POINTER, "pointer_poll_seconds=600") as slow:  # will not re-read the pointer in time
        point_to(POINTER, store["r2"], set_by="run 2")
        with pytest.raises(RolloutFailed, match=rf"did not all serve .*r2-step300.*{slow} serves .*r1-step300"):
            rollout.wait_until_served(store["r2"], lambda: [slow], timeout_s=0.5, poll_s=0.1, log=lambda line: None)
    with pytest.raises(RolloutFailed, match="no ready replica"):
        rollout.wait_until_served(store["r2"], lambda: [], timeout_s=0, log=lambda line: None)


def deployment_args(objects: list[dict]) -> list[str]:
    (deployment,) = find(objects, "Deployment", "lmforge-inference")
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "inference"]
    return container["args"]


def render_upgrade(values: dict) -> list[dict]:
    """What `helm upgrade` (revision 2) renders with `values`."""
    import yaml
    from helm_python import Chart

    manifests = Chart.load(CHART).render(values, name="lmforge", namespace="ml", revision=2, is_upgrade=True)
    return [o for path, text in manifests.items() if not path.endswith("NOTES.txt") for o in yaml.safe_load_all(text)
            if o]


def pod_from(args: list[str]):
    """An lmforge-serve started as the chart's container args say (on a free loopback port)."""
    model = args[args.index("--model") + 1]
    settings = [args[i + 1] for i, arg in enumerate(args) if arg == "--set" and "metrics_port" not in args[i + 1]]
    return running_server(model, *settings)


@pytest.mark.slow
def test_helm_upgrade_after_a_rollout_keeps_the_rolled_out_model(store):
    install = {"inference": {"model": POINTER, "pointerPollSeconds": 0.2, "modelName": "lm"}}
    upgrade = copy.deepcopy(install)  # unrelated changes, as a later `helm upgrade -f values.yaml` brings
    upgrade["inference"].update({"replicas": 3, "autoscaling": {"enabled": False},
                                 "config": {"engine": {"max_running": 4}}})
    upgrade["canary"] = {"schedule": "0 5 * * *"}
    installed, upgraded = deployment_args(render(install)), deployment_args(render_upgrade(upgrade))
    assert installed[:2] == upgraded[:2] == ["--model", POINTER]
    assert "engine.max_running=4" in upgraded and installed != upgraded  # the upgrade does change the pods

    point_to(POINTER, store["r1"], set_by="install")
    with pod_from(installed) as pod:
        assert serving(pod) == [store["r1"]]
        roll_out(POINTER, store["r2"], set_by="run 2", replicas=lambda: [pod], **FAST)
    # The upgrade replaces the pods; the new ones follow the pointer to the rolled-out model, and the
    # Deployment never named a package at all.
    with pod_from(upgraded) as pod:
        assert serving(pod) == [store["r2"]]
    assert not any("step300" in arg for arg in installed + upgraded)


def test_rollout_step_gates_on_val_loss_and_without_kubernetes_writes_only_the_pointer(packages, tmp_path):
    good, _, corrupt = packages
    pointer = str(tmp_path / "models" / "current")
    common = dict(model_pointer=pointer, namespace="ml", deployment="lmforge-inference", launcher="local")
    with pytest.raises(bodies.StepError, match="max_val_loss"):
        bodies.rollout(model_uri=str(good), val_loss=3.5, max_val_loss=3.0, **common)
    assert read_pointer(pointer) is None
    message = bodies.rollout(model_uri=str(good), val_loss=1.0, set_by="run 1", **common)
    assert "no inference Deployment" in message
    assert (read_pointer(pointer).model, read_pointer(pointer).set_by) == (str(good), "run 1")
    with pytest.raises(bodies.StepError, match="sha256 does not match"):
        bodies.rollout(model_uri=str(corrupt), val_loss=1.0, **common)
    assert read_pointer(pointer).model == str(good)


def test_the_rollout_command_sets_shows_and_rolls_back(packages, tmp_path, capsys):
    good, worse, _ = packages
    pointer = str(tmp_path / "current")
    assert rollout.main(["set", pointer, str(good)]) == 0
    capsys.readouterr()
    assert rollout.main(["set", pointer, str(worse), "--set-by", "alice"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert (written["model"], written["set_by"], written["previous"][0]["model"]) == (str(worse), "alice", str(good))
    assert rollout.main(["rollback", pointer]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["model"] == str(good) and shown["previous"] == []
    assert rollout.main(["show", pointer]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == str(good)
    assert rollout.main(["rollback", pointer]) == 1
    assert "no previous model to roll back to" in capsys.readouterr().err


def test_the_rollout_command_fails_in_one_line_with_the_exit_code_of_every_lmforge_cli(packages, tmp_path, capsys):
    good, _, _ = packages
    pointer = tmp_path / "current"
    assert rollout.main(["show", str(pointer)]) == 1
    assert capsys.readouterr().err == f"rollout show: error: {pointer}: no model pointer there\n"
    pointer.write_text("not json")
    assert rollout.main(["show", str(pointer)]) == 3  # an InputError
    err = capsys.readouterr().err
    assert err.startswith(f"rollout show: error: {pointer}: not a model pointer") and err.count("\n") == 1
    (tmp_path / "a-file").write_text("")
    blocked = tmp_path / "a-file" / "current"
    assert rollout.main(["set", str(blocked), str(good)]) == 4  # an OSError, as a StorageError
    err = capsys.readouterr().err
    assert err.startswith("rollout set: error: storage error: ") and err.count("\n") == 1
    with pytest.raises(SystemExit) as usage:
        rollout.main(["set", str(pointer)])  # no package
    assert usage.value.code == 2 and "the following arguments are required: package" in capsys.readouterr().err


# ----------------------------------------------------------------------------- Kubernetes, faked

def typed(body: dict, kind: str):
    """The object as the real client returns it (V1Deployment, …), not a dict."""
    return ApiClient()._ApiClient__deserialize(copy.deepcopy(body), kind)


def pod(name: str, ip: str | None, ready: bool, deleting: bool = False) -> dict:
    meta = {"name": name, **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {})}
    status = {"conditions": [{"type": "Ready", "status": str(ready)}], **({"podIP": ip} if ip else {})}
    return {"metadata": meta, "status": status}


class FakeKubernetes:
    """AppsV1Api, CoreV1Api and BatchV1Api as far as rollout.Cluster uses them, serving the chart's
    own Deployment and CronJob. `job_states` are the status blocks successive Job reads return."""

    def __init__(self, pods=(), job_states=({},), log="… canary_result regression"):
        objects = render({}, namespace="ml")
        self.deployment = find(objects, "Deployment", "lmforge-inference")[0]
        self.cronjob = copy.deepcopy(find(objects, "CronJob", "lmforge-canary")[0])
        self.cronjob["metadata"]["uid"] = "6b1e2a55-0c4e-4d0a-9d55-2f1b0c7e9a01"
        self.pods, self.job_states, self.log = list(pods), list(job_states), log
        self.selectors, self.created = [], []

    def read_namespaced_deployment(self, name, namespace):
        assert (name, namespace) == ("lmforge-inference", "ml")
        return typed(self.deployment, "V1Deployment")

    def list_namespaced_pod(self, namespace, label_selector):
        self.selectors.append(label_selector)
        if label_selector.startswith("job-name="):
            return {"items": [{"metadata": {"name": "canary-pod", "creationTimestamp": "2026-01-01T00:00:00Z"}}]}
        return typed({"items": self.pods}, "V1PodList")

    def read_namespaced_cron_job(self, name, namespace):
        assert (name, namespace) == ("lmforge-canary", "ml")
        return typed(self.cronjob, "V1CronJob")

    def create_namespaced_job(self, namespace, body):
        self.created.append(copy.deepcopy(body))

    def read_namespaced_job(self, name, namespace):
        assert name == self.created[-1]["metadata"]["name"]
        state = self.job_states.pop(0) if len(self.job_states) > 1 else self.job_states[0]
        return {**self.created[-1], "status": state}

    def read_namespaced_pod_log(self, name, namespace, container, tail_lines):
        assert (name, container) == ("canary-pod", "canary")
        return self.log


def cluster(fake: FakeKubernetes, now=None) -> Cluster:
    now = now if now is not None else [0.0]
    return Cluster("ml", "lmforge-inference", apps=fake, core=fake, batch=fake, clock=lambda: now[0],
                   sleep=lambda s: now.__setitem__(0, now[0] + s), log=lambda line: None)


def test_replicas_are_the_ready_pods_of_the_deployment_on_its_http_port():
    fake = FakeKubernetes(pods=[pod("a", "10.0.0.7", True), pod("b", "fd00::5", True), pod("c", "10.0.0.8", False),
                                pod("d", None, True), pod("e", "10.0.0.9", True, deleting=True)])
    assert cluster(fake).replica_urls() == ["http://10.0.0.7:8000", "http://[fd00::5]:8000"]
    assert fake.selectors == ["app.kubernetes.io/component=inference,app.kubernetes.io/instance=lmforge,"
                              "app.kubernetes.io/name=lmforge"]


def condition(kind: str) -> dict:
    return {"conditions": [{"type": kind, "status": "True"}]}


def test_the_canary_job_is_the_chart_cronjobs_template_and_its_outcome_decides():
    fake = FakeKubernetes(job_states=[{}, {"active": 1}, condition("Complete")])
    name = cluster(fake).run_canary("lmforge-canary", package="s3://m/models/r2", timeout_s=600)
    (job,) = fake.created
    assert job["metadata"]["name"] == name and name.startswith("lmforge-canary-rollout-") and len(name) <= 63
    assert job["spec"] == fake.cronjob["spec"]["jobTemplate"]["spec"]  # the same pod, config and eval set
    assert job["metadata"]["labels"] == fake.cronjob["spec"]["jobTemplate"]["metadata"]["labels"]
    assert job["metadata"]["annotations"] == {"cronjob.kubernetes.io/instantiate": "manual",
                                              "lmforge.io/model-package": "s3://m/models/r2"}
    assert job["metadata"]["ownerReferences"] == [{"apiVersion": "batch/v1", "kind": "CronJob",
                                                   "name": "lmforge-canary", "uid": fake.cronjob["metadata"]["uid"],
                                                   "controller": True}]
    assert ApiClient().sanitize_for_serialization(typed(job, "V1Job")) == job  # every field a real Job field

    with pytest.raises(CanaryFailed, match="failed; its log ends:\n… canary_result regression"):
        cluster(FakeKubernetes(job_states=[condition("Failed")])).run_canary("lmforge-canary", package="p",
                                                                              timeout_s=600)
    with pytest.raises(CanaryFailed, match="did not finish in 30 s"):
        cluster(FakeKubernetes(job_states=[{"active": 1}])).run_canary("lmforge-canary", package="p", timeout_s=30)


def test_canary_job_keeps_the_templates_own_annotations():
    cronjob = {"metadata": {"name": "c", "namespace": "ml", "uid": "u"},
               "spec": {"jobTemplate": {"metadata": {"annotations": {"team": "ml"}}, "spec": {"template": {}}}}}
    assert canary_job(cronjob, "c-rollout-1")["metadata"]["annotations"] == {
        "team": "ml", "cronjob.kubernetes.io/instantiate": "manual"}
