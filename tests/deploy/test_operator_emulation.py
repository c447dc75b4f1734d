"""The chart's workloads run as a cluster would run them (tests/deploy/emulation.py): the rendered
containers' own commands as local processes, with the env their controllers inject, against the
loopback S3 server, Pushgateway and each other.

- PyTorchJob and TrainJob (Trainer v2), 2 nodes × 1 process each: restore init container, uploader
  sidecar and both nodes' torchrun (the TrainJob's rank 1 with its restore and uploader standing
  by); checkpoints land in S3; a second launch on a fresh volume restores the newest one and
  resumes from it.
- Deployment: the inference server answers the probe paths it declares, and a completion with the
  key from the mounted Secret.
- CronJob: the canary passes against that Deployment's Service and pushes its result.
- Indexed Job of workers, then one Job per global stage in hook-weight order (as Helm runs them),
  the Indexed ones pod by pod: data prep from WET files in S3 to shards in S3.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from lmforge.common.checkpoint_layout import step_name
from lmforge.dataprep.stages import GLOBAL_STAGES, ROUNDS
from tests.deploy.emulation import (
    VENV_BIN,
    Cluster,
    Pod,
    launch_pytorchjob,
    launch_trainjob,
    probe_url,
    run_job_pod,
)
from tests.helm_chart import find, render
from tests.prometheus_tools import pushed_groups, pushed_value, running_pushgateway
from tests.s3_server import make_bucket
from tests.shard_listing import bucket_shards
from tests.trainer.helpers import random_output, read_metrics

ROUNDS_RUN = 3  # components rounds the data-prep emulation schedules (components.max_rounds)

pytestmark = pytest.mark.slow

# The Secrets the chart references by name (it never creates them): the keys moto accepts, API keys.
API_KEY = "emulation-key-1"
SECRETS = {"lmforge-s3": {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"},
           "lmforge-api-keys": {"keys": f"{API_KEY}\n"}}
# Services of the subcharts (not vendored under helm/lmforge/charts, so not rendered here):
# name → port, as <release>-prometheus-pushgateway / <release>-opentelemetry-collector expose them.
PUSHGATEWAY_SERVICE = ("lmforge-prometheus-pushgateway", 9091)
OTEL_SERVICE = ("lmforge-opentelemetry-collector", 4318)
CLAIM = "lmforge-checkpoints"
# The chart's default eval set, with room for the tiny test tokenizer (17 tokens for the pangram's end).
EVAL_SET = {"name": "emulation",
            "held_out": [{"id": "pangram", "text": "The quick brown fox jumps over the lazy dog."},
                         {"id": "water", "text": "Water boils at one hundred degrees Celsius at sea level."}],
            "checks": [{"id": "pangram", "prompt": "The quick brown fox", "expected": " jumps over the lazy dog.",
                        "max_tokens": 24}]}
RUN = "emulation"


def s3_values(endpoint: str) -> dict:
    return {"s3": {"endpointUrl": endpoint, "region": "us-east-1", "credentialsSecret": "lmforge-s3"}}


def upload_tree(client, bucket: str, root: Path, prefix: str) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(root).as_posix()}")


def keys(client, bucket: str, prefix: str) -> set[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {o["Key"] for page in pages for o in page.get("Contents", [])}


def failures(pods: list[Pod]) -> str:
    return "\n".join(pod.report() for pod in pods)


# -- training: PyTorchJob and TrainJob -------------------------------------------------------------


def training_values(endpoint: str, steps: int, operator: str) -> dict:
    return {**s3_values(endpoint), "training": {
        "enabled": True, "operator": operator, "run": RUN, "objectStore": "s3://emu-train/runs", "nodes": 2,
        "nprocPerNode": 1, "checkpoints": {"persistentVolumeClaim": CLAIM},
        "config": {
            "model": {"preset": "tiny", "overrides": {"n_layer": 1, "n_head": 2, "n_embd": 32, "context_length": 32}},
            "data": {"sources": [{"path": "s3://emu-train/datasets/synthetic"}], "seq_len": 32, "batch_size": 4},
            "optim": {"warmup_steps": 1}, "checkpoint": {"every": 2}, "eval_every": 0, "steps": steps}}}


def launch_training(cluster: Cluster, operator: str) -> list[Pod]:
    """The rendered job run the way its operator runs it; the pods, node rank 0 first."""
    if operator == "pytorchjob":
        (job,) = find(cluster.objects, "PyTorchJob")
        replicas = job["spec"]["pytorchReplicaSpecs"]
        assert {role: r["replicas"] for role, r in replicas.items()} == {"Master": 1, "Worker": 1}
        assert job["spec"]["nprocPerNode"] == "1"
        return launch_pytorchjob(cluster, job, timeout=300)
    (runtime,) = find(cluster.objects, "TrainingRuntime")
    (trainjob,) = find(cluster.objects, "TrainJob")
    assert trainjob["spec"]["trainer"] == {"numNodes": 2, "numProcPerNode": 1}
    return launch_trainjob(cluster, trainjob, runtime, timeout=300)


def manifests(client) -> dict[int, dict]:
    found = {}
    for key in keys(client, "emu-train", f"runs/{RUN}/checkpoints/"):
        if key.endswith("/MANIFEST.json"):
            body = client.get_object(Bucket="emu-train", Key=key)["Body"].read()
            found[int(key.split("/")[-2].removeprefix("step-"))] = json.loads(body)
    return found


def check_launch(pods: list[Pod], operator: str) -> tuple[Pod, Pod, str]:
    """Every container exited 0: trainers on their own, the sidecars on SIGTERM (rank 0's after
    draining). On the shared claim node rank 0 alone restores and uploads."""
    rank0, rank1 = pods
    trainer = {"pytorchjob": "pytorch", "trainjob": "node"}[operator]
    assert rank0.exit_codes() == {"restore": 0, "uploader": 0, trainer: 0}, failures(pods)
    if operator == "pytorchjob":
        assert rank1.exit_codes() == {trainer: 0}, failures(pods)  # restore and uploader: Master only
    else:  # one pod template: rank 1 has them too, and they stand by
        assert rank1.exit_codes() == {"restore": 0, "uploader": 0, trainer: 0}, failures(pods)
        for name in ("restore", "uploader"):
            assert [e["node_rank"] for e in rank1.containers[name].events("standing_by")] == [1], failures(pods)
            assert not rank0.containers[name].events("standing_by")
    uploader = rank0.containers["uploader"]
    assert uploader.events("stopping") and uploader.events("drained"), uploader.tail()
    # The ports the rendered args give the trainer's and the uploader's /metrics are the declared ones.
    (serving,) = rank0.containers[trainer].events("metrics_serving")
    assert serving["port"] == rank0.port("metrics")
    (serving,) = uploader.events("metrics_serving")
    assert serving["port"] == rank0.port("uploader-metrics")
    starts = rank0.containers[trainer].events("train_start")
    assert [s["world_size"] for s in starts] == [2]  # rank 0 logs it; both nodes joined
    return rank0, rank1, trainer


@pytest.mark.parametrize("operator", ["pytorchjob", "trainjob"])
def test_training_job_trains_uploads_checkpoints_and_a_second_launch_resumes_from_them(operator, s3_endpoint,
                                                                                       tmp_path):
    client = make_bucket(s3_endpoint, "emu-train")
    for key in keys(client, "emu-train", f"runs/{RUN}/"):  # the bucket is the session's: start clean
        client.delete_object(Bucket="emu-train", Key=key)
    upload_tree(client, "emu-train", random_output(tmp_path / "prepared"), "datasets/synthetic")

    objects = render(training_values(s3_endpoint, steps=4, operator=operator))
    with Cluster(tmp_path / "launch-1", objects, SECRETS) as cluster:
        pods = launch_training(cluster, operator)
        rank0, rank1, trainer = check_launch(pods, operator)
        assert rank0.containers["restore"].events("restore_nothing")  # an empty store: a fresh start
        run_dir = cluster.claim(CLAIM) / RUN  # run_dir=/checkpoints/<run> on the shared claim
        assert [r["step"] for r in read_metrics(run_dir)] == [0, 1, 2, 3]
        for pod in (rank0, rank1):  # each node streamed the s3:// source through its own block cache in /cache
            assert list((pod.volumes["cache"] / "data" / "blocks").glob("*/*"))

    stored = manifests(client)
    assert sorted(stored) == [1, 3]  # checkpoint.every=2, and the final step
    files = {f["path"] for f in stored[3]["files"]}
    # Both nodes' ranks wrote into the shared claim, and rank 0's sidecar uploaded it all.
    assert {"rng-rank00000.pt", "rng-rank00001.pt", "meta.json", ".metadata"} <= files
    assert {f for f in files if f.endswith(".distcp")}

    # A second launch, on a fresh volume (a new claim, or the old one lost), with more steps.
    objects = render(training_values(s3_endpoint, steps=6, operator=operator))
    with Cluster(tmp_path / "launch-2", objects, SECRETS) as cluster:
        pods = launch_training(cluster, operator)
        rank0, rank1, trainer = check_launch(pods, operator)
        restored = rank0.containers["restore"].events("restored")
        assert len(restored) == 1, rank0.containers["restore"].tail()
        (restored,) = restored
        checkpoints = cluster.claim(CLAIM) / RUN / "checkpoints"
        assert restored["step"] == 3 and restored["path"] == str(checkpoints / step_name(3))
        loaded = [e for pod in pods for e in pod.containers[trainer].events("checkpoint_loaded")]
        assert sorted((e["rank"], e["step"]) for e in loaded) == [(0, 3), (1, 3)]
        assert [r["step"] for r in read_metrics(cluster.claim(CLAIM) / RUN)] == [4, 5]  # not from 0
    assert sorted(manifests(client)) == [1, 3, 5]


# -- serving: Deployment and the canary CronJob --------------------------------------------------


class _OtlpSink(BaseHTTPRequestHandler):
    """Stands in for the OpenTelemetry collector's OTLP/HTTP receiver: accepts and counts."""

    received: list[str] = []

    def do_POST(self):  # noqa: N802 - the http.server hook
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.received.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def otlp_sink():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OtlpSink)
    _OtlpSink.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], _OtlpSink.received
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def pushgateway():
    with running_pushgateway() as url:
        yield url


@pytest.fixture(scope="module")
def serving(s3_endpoint, pushgateway, tmp_path_factory):
    """The inference Deployment's pod serving a package from S3, its Service, the canary CronJob."""
    from tests.serving import train_tiny_package

    root = tmp_path_factory.mktemp("serving")
    # A version of its own: the server's download cache (/tmp/lmforge-models, a code default the
    # manifest does not name) is this machine's /tmp here, keyed by the URI; removed afterwards.
    version = f"v-{uuid.uuid4().hex[:12]}"
    model_uri = f"s3://emu-serve/models/{version}"
    client = make_bucket(s3_endpoint, "emu-serve")
    upload_tree(client, "emu-serve", train_tiny_package(root / "package" / version), f"models/{version}")
    objects = render({**s3_values(s3_endpoint),
                      "inference": {"model": model_uri, "apiKeys": {"secretName": "lmforge-api-keys"}},
                      "canary": {"baseline": "s3://emu-serve/canary/baseline.json", "evalSet": EVAL_SET}})
    (deployment,) = find(objects, "Deployment", "lmforge-inference")
    with otlp_sink() as (otlp_port, spans), Cluster(root / "cluster", objects, SECRETS) as cluster:
        cluster.register(*PUSHGATEWAY_SERVICE, int(pushgateway.rsplit(":", 1)[1]))
        cluster.register(*OTEL_SERVICE, otlp_port)
        pod = cluster.pod("lmforge-inference-0", deployment["spec"]["template"])
        pod.run_init_containers(timeout=60)
        pod.start_main()
        cluster.expose("lmforge-inference", pod)
        try:
            yield cluster, pod, objects, spans
        finally:
            pod.terminate()
            cache = Path("/tmp/lmforge-models") / hashlib.sha256(model_uri.encode()).hexdigest()[:16]
            shutil.rmtree(cache, ignore_errors=True)


def wait_ok(url: str, server, timeout: float = 90) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        assert server.poll() is None, f"{server} exited {server.poll()}\n{server.tail()}"
        with contextlib.suppress(httpx.HTTPError):
            response = httpx.get(url, timeout=5)
            if response.status_code == 200:
                return response
        assert time.monotonic() < deadline, f"{url} not 200 within {timeout}s\n{server.tail()}"
        time.sleep(0.2)


def test_inference_deployment_answers_its_probes_and_a_completion_with_the_mounted_key(serving):
    cluster, pod, _, spans = serving
    server = pod.containers["inference"]
    for probe in ("livenessProbe", "readinessProbe"):
        wait_ok(probe_url(pod, "inference", probe), server)
    # Through the Service, with the key from the file the Secret volume puts where the args point.
    base = "http://" + cluster.endpoints["lmforge-inference:8000"]
    spec = pod.container_spec("inference")
    (keys_file,) = [a.split("=", 1)[1] for a in spec["args"] if a.startswith("api_keys_file=")]
    key = pod.mounted(spec, keys_file).read_text().split()[0]
    body = {"prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0}
    assert httpx.post(f"{base}/v1/completions", json=body, timeout=60).status_code == 401
    response = httpx.post(f"{base}/v1/completions", json=body, timeout=60, headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"]
    metrics = httpx.get("http://" + cluster.endpoints["lmforge-inference:9400"] + "/metrics", timeout=10)
    assert "lmforge_inference_requests_total" in metrics.text
    deadline = time.monotonic() + 30  # the span batch goes out within its 5 s schedule
    while "/v1/traces" not in spans and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "/v1/traces" in spans  # OTEL_EXPORTER_OTLP_ENDPOINT reaches the collector's Service


def test_canary_cronjob_passes_against_the_service_and_pushes_its_result(serving, pushgateway):
    cluster, pod, objects, _ = serving
    wait_ok(probe_url(pod, "inference", "readinessProbe"), pod.containers["inference"])
    (cronjob,) = find(objects, "CronJob", "lmforge-canary")
    template = cronjob["spec"]["jobTemplate"]["spec"]["template"]
    canary = run_job_pod(cluster, "lmforge-canary-emulated", template, timeout=180)
    run = canary.containers["canary"]
    assert run.poll() == 0, run.tail()
    assert run.events("baseline_missing")  # none recorded yet: the run passes and says so
    assert [c["id"] for c in run.events("check_done")] == ["pangram"]  # the eval set of the ConfigMap
    (result,) = run.events("canary_result")
    assert result["passed"] is True and result["score"] == 1.0  # the memorized pangram, through the Service
    models = httpx.get("http://" + cluster.endpoints["lmforge-inference:8000"] + "/v1/models", timeout=10,
                       headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert result["model"] == models["data"][0]["id"]
    group = {"job": "lmforge-canary", "model": result["model"]}
    assert pushed_value(pushgateway, "lmforge_canary_passed", **group) == 1
    assert pushed_value(pushgateway, "lmforge_canary_score", **group) == 1
    assert pushed_value(pushgateway, "lmforge_canary_perplexity", **group) == pytest.approx(result["perplexity"])


# -- data prep: the workers' Indexed Job, then a Job per global stage ---------------------------------


def run_job(cluster: Cluster, job: dict, timeout: float) -> list[Pod]:
    """A Job's pods as its controller runs them: an Indexed Job's `completions` pods, `parallelism`
    at a time, each with its JOB_COMPLETION_INDEX; any other Job's one pod."""
    name, spec = job["metadata"]["name"], job["spec"]
    if spec.get("completionMode") != "Indexed":
        return [run_job_pod(cluster, f"{name}-0", spec["template"], timeout=timeout)]
    pods = []
    completions, parallelism = spec["completions"], spec["parallelism"]
    for first in range(0, completions, parallelism):
        indices = range(first, min(first + parallelism, completions))
        wave = [cluster.pod(f"{name}-{i}", spec["template"]) for i in indices]
        for index, pod in enumerate(wave, start=first):
            pod.start_main({"JOB_COMPLETION_INDEX": str(index)})
        for pod in wave:
            for started in pod.main():
                started.wait(timeout)
        pods += wave
    return pods


def hook_jobs_in_helm_order(objects: list[dict]) -> list[dict]:
    """The post-install hook Jobs in the order Helm runs them: ascending weight, then name."""
    hooks = [j for j in find(objects, "Job") if "post-install" in j["metadata"].get("annotations", {}).get(
        "helm.sh/hook", "").split(",")]
    return sorted(hooks, key=lambda j: (int(j["metadata"]["annotations"].get("helm.sh/hook-weight", "0")),
                                        j["metadata"]["name"]))


def test_dataprep_indexed_job_workers_then_every_stage_job(s3_endpoint, pushgateway, tmp_path):
    client = make_bucket(s3_endpoint, "emu-data")
    for seed in (1, 2):
        wet = tmp_path / f"in-{seed}.warc.wet.gz"
        done = subprocess.run([str(VENV_BIN / "lmforge-sample-data"), "--output", str(wet), "--docs", "120",
                               "--seed", str(seed)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        client.upload_file(str(wet), "emu-data", f"wet/in-{seed}.warc.wet.gz")
    indexed = {"tasks": 2, "parallelism": 2}
    objects = render({**s3_values(s3_endpoint), "dataprep": {
        "enabled": True, "input": ["s3://emu-data/wet/*.warc.wet.gz"], "output": "s3://emu-data/datasets/emu",
        "workers": 2, "parallelism": 2,
        "stages": {"dedup": {"tasks": 3, "parallelism": 2}, "tokenize": indexed, "shards": indexed,
                   "components": indexed, "combine": indexed},
        "config": {"tokenizer": {"vocab_size": 600}, "shards": {"val_fraction": 0.05},
                   "components": {"tasks": 2, "max_rounds": ROUNDS_RUN}}}})
    # Named after the run, by default the output's last segment.
    (workers,) = find(objects, "Job", "lmforge-dataprep-emu-workers")
    stages = hook_jobs_in_helm_order(objects)
    assert [j["metadata"]["name"] for j in stages] == [
        f"lmforge-dataprep-emu-{s.name}-{r:02d}" if s.kind == ROUNDS else f"lmforge-dataprep-emu-{s.name}"
        for s in GLOBAL_STAGES for r in range(ROUNDS_RUN if s.kind == ROUNDS else 1)
        if s.name != "trace-index"]  # only with config trace_index.enabled
    assert workers["spec"]["completionMode"] == "Indexed"
    completions = workers["spec"]["completions"]

    with Cluster(tmp_path / "cluster", objects, SECRETS) as cluster:
        cluster.register(*PUSHGATEWAY_SERVICE, int(pushgateway.rsplit(":", 1)[1]))
        pods = run_job(cluster, workers, timeout=240)
        for index, pod in enumerate(pods):
            assert pod.exit_codes() == {"dataprep": 0}, pod.report()
            (done,) = pod.containers["dataprep"].events("worker_complete")
            assert (done["worker_index"], done["num_workers"]) == (index, completions)
        pushed = {g["labels"].get("worker") for g in pushed_groups(pushgateway)
                  if g["labels"].get("job") == "lmforge-dataprep"}
        assert {str(i) for i in range(completions)} <= pushed

        # As Helm runs the hooks: one Job at a time, each to completion, the Indexed ones pod by pod.
        for job in stages:
            pods = run_job(cluster, job, timeout=300)
            assert len(pods) == job["spec"].get("completions", 1), job["metadata"]["name"]
            assert all(pod.exit_codes() == {"dataprep": 0} for pod in pods), failures(pods)

    stored = keys(client, "emu-data", "datasets/emu/")
    manifest = json.loads(client.get_object(Bucket="emu-data", Key="datasets/emu/manifest.json")["Body"].read())
    inputs = json.loads(client.get_object(Bucket="emu-data", Key="datasets/emu/work/inputs.json")["Body"].read())
    assert inputs == ["s3://emu-data/wet/in-1.warc.wet.gz", "s3://emu-data/wet/in-2.warc.wet.gz"]
    shards = bucket_shards(client, "emu-data", "datasets/emu")
    assert {s["split"] for s in shards} == set(manifest["splits"]) == {"train", "val"}
    assert all(f"datasets/emu/{s['path']}" in stored for s in shards)
    assert {"datasets/emu/tokenizer.json", "datasets/emu/report.json"} <= stored
    # Each shards pod wrote its own partitions' shards: shards/{split}_{partition}_{k}.bin.
    partitions = {re.fullmatch(r"shards/train_(\d{6})_\d{4}\.bin", s["path"]).group(1)
                  for s in shards if s["split"] == "train"}
    assert partitions == {"000000", "000001"}  # one per input (shards.inputs_per_partition: 1)
