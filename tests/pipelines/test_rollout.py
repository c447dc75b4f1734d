"""Rolling the inference Deployment to a new model package: the patch, and waiting for it."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import pytest

from lmforge_pipelines import steps
from lmforge_pipelines.rollout import RolloutFailed, model_patch, roll_deployment, rollout_done
from tests.helm_chart import find, render

NEW = "s3://lmforge/models/exp-1-step999"


@pytest.fixture(scope="module")
def chart_deployment() -> dict:
    """The inference Deployment exactly as the chart renders it."""
    return find(render({"inference": {"model": "s3://lmforge/models/old"}}, namespace="ml"), "Deployment",
                "lmforge-inference")[0]


def test_patch_replaces_only_the_model_argument(chart_deployment):
    before = chart_deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    patch = model_patch(chart_deployment, NEW, now=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    template = patch["spec"]["template"]
    assert template["metadata"]["annotations"] == {"lmforge.io/model": NEW,
                                                   "lmforge.io/rolled-at": "2026-01-02T03:04:05Z"}
    (container,) = template["spec"]["containers"]
    assert container["name"] == "inference"
    i = before.index("--model")
    assert container["args"] == [*before[: i + 1], NEW, *before[i + 2 :]]
    assert set(patch) == {"spec"} and set(patch["spec"]) == {"template"}  # nothing else is touched


def test_patch_adds_the_model_argument_when_missing_and_names_a_wrong_container(chart_deployment):
    deployment = copy.deepcopy(chart_deployment)
    deployment["spec"]["template"]["spec"]["containers"][0]["args"] = ["--port", "8000"]
    assert model_patch(deployment, NEW)["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "--model", NEW, "--port", "8000"]
    with pytest.raises(RolloutFailed, match="no container 'server'"):
        model_patch(deployment, NEW, container="server")


def status(generation=2, observed=2, replicas=2, updated=2, total=2, available=2, conditions=()):
    return {"metadata": {"name": "lmforge-inference", "generation": generation}, "spec": {"replicas": replicas},
            "status": {"observedGeneration": observed, "updatedReplicas": updated, "replicas": total,
                       "availableReplicas": available, "conditions": list(conditions)}}


@pytest.mark.parametrize(("deployment", "done"), [
    (status(observed=1), False),
    (status(updated=1), False),
    (status(total=3), False),
    (status(available=1), False),
    (status(), True),
])
def test_rollout_done_like_kubectl_rollout_status(deployment, done):
    assert rollout_done(deployment)[0] is done


class FakeApps:
    def __init__(self, deployment, statuses):
        self.deployment, self.statuses, self.patches = deployment, list(statuses), []

    def read_namespaced_deployment(self, name, namespace):
        assert (name, namespace) == ("lmforge-inference", "ml")
        return self.deployment

    def patch_namespaced_deployment(self, name, namespace, body):
        self.patches.append(body)

    def read_namespaced_deployment_status(self, name, namespace):
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]


def test_roll_waits_for_the_new_replicas(chart_deployment):
    from kubernetes.client import ApiClient

    # What the real client returns: typed objects (V1Deployment), not dicts.
    typed = ApiClient()._ApiClient__deserialize(copy.deepcopy(chart_deployment), "V1Deployment")
    pending = copy.deepcopy(chart_deployment)
    pending["metadata"]["generation"] = 2
    pending["status"] = status(observed=1)["status"]
    typed_status = ApiClient()._ApiClient__deserialize(pending, "V1Deployment")
    apps = FakeApps(typed, [typed_status, status(updated=1), status()])
    sleeps = []
    patch = roll_deployment(apps, "ml", "lmforge-inference", NEW, timeout_s=60, poll_s=1, sleep=sleeps.append,
                            log=lambda line: None)
    assert apps.patches == [patch] and len(sleeps) == 2
    assert patch["spec"]["template"]["spec"]["containers"][0]["args"][:2] == ["--model", NEW]


def test_roll_times_out_and_reports_a_stuck_rollout(chart_deployment):
    now = [0.0]
    apps = FakeApps(chart_deployment, [status(available=1)])
    with pytest.raises(RolloutFailed, match="1 of 2 updated replicas available"):
        roll_deployment(apps, "ml", "lmforge-inference", NEW, timeout_s=10, poll_s=5, clock=lambda: now[0],
                        sleep=lambda s: now.__setitem__(0, now[0] + s), log=lambda line: None)
    stuck = status(updated=1, conditions=[{"type": "Progressing", "reason": "ProgressDeadlineExceeded",
                                           "message": "ReplicaSet has timed out progressing"}])
    with pytest.raises(RolloutFailed, match="timed out progressing"):
        roll_deployment(FakeApps(chart_deployment, [stuck]), "ml", "lmforge-inference", NEW, timeout_s=60,
                        log=lambda line: None)


def test_rollout_step_gates_on_val_loss_and_skips_locally():
    with pytest.raises(steps.StepError, match="max_val_loss"):
        steps.rollout(model_uri=NEW, namespace="ml", deployment="x", launcher="pytorchjob", val_loss=3.5,
                      max_val_loss=3.0)
    message = steps.rollout(model_uri="/tmp/m", namespace="ml", deployment="x", launcher="local", val_loss=3.5)
    assert "no inference Deployment" in message
