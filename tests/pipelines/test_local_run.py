"""kfp.local runs the data and train pipelines end to end on a small generated corpus, in this
environment (SubprocessRunner(use_venv=False)), with the local torchrun launcher.

kfp.local checks the pipelines' plumbing (ParallelFor fan-out, dsl.Collected, artifacts, the
rollout condition), not Kubernetes: resources, retries and images are ignored there
(ANCHORS, "what to avoid" 5). The Kubernetes launcher (PyTorchJob, TrainJob) is tested against a fake API in
test_launcher.py; the object-store path of the steps is tested against a loopback S3 below.
"""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from lmforge.common.shards import open_shard, read_doc_ends
from lmforge.model.package import load_package
from lmforge.sample_data.inputs import write_sample_inputs
from lmforge_pipelines import component_bodies as bodies
from lmforge_pipelines.launcher import newest_remote_step
from tests.shard_listing import local_shards

pytestmark = [
    pytest.mark.slow,
    # kfp.local says, for every task, that the step images and resource requests do not apply here.
    pytest.mark.filterwarnings("ignore:.*have no effect in the current local runner:UserWarning"),
    pytest.mark.filterwarnings("ignore:You may be attemping to run a task:RuntimeWarning"),
]

ROUNDS = 4  # of the duplicate components: the pipeline schedules as many as the config allows
DATAPREP_CONFIG = {"tokenizer": {"vocab_size": 512}, "shards": {"shard_tokens": 20000, "val_fraction": 0.1},
                   "components": {"max_rounds": ROUNDS}}
TRAIN_CONFIG = {"data": {"seq_len": 64, "batch_size": 4}, "optim": {"warmup_steps": 1},
                "model": {"overrides": {"n_layer": 2, "n_embd": 64, "context_length": 64}}}


@pytest.fixture(scope="module")
def kfp_local(tmp_path_factory):
    from kfp import local

    root = tmp_path_factory.mktemp("kfp-local")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root / "pipeline-root"))
    return root


@pytest.fixture(scope="module")
def data_run(kfp_local):
    from lmforge_pipelines.data_pipeline import build_data_pipeline, split_stage_tasks

    write_sample_inputs(kfp_local / "data" / bodies.WET_DIR, 2, 150)  # where the fetch step takes them
    task = build_data_pipeline(ROUNDS)(crawl="sample", shards=2, workers=2, languages="en",
                                       output=str(kfp_local / "data"), stage_tasks=split_stage_tasks(2),
                                       processes_per_task=1, dataprep_config=DATAPREP_CONFIG)
    return kfp_local, task.outputs


@pytest.fixture(scope="module")
def train_run(data_run):
    from lmforge_pipelines.train_pipeline import train_pipeline

    root, data = data_run
    task = train_pipeline(data=data["data"], model_preset="tiny", steps=6, nodes=1, gpus_per_node=2,
                          parallel_mode="fsdp", train_config=TRAIN_CONFIG, launcher="local", run_name="e2e",
                          checkpoint_store=str(root / "runs"), models_store=str(root / "models"), eval_sequences=16)
    return root, task.outputs


def test_data_pipeline_writes_decodable_shards_and_the_report_artifact(data_run):
    from tokenizers import Tokenizer

    root, outputs = data_run
    data = root / "data"
    assert outputs["data"] == str(data)
    manifest = json.loads((data / "manifest.json").read_text())
    # Both workers' inputs made it into the shards (their per-input stats exist), deduplicated globally.
    done = sorted(p.name for p in (data / "work" / "done").iterdir())
    assert {"input-000000", "input-000001"} <= set(done)
    # and so did each fan-out task's share: both inputs tokenized, both shard partitions written.
    assert {"tokenize-000000", "tokenize-000001"} <= set(done)
    partitions = sorted(p.name for p in (data / "work" / "shards").iterdir())
    assert partitions == ["partition-000000.json", "partition-000001.json"]
    report = json.loads((data / "report.json").read_text())
    assert report["inputs"]["records"] == 300 and report["dedup"]["removed"]["near_duplicate"] > 0
    assert set(report["languages"]) - {"en"}, "the corpus has other languages; only en is kept"
    tokenizer = Tokenizer.from_file(str(data / "tokenizer.json"))
    shards = local_shards(data)
    assert {s["split"] for s in shards} == set(manifest["splits"]) == {"train", "val"}
    for entry in shards:
        header, tokens = open_shard(data / entry["path"])
        assert header.token_count == entry["tokens"] == len(tokens) and header.vocab_size == 512
    header, tokens = open_shard(data / shards[0]["path"])
    first = tokenizer.decode(tokens[: read_doc_ends(data / shards[0]["path"])[0]].tolist())
    assert len(first) > 100 and sum(c.isalpha() for c in first) > 0.6 * len(first)
    # The artifacts: the HTML report for the UI, the dataset pointer with its metadata.
    report_html = outputs["report"]
    with open(report_html.path, encoding="utf-8") as f:
        html = f.read()
    assert html == (data / "report.html").read_text() and html.lstrip().lower().startswith("<!doctype html")
    dataset = outputs["dataset"]
    assert dataset.metadata["uri"] == str(data) and dataset.metadata["vocab_size"] == 512
    with open(dataset.path, encoding="utf-8") as f:
        assert json.load(f) == manifest


def test_train_pipeline_trains_exports_and_evaluates(train_run):
    root, outputs = train_run
    run_dir = root / "runs" / "e2e"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(m.get("step", -1) for m in metrics) == 5
    assert json.loads((run_dir / "config.json").read_text())["parallel"]["mode"] == "fsdp"
    assert "torch.distributed.run --standalone --nproc_per_node=2 " in (run_dir / "launcher.log").read_text()
    model_uri = outputs["model_uri"]
    assert model_uri == str(root / "models" / "e2e-step5")
    model, meta = load_package(model_uri)
    assert meta["step"] == 5 and model.config.n_layer == 2 and model.config.vocab_size == 512
    val_loss = outputs["val_loss"]
    assert math.isfinite(val_loss) and 0 < val_loss < math.log(512) + 1
    assert outputs["metrics"].metadata["val_loss"] == pytest.approx(val_loss)
    assert outputs["model"].metadata == {"uri": model_uri, "run": "e2e", "step": 5}


def test_object_store_path_of_the_train_steps(data_run, s3, tmp_path):
    """What the steps do after a PyTorchJob on a cluster: the run's checkpoints are in S3 (as the
    uploader sidecar leaves them), the data is in S3; export restores and publishes to S3, and
    the evaluation reads the package and the val shards from S3."""
    root, _ = data_run
    _, make_bucket = s3
    client = make_bucket("pipelines-e2e")
    for path in sorted((root / "data").rglob("*")):
        rel = path.relative_to(root / "data").as_posix()
        if path.is_file() and not rel.startswith(("work/", "wet/")):
            client.upload_file(str(path), "pipelines-e2e", f"datasets/small/{rel}")
    data = "s3://pipelines-e2e/datasets/small"
    # Train on the s3:// data (as the pods do), then let the uploader publish the checkpoints.
    result = bodies.train(run="s3run", data=data, model_preset="tiny", steps=3, nodes=1, gpus_per_node=0,
                         parallel_mode="none", train_config=TRAIN_CONFIG, launcher="local",
                         checkpoint_store=str(tmp_path / "runs"), timeout_hours=0.1)
    assert result.step == 2
    uploader = [bodies.cli("lmforge-uploader"), "watch", "--dir",
                f"{result.run_uri}/checkpoints", "--dest", "s3://pipelines-e2e/runs/s3run", "--exit-when-done"]
    subprocess.run(uploader, check=True, timeout=120)
    assert newest_remote_step("s3://pipelines-e2e/runs/s3run") == 2
    model_uri = bodies.export_model(run_uri="s3://pipelines-e2e/runs/s3run", step=2,
                                   models_store="s3://pipelines-e2e/models", version="s3run-step2")
    assert model_uri == "s3://pipelines-e2e/models/s3run-step2"
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="pipelines-e2e", Prefix="models/")["Contents"]]
    assert sorted(keys) == [f"models/s3run-step2/{n}" for n in ("config.json", "model.safetensors", "tokenizer.json")]
    result = bodies.evaluate(model_uri=model_uri, data=data, max_sequences=8)
    assert math.isfinite(result["val_loss"]) and result["step"] == 2 and result["val_sequences"] == 8
