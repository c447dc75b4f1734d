"""Every step of the compiled Kubeflow pipelines, run in the image the IR names, as the KFP
backend runs it: the container command and args of deploymentSpec.executors (kfp's
`python3 -m kfp.dsl.executor_main` on the component's source), the executor input KFP's
launcher passes, the image's own user, a read-only root with /tmp and the launcher's volumes
writable, and moto's S3 server as the object store (kfp_runner.py plays KFP's driver and
launcher). The data pipeline's steps, chained, write shards to S3; the train pipeline's
(training on CPU with 2 processes through the local launcher) leave a model package in S3.

kfp.local (tests/pipelines/test_local_run.py) runs the same components in this Python; this is
what shows that the images hold what the steps import and run."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import boto3
import pytest
import yaml

from lmforge.dataprep import stages
from lmforge.dataprep.stages import GLOBAL_STAGES
from lmforge.sample_data.inputs import write_sample_inputs
from tests.images.engine import ENGINE, RUN_FLAGS, TAG, engine
from tests.images.kfp_runner import PipelineRunner
from tests.shard_listing import bucket_shards

pytestmark = [
    pytest.mark.images,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(ENGINE) is None,
                       reason=f"{ENGINE} is not installed (`make test` / `make image-tools` installs it)"),
]

BUCKET = "lmforge"
DATA = f"s3://{BUCKET}/datasets/sample"
MAX_ROUNDS = 3  # of the duplicate components: the pipeline is compiled with as many as the config allows
DATAPREP_CONFIG = {"tokenizer": {"vocab_size": 512}, "shards": {"shard_tokens": 20000, "val_fraction": 0.1},
                   "components": {"max_rounds": MAX_ROUNDS}, "trace_index": {"enabled": True}}
STAGE_TASKS = {"combine": 1, "dedup": 2, "components": 2, "tokenize": 1, "shards": 2, "trace-index": 2}
TRAIN_CONFIG = {"data": {"seq_len": 64, "batch_size": 4}, "optim": {"warmup_steps": 1},
                "model": {"overrides": {"n_layer": 2, "n_embd": 64, "context_length": 64}}}
STEPS = 6  # the final checkpoint is step 5
POINTER = f"s3://{BUCKET}/models/current"  # what the inference replicas follow (the chart's inference.model)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, dict]:
    """The pipelines compiled as `make pipelines` does, naming the images the tests build."""
    out = tmp_path_factory.mktemp("ir")
    subprocess.run([sys.executable, "-m", "lmforge_pipelines.compile", "--output", str(out),
                    "--rounds", str(MAX_ROUNDS)], check=True,
                   env={**os.environ, "LMFORGE_IMAGE_TAG": TAG, "LMFORGE_IMAGE_REGISTRY": ""}, capture_output=True)
    return {name: yaml.safe_load((out / f"{name}.yaml").read_text()) for name in ("data", "train")}


@pytest.fixture(scope="module")
def store(s3_endpoint):
    """The object store of the steps: a bucket on moto's server, and the environment a pod would
    give the containers to reach it (on a cluster: the chart's S3 settings and credentials)."""
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    client.create_bucket(Bucket=BUCKET)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": s3_endpoint, "LMFORGE_S3_ANONYMOUS": "0", "HOME": "/tmp", "OMP_NUM_THREADS": "1"}
    return client, env


def _keys(client, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _executors(spec: dict) -> set[str]:
    return {c["executorLabel"] for c in spec["components"].values() if "executorLabel" in c}


@pytest.fixture(scope="module")
def data_run(build, compiled, store, tmp_path_factory):
    build("dataprep")
    client, env = store
    # crawl "sample": WET files generated here and put where the fetch step takes them (no image
    # carries the generator), as `lmforge-sample-data --output s3://…/wet --files 2` would.
    for path, _ in write_sample_inputs(tmp_path_factory.mktemp("wet"), 2, 150):
        client.upload_file(path, BUCKET, f"datasets/sample/wet/{os.path.basename(path)}")
    runner = PipelineRunner(compiled["data"], tmp_path_factory.mktemp("data-steps"), env=env, network="host")
    outputs = runner.run({"crawl": "sample", "shards": 2, "workers": 2, "languages": "en", "output": DATA,
                          "processes_per_worker": 1, "stage_tasks": STAGE_TASKS,
                          "processes_per_task": 1, "dataprep_config": DATAPREP_CONFIG})
    print("".join(f"\n{step.task} ({step.image}): {step.seconds:.0f}s" for step in runner.steps))
    return runner, outputs


def test_data_pipeline_steps_run_in_the_dataprep_image(data_run, compiled, store):
    runner, outputs = data_run
    client, _ = store
    ran = [step.task for step in runner.steps]
    assert ran[:4] == ["fetch-wet", "plan-workers", "prep-worker", "prep-worker"] and ran[-1] == "report-data"
    assert {step.image for step in runner.steps} == {f"lmforge/dataprep:{TAG}"}
    assert {f"exec-{task}" for task in ran} == _executors(compiled["data"])  # every component ran
    assert [step.executor_input["inputs"]["parameterValues"]["worker_index"] for step in runner.steps[2:4]] == [0, 1]
    # Then the global stages in their declared order, each split one's tasks fanned out.
    params = [step.executor_input["inputs"]["parameterValues"] for step in runner.steps[4:-1]]
    fanned = [(p["stage"], p.get("round"), p["task_index"]) for p in params if "task_index" in p]
    order = [s.name for s in GLOBAL_STAGES]
    assert [stage for stage, _, _ in fanned] == sorted((stage for stage, _, _ in fanned), key=order.index)
    for stage in GLOBAL_STAGES:
        if stage.split and stage.kind != stages.ROUNDS:
            assert [i for name, _, i in fanned if name == stage.name] == list(range(STAGE_TASKS[stage.name]))
    rounds = sorted({r for name, r, _ in fanned if name == "components"})
    assert rounds == list(range(MAX_ROUNDS))  # every round planned; those after the settled one do nothing
    assert [i for name, _, i in fanned if name == "components"] == list(range(STAGE_TASKS["components"])) * MAX_ROUNDS
    assert [p["stage"] for p in params if "task_index" not in p and "stage_tasks" not in p] == ["tokenizer"]
    # The shards are in the object store, listed by the manifest, with the report.
    assert outputs == {"data": DATA}
    keys = set(_keys(client, "datasets/sample/"))
    manifest = json.loads(client.get_object(Bucket=BUCKET, Key="datasets/sample/manifest.json")["Body"].read())
    shards = bucket_shards(client, BUCKET, "datasets/sample")
    assert {s["split"] for s in shards} == set(manifest["splits"]) == {"train", "val"}
    assert {f"datasets/sample/{s['path']}" for s in shards} <= keys
    assert {"datasets/sample/tokenizer.json", "datasets/sample/report.html"} <= keys
    # the trace index, built in the image by infini-gram's indexer, over every train shard's documents
    trace = json.loads(client.get_object(Bucket=BUCKET, Key="datasets/sample/trace-index/index.json")["Body"].read())
    assert trace["documents"] == sum(s["documents"] for s in shards if s["split"] == "train") > 0
    assert {f"datasets/sample/trace-index/{p['name']}/table.0" for p in trace["partitions"]} <= keys
    # The artifacts, written where KFP's launcher would upload them from.
    final = runner.steps[-1].artifacts
    assert json.loads(final["dataset"]["path"].read_text()) == manifest
    assert final["dataset"]["metadata"]["uri"] == DATA and final["dataset"]["metadata"]["vocab_size"] == 512
    assert final["report"]["path"].read_text().lstrip().lower().startswith("<!doctype html")
    assert final["metrics"]["metadata"]["train_shards"] >= 1


@pytest.fixture(scope="module")
def train_run(build, data_run, compiled, store, tmp_path_factory):
    build("trainer")
    uploader = build("uploader")
    client, env = store
    runs = tmp_path_factory.mktemp("runs")

    def publish_checkpoints(outputs: dict) -> dict:
        """On a cluster the uploader sidecar puts the run's checkpoints in the object store and the
        training step returns that s3:// run; the local launcher keeps them in a local folder. So
        the uploader image publishes them here as the sidecar would, and export gets the s3:// run,
        which it restores with `lmforge-uploader restore`."""
        assert outputs["run_uri"] == f"/runs/{outputs['run']}", outputs
        remote = f"s3://{BUCKET}/runs/{outputs['run']}"
        flags = [*RUN_FLAGS, "--rm", "--network", "host", "--read-only", "--volume", f"{runs}:/runs"]
        for key, value in env.items():
            flags += ["--env", f"{key}={value}"]
        engine("run", *flags, uploader, "watch", "--dir", f"{outputs['run_uri']}/checkpoints", "--dest", remote,
               "--exit-when-done", timeout=180)
        return {**outputs, "run_uri": remote}

    runner = PipelineRunner(compiled["train"], tmp_path_factory.mktemp("train-steps"), env=env, network="host",
                            volumes={runs: "/runs"}, extra_flags=["--shm-size", "256m"],
                            after={"train-model": publish_checkpoints})
    outputs = runner.run({"data": DATA, "model_preset": "tiny", "steps": STEPS, "nodes": 2, "gpus_per_node": 0,
                          "parallel_mode": "fsdp", "train_config": TRAIN_CONFIG, "run_name": "e2e",
                          "launcher": "local", "checkpoint_store": "/runs", "models_store": f"s3://{BUCKET}/models",
                          "eval_sequences": 16, "rollout": True, "model_pointer": POINTER})
    print("".join(f"\n{step.task} ({step.image}): {step.seconds:.0f}s" for step in runner.steps))
    return runner, outputs, runs


def test_train_pipeline_steps_run_in_the_trainer_image(train_run, compiled, store, tmp_path, monkeypatch):
    from lmforge.model.package import fetch_package, load_package
    from lmforge.model.pointer import read_pointer
    from tests.s3_server import s3_env

    runner, outputs, runs = train_run
    client, env = store
    ran = [step.task for step in runner.steps]
    assert ran == ["train-model", "export-model", "evaluate-model", "rollout-model"]
    assert {step.image for step in runner.steps} == {f"lmforge/trainer:{TAG}"}
    assert {f"exec-{task}" for task in ran} == _executors(compiled["train"])  # every component ran
    train, export, evaluate, rollout = runner.steps
    # Training: torchrun with 2 CPU processes (2 nodes × 1 process, no GPU), FSDP, to the last step.
    assert train.outputs == {"run": "e2e", "run_uri": "/runs/e2e", "step": STEPS - 1}
    assert "torch.distributed.run --standalone --nproc_per_node=2 " in (runs / "e2e" / "launcher.log").read_text()
    assert json.loads((runs / "e2e" / "config.json").read_text())["parallel"]["mode"] == "fsdp"
    # Export restored the checkpoint from the object store and published the package there.
    assert "lmforge-uploader restore --src s3://lmforge/runs/e2e" in export.log
    model_uri = f"s3://{BUCKET}/models/e2e-step{STEPS - 1}"
    assert outputs["model_uri"] == model_uri
    assert _keys(client, f"models/e2e-step{STEPS - 1}/") == [
        f"models/e2e-step{STEPS - 1}/{name}" for name in ("config.json", "model.safetensors", "tokenizer.json")]
    assert export.artifacts["model"]["metadata"] == {"uri": model_uri, "run": "e2e", "step": STEPS - 1}
    s3_env(monkeypatch, env["AWS_ENDPOINT_URL"])
    model, meta = load_package(fetch_package(model_uri, tmp_path / "model"))
    assert meta["step"] == STEPS - 1 and model.config.n_layer == 2 and model.config.vocab_size == 512
    # Evaluation of that package on the val shards in S3.
    val_loss = outputs["val_loss"]
    assert math.isfinite(val_loss) and 0 < val_loss < math.log(512) + 1
    assert evaluate.artifacts["metrics"]["metadata"]["val_loss"] == pytest.approx(val_loss)
    # The rollout step (rollout=True; no Deployment to wait for with the local launcher) pointed
    # the model pointer at the evaluated package.
    assert rollout.executor_input["inputs"]["parameterValues"]["model_uri"] == model_uri
    assert model_uri in rollout.outputs["Output"]
    pointer = read_pointer(POINTER)
    assert pointer is not None and pointer.model == model_uri and runner.run_id in pointer.set_by
