"""The chart's evaluation branches (training.evaluation): the trainer's weights cadence, the uploader
sidecar's evaluation config and what it needs (the Job template it mounts, an API token in that
container only, a Role to manage Jobs), the task files, and nothing of it when it is off. One render
with everything on; the values the services read are read back by the services' own config loaders."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest
from helm_python import HelmRenderError

from lmforge.trainer.cli import CLI as TRAINER
from lmforge.trainer.config import load_train_config
from lmforge.uploader.cli import CLI as UPLOADER
from tests.deploy.chart_values import (
    CPU_ONLY,
    CRD_KINDS,
    KUBE_VERSION,
    NAMESPACE,
    container,
    pod_specs,
    rendered,
    set_values,
)
from tests.helm_chart import crd_errors, find, render

TASKS = {"arith.yaml": "task: arith\ndataset_path: json\n", "arith.jsonl": '{"q": "1+1", "choices": ["2", "3"]}\n'}
EVALUATION = {
    "enabled": True, "weightsEvery": 50, "weightsEveryMinutes": 7.5, "weightsKeep": 2, "maxConcurrent": 3,
    "tasks": TASKS, "maxSequences": 32, "score": "arith/acc", "mode": "max",
    "promote": {"mode": "pointer", "pointer": "s3://lmforge/models/current", "modelsStore": "s3://lmforge/models"},
    "gpus": 1, "activeDeadlineSeconds": 1800, "backoffLimit": 1,
}
ON = {**CPU_ONLY, "training": {**CPU_ONLY["training"], "run": "eval-run", "evaluation": EVALUATION,
                                "config": {**CPU_ONLY["training"]["config"], "data": {
                                    "sources": [{"path": "s3://lmforge/datasets/web"},
                                                {"path": "s3://lmforge/datasets/code/", "weight": 0.3}]}}}}
EVAL_OBJECTS = {("ConfigMap", "lmforge-eval-tasks"), ("ConfigMap", "lmforge-eval-job-eval-run"),
                ("Role", "lmforge-checkpoint-eval"), ("RoleBinding", "lmforge-checkpoint-eval")}


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return render(ON, namespace=NAMESPACE)


def _names(objects) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in objects}


def _master(objects) -> dict:
    (job,) = find(objects, "PyTorchJob")
    return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]


def _job_template(objects) -> dict:
    (config_map,) = find(objects, "ConfigMap", "lmforge-eval-job-eval-run")
    return json.loads(config_map["data"]["job.json"])


def test_every_object_and_the_job_template_validate(objects):
    assert _names(objects) >= EVAL_OBJECTS
    for obj in [*objects, _job_template(objects)]:
        if obj["kind"] in CRD_KINDS:
            assert crd_errors(obj) == []
        else:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_the_trainer_gets_the_weights_cadence_the_trainer_accepts(objects):
    args = container(_master(objects), "pytorch")["args"]
    assert {"checkpoint.weights_every=50", "checkpoint.weights_every_minutes=7.5", "checkpoint.weights_keep=2"} \
        <= set(args)
    checkpoint = load_train_config(None, [a for a in args if "=" in a]).checkpoint
    assert (checkpoint.weights_every, checkpoint.weights_every_minutes, checkpoint.weights_keep) == (50, 7.5, 2)


def test_the_sidecar_launches_jobs_from_the_mounted_template_with_a_token_of_its_own(objects):
    pod = _master(objects)
    uploader = container(pod, "uploader")
    args = UPLOADER.parse_args(uploader["args"])  # the uploader's own CLI and config loader
    assert (args.command, args.weights_dir) == ("watch", "/checkpoints/eval-run/weights")
    evaluation = UPLOADER.load_config(args).evaluation
    assert evaluation.model_dump() == {
        "enabled": True, "max_concurrent": 3, "runner": "kubernetes", "command": [],
        "job_template": "/etc/lmforge/eval-job/job.json", "namespace": "", "score": "arith/acc", "mode": "max",
        "score_drop": 0.1, "loss_rise": 0.5,  # the alert rules' thresholds (alerts.training)
        "promote": "pointer", "pointer": "s3://lmforge/models/current", "models_store": "s3://lmforge/models",
        "run": "eval-run"}
    assert UPLOADER.load_config(args).weights_keep == 2  # the store keeps what the volume keeps
    env = {e["name"]: e for e in uploader["env"]}
    assert env["LMFORGE_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    mounts = {m["mountPath"]: m["name"] for m in uploader["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    template = volumes[mounts["/etc/lmforge/eval-job"]]["configMap"]["name"]
    assert template == "lmforge-eval-job-eval-run"
    token = volumes[mounts["/var/run/secrets/kubernetes.io/serviceaccount"]]["projected"]["sources"]
    assert [next(iter(s)) for s in token] == ["serviceAccountToken", "configMap", "downwardAPI"]
    # The pod mounts no token; only the uploader container gets one.
    assert pod["automountServiceAccountToken"] is False
    for other in (container(pod, "restore"), container(pod, "pytorch")):
        assert "/var/run/secrets/kubernetes.io/serviceaccount" not in {m["mountPath"] for m in other["volumeMounts"]}


def test_the_job_template_runs_eval_checkpoint_with_the_runs_data_and_the_tasks(objects):
    job = _job_template(objects)
    assert job["metadata"]["namespace"] == NAMESPACE and job["metadata"]["labels"]["lmforge.io/run"] == "eval-run"
    spec = job["spec"]
    assert (spec["activeDeadlineSeconds"], spec["backoffLimit"]) == (1800, 1) and spec["ttlSecondsAfterFinished"] > 0
    (fail, ignore) = spec["podFailurePolicy"]["rules"]
    assert fail["action"] == "FailJob" and fail["onExitCodes"] == {"containerName": "eval", "operator": "In",
                                                                   "values": [2, 3, 70]}  # 4: the store, retried
    assert ignore["action"] == "Ignore"
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == "lmforge-workloads"  # S3 by pod identity, as the trainer
    (eval_container,) = pod["containers"]
    assert eval_container["command"] == ["lmforge-train"] and eval_container["image"] == "lmforge/trainer:0.1.0"
    assert eval_container["args"] == [
        "eval-checkpoint", "--data", "web=s3://lmforge/datasets/web", "--data", "code=s3://lmforge/datasets/code/",
        "--tasks", "/etc/lmforge/eval-tasks", "--max-sequences", "32", "--device", "cuda",
        "--pushgateway", "http://lmforge-prometheus-pushgateway:9091", "--run", "eval-run"]
    assert eval_container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # What the sidecar appends for a package makes a command the trainer's CLI accepts.
    parsed = TRAINER.parse_args([*eval_container["args"], "--package", "s3://lmforge/runs/eval-run/weights/step-00000050",
                                 "--step", "50", "--out", "s3://lmforge/runs/eval-run/evals/step-00000050.json"])
    assert (parsed.command, parsed.data, parsed.max_sequences) == ("eval-checkpoint", eval_container["args"][2:5:2], 32)
    # The same object-store environment (and key Secret) as the trainer's.
    trainer_env = [e for e in container(_master(objects), "pytorch")["env"] if e["name"].startswith("AWS_")]
    assert trainer_env and [e for e in eval_container["env"] if e["name"].startswith("AWS_")] == trainer_env
    mounts = {m["mountPath"]: m["name"] for m in eval_container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/etc/lmforge/eval-tasks"]]["configMap"]["name"] == "lmforge-eval-tasks"
    assert "/tmp" in mounts
    (tasks,) = find(objects, "ConfigMap", "lmforge-eval-tasks")
    assert tasks["data"] == TASKS
    # The batch NetworkPolicy (no ingress) selects its pods.
    (batch,) = find(objects, "NetworkPolicy", "lmforge-batch")
    labels = spec["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] in batch["spec"]["podSelector"]["matchExpressions"][0]["values"]


def test_the_workloads_account_may_manage_jobs_and_nothing_else(objects):
    (role,) = find(objects, "Role", "lmforge-checkpoint-eval")
    assert role["rules"] == [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "list",
                                                                                          "delete"]}]
    (binding,) = find(objects, "RoleBinding", "lmforge-checkpoint-eval")
    assert binding["roleRef"]["name"] == "lmforge-checkpoint-eval"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "lmforge-workloads", "namespace": NAMESPACE}]


def test_without_a_training_run_only_the_release_level_objects_render():
    """The train pipeline's runs use the release's tasks and Role; each run's Job template goes with its job."""
    values = {"training": {"evaluation": {"enabled": True, "tasks": TASKS}}}
    names = _names(render(values, namespace=NAMESPACE))
    assert EVAL_OBJECTS - names == {("ConfigMap", "lmforge-eval-job-eval-run")}
    assert not [name for _, name in names if name.startswith("lmforge-eval-job")]


def test_evaluation_off_renders_none_of_it():
    objects = list(rendered("cpu-only"))
    assert not EVAL_OBJECTS & _names(objects)
    (job,) = find(objects, "PyTorchJob")
    for _, pod in pod_specs(job):
        uploader, trainer = container(pod, "uploader"), container(pod, "pytorch")
        assert "--weights-dir" not in uploader["args"]
        assert not any(v.startswith("evaluation.") for v in set_values(uploader["args"]))
        assert not any(a.startswith("checkpoint.weights_") for a in trainer["args"])
        assert {v["name"] for v in pod["volumes"]}.isdisjoint({"eval-job", "kube-api-access"})


@pytest.mark.parametrize("training, message", [
    ({"config": {"checkpoint": {"weights_every": 10}}},
     "training.config.checkpoint.weights_every is set by the chart: set training.evaluation.weightsEvery"),
    ({"uploader": {"config": {"evaluation": {"enabled": True}}}},
     "training.uploader.config.evaluation is set by the chart: set training.evaluation"),
    ({"evaluation": {"enabled": True, "promote": {"mode": "pointer"}}}, "set both"),
    ({"evaluation": {"enabled": True}, "uploader": {"enabled": False}}, "needs training.uploader.enabled"),
])
def test_values_the_chart_owns_or_cannot_use_fail_with_a_message(training, message):
    with pytest.raises(HelmRenderError) as caught:
        render({"training": {"enabled": True, **training}})
    assert message in str(caught.value)


def test_the_sidecars_runner_fills_the_rendered_template_into_a_valid_job(objects, tmp_path):
    """The Job the uploader's kubernetes runner creates from the chart's template: named and labelled
    for its step, the package and result appended to the eval command the trainer's CLI parses."""
    from lmforge.uploader.eval_runners import EvalJob, KubernetesRunner

    path = tmp_path / "job.json"
    path.write_text(json.dumps(_job_template(objects)))
    job = EvalJob("eval-run", 1249, "s3://lmforge/runs/eval-run/weights/step-00001249",
                  "s3://lmforge/runs/eval-run/evals/step-00001249.json")
    manifest = KubernetesRunner(path, NAMESPACE, api_url="http://127.0.0.1:9", token="t").manifest(job)
    kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)
    assert manifest["metadata"]["labels"]["lmforge.io/step"] == "1249"
    args = TRAINER.parse_args(manifest["spec"]["template"]["spec"]["containers"][0]["args"])
    assert (args.command, args.step, args.package) == ("eval-checkpoint", 1249, job.package)
