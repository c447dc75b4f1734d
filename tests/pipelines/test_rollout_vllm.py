"""A rollout onto vLLM pods (inference.backend vllm), which do not follow the model pointer: the
rollout moves the pointer, restarts the chart's vLLM Deployment as `kubectl rollout restart`
does, waits until the rollout completes and each new pod fetched the package, then until each
answers /health 200, lists the served name and completes one token (with the API key), and only
then runs the canary. New pods that do not serve move the pointer back and restart again.

Against tests/pipelines/vllm_cluster.py: the chart's own Deployment behind a fake Kubernetes API
whose pods run the chart's init container for real (fetch_model on S3, moto) and serve what it
fetched from a stand-in vLLM HTTP server on their own loopback address."""

from __future__ import annotations

import json

import pytest
import torch
from kubernetes.client.exceptions import ApiException

from lmforge.model.config import GPTConfig
from lmforge.model.hf_package import write_hf_package
from lmforge.model.pointer import point_to, read_pointer
from lmforge.model.transformer import GPT
from lmforge_pipelines import rollout
from lmforge_pipelines.rollout import Cluster, PodsNotServing, RolloutFailed, roll_back, roll_out
from lmforge_pipelines.vllm_pods import RESTARTED_AT
from tests.deploy.chart_values import VALUE_SETS
from tests.helm_chart import find, render
from tests.pipelines.vllm_cluster import ADDRESSES, FakeVllmKubernetes, StandInVllm
from tests.ports import free_port
from tests.serving import CONFIG, corrupted_copy, train_tokenizer, upload_package

BUCKET = "vllm-rollouts"
POINTER = f"s3://{BUCKET}/models/current"
KEYS = "# rotated 2026-11\n\n  sk-first  \nsk-second\n"
SERVED = VALUE_SETS["vllm"]["inference"]["modelName"]


@pytest.fixture(scope="module")
def hf_packages(tmp_path_factory):
    """An untrained tiny model in Hugging Face format (vLLM's input) and a corrupted copy."""
    root = tmp_path_factory.mktemp("vllm-packages")
    tokenizer = train_tokenizer(root / "tokenizer.json")
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", vocab_size=320, **CONFIG)).eval()
    package = write_hf_package(model, tokenizer, root / "hf", step=9)
    return package, corrupted_copy(package, root / "corrupt")


@pytest.fixture
def store(s3, hf_packages):
    _, make_bucket = s3
    client = make_bucket(BUCKET)
    client.delete_object(Bucket=BUCKET, Key="models/current")
    good, corrupt = hf_packages
    return {name: upload_package(client, BUCKET, f"models/{name}-hf", good) for name in ("r1", "r2", "broken")} | {
        "corrupt": upload_package(client, BUCKET, "models/corrupt-hf", corrupt)}


@pytest.fixture(scope="module")
def deployment():
    """The chart's vLLM Deployment, on a port free on every stand-in address."""
    port = free_port()
    values = {**VALUE_SETS["vllm"], "inference": {**VALUE_SETS["vllm"]["inference"], "model": POINTER, "port": port}}
    (rendered,) = find(render(values, namespace="ml"), "Deployment", "lmforge-inference")
    rendered["spec"]["replicas"] = 2  # as the HPA (minReplicas 1) might have set it
    return rendered


@pytest.fixture
def vllm(store, deployment, tmp_path):
    """(the fake cluster, a Cluster on it and the clock it sleeps on), its pods serving r1."""
    port = deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    broken = {store["broken"]}
    stand_ins = {address: StandInVllm(address, port, broken) for address in ADDRESSES}
    point_to(POINTER, store["r1"], set_by="install")
    fake = FakeVllmKubernetes(deployment, stand_ins, tmp_path / "pods", KEYS)
    now, lines = [0.0], []
    cluster = Cluster("ml", "lmforge-inference", apps=fake, core=fake, batch=fake, clock=lambda: now[0],
                      sleep=lambda s: now.__setitem__(0, now[0] + s), log=lines.append)
    cluster.lines = lines
    yield fake, cluster, now
    for stand_in in stand_ins.values():
        stand_in.close()


def stamps(fake: FakeVllmKubernetes) -> list[str | None]:
    return [(pod["metadata"]["annotations"]).get(RESTARTED_AT) for pod in fake.current()]


def test_a_rollout_restarts_the_vllm_pods_and_waits_for_health_and_a_completion(vllm, store):
    fake, cluster, _ = vllm
    assert fake.serving() == [store["r1"]] * 2 and stamps(fake) == [None, None]
    canaries = []
    pointer = roll_out(POINTER, store["r2"], set_by="run 2", replicas=cluster,
                       canary=lambda: canaries.append(fake.serving()), timeout_s=600, poll_s=5)

    assert pointer.model == store["r2"] and read_pointer(POINTER).model == store["r2"]
    # Restarted as `kubectl rollout restart` does: one patch of the pod template's restartedAt.
    (patch,) = fake.patches
    stamp = patch["spec"]["template"]["metadata"]["annotations"][RESTARTED_AT]
    assert patch == {"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: stamp}}}}}
    assert stamps(fake) == [stamp, stamp]  # every pod now is a new one ...
    assert fake.serving() == [store["r2"]] * 2  # ... whose init container fetched what the pointer names
    assert canaries == [[store["r2"]] * 2]  # the canary ran once both served it
    for pod in fake.current():
        stand_in = fake.stand_ins[pod["status"]["podIP"]]
        # The rollout waited out the engine's start (/health 503) before its checks went on.
        assert stand_in.statuses("/health") == [503, 503, 200]
        (completion,) = [r for r in stand_in.requests if r["path"] == "/v1/completions"]
        assert completion["status"] == 200 and completion["auth"] == "Bearer sk-first"  # the Secret's first key
        assert completion["body"]["model"] == SERVED and completion["body"]["max_tokens"] == 1
        assert stand_in.statuses("/v1/models") == [200]
    assert any(f"2 vLLM replica(s) serve {store['r2']}" in line for line in cluster.lines)


def test_a_failing_completion_rolls_the_pointer_back_and_restarts_onto_it(vllm, store):
    fake, cluster, _ = vllm
    # The pipeline's rollout step passes the Cluster's replica_urls: the Cluster still decides.
    with pytest.raises(RolloutFailed) as failed:
        roll_out(POINTER, store["broken"], set_by="run 3", replicas=cluster.replica_urls, timeout_s=60, poll_s=5)
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(f"the new pods did not serve {store['broken']}; rolled back to {store['r1']}: "
                              "the restarted pods of ml/lmforge-inference did not answer within 60 s: ")
    assert "/v1/completions 500 EngineCore encountered an issue. See the logs." in message
    assert read_pointer(POINTER).model == store["r1"]
    first, second = (p["spec"]["template"]["metadata"]["annotations"][RESTARTED_AT] for p in fake.patches)
    assert first != second and stamps(fake) == [second, second]  # restarted again, onto the old pointer
    assert fake.serving() == [store["r1"]] * 2
    for pod in fake.current():
        assert fake.stand_ins[pod["status"]["podIP"]].statuses("/v1/completions")[-1] == 200


def test_an_explicit_rollback_restarts_the_vllm_pods(vllm, store):
    fake, cluster, _ = vllm
    roll_out(POINTER, store["r2"], set_by="run 2", replicas=cluster, timeout_s=600)
    back = roll_back(POINTER, set_by="ops", replicas=cluster, timeout_s=600)
    assert back.model == store["r1"] and len(fake.patches) == 2 and fake.serving() == [store["r1"]] * 2


def test_a_pod_whose_init_container_refuses_the_package_ends_the_wait_at_once(vllm, store):
    fake, cluster, now = vllm
    point_to(POINTER, store["corrupt"], set_by="by hand")  # never verified: the rollout would refuse it
    with pytest.raises(PodsNotServing) as failed:
        cluster.follow(store["corrupt"], timeout_s=600, poll_s=5)
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith("pod lmforge-inference-g2-0 will not start: its init container fetch-model exited 3 "
                              "(the package does not verify or is missing); its log ends: ")
    assert "sha256" in message  # fetch_model's own reason, from its log
    assert now[0] == 0  # no wait: a refused package stays refused
    assert fake.serving() == [store["r1"]] * 2  # the old pods serve on (maxUnavailable 0)


def test_new_pods_that_never_get_ready_time_out_in_one_line(vllm, store):
    fake, cluster, now = vllm
    fake.hold = True
    with pytest.raises(PodsNotServing) as failed:
        cluster.follow(store["r1"], timeout_s=30, poll_s=5)
    message = str(failed.value)
    assert message == ("the restarted pods of ml/lmforge-inference did not all come up within 30 s: 2 old replica(s) "
                       "still terminating; lmforge-inference-g2-0 inference running, not ready; "
                       "lmforge-inference-g2-1 inference running, not ready")
    assert now[0] == 30


def test_an_unreadable_api_key_secret_stops_before_any_restart(vllm, store):
    fake, cluster, _ = vllm
    fake.secret_error = ApiException(status=403, reason="Forbidden")
    fake.secret_error.body = json.dumps({"message": 'secrets "lmforge-api-keys" is forbidden'})
    with pytest.raises(PodsNotServing, match=r"^cannot read the API key from Secret ml/lmforge-api-keys \(key "
                                             r"api-keys\): 403 Forbidden: secrets \"lmforge-api-keys\" is forbidden; "
                                             r"give --api-key-file$"):
        cluster.follow(store["r1"], timeout_s=600)
    assert fake.patches == []


def test_the_rollout_command_restarts_vllm_with_the_key_file(vllm, store, tmp_path, monkeypatch, capsys):
    fake, _, _ = vllm
    fake.instant, fake.loading = True, 0  # the command sleeps for real: a rollout done at the first look
    fake.keys_file = "sk-rollout\n"  # what the new pods take; the Secret is not to be read at all
    fake.secret_error = ApiException(status=403, reason="Forbidden")
    monkeypatch.setattr(rollout, "kubernetes_apis", lambda: (fake, fake, fake))
    keys = tmp_path / "keys"
    keys.write_text("# the rollout's own key\nsk-rollout\n")
    code = rollout.main(["set", POINTER, store["r2"], "--namespace", "ml", "--deployment", "lmforge-inference",
                         "--api-key-file", str(keys)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["model"] == store["r2"] and fake.serving() == [store["r2"]] * 2
    assert "Deployment ml/lmforge-inference restarted (restartedAt " in err  # progress on stderr, not stdout
    for pod in fake.current():
        (completion,) = [r for r in fake.stand_ins[pod["status"]["podIP"]].requests if r["path"] == "/v1/completions"]
        assert completion["auth"] == "Bearer sk-rollout"
