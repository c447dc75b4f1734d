"""The train pipeline's export with evaluation branches: the best evaluated checkpoint (evals/best.json)
is published instead of the final one, as a verified copy of its weights package."""

from __future__ import annotations

import json

import pytest

from lmforge.common.checkpoint_layout import step_dir
from lmforge.common.errors import InputError
from lmforge.common.storage import sha256_file
from lmforge.model.config import GPTConfig
from lmforge.model.package import load_package, write_package
from lmforge.model.transformer import GPT
from lmforge_pipelines import component_bodies as bodies
from lmforge_pipelines.evaluated_model import EvaluatedModelError, evals_best_step, weights_package

PACKAGE_FILES = ("model.safetensors", "tokenizer.json", "config.json")


def _weights_package(run_dir, step: int):
    """A weights package as the trainer leaves it (the package, its meta.json) under run_dir/weights."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = run_dir / "tokenizer.json"
    tokenizer.write_text('{"model": "tiny"}')
    model = GPT(GPTConfig(vocab_size=64, n_layer=1, n_head=2, n_embd=16, context_length=8))
    package = write_package(model, tokenizer, step_dir(run_dir / "weights", step), step=step)
    (package / "meta.json").write_text(json.dumps({"step": step, "tokens": 4096, "run": run_dir.name}))
    return package


def _best(run_dir, **record):
    (run_dir / "evals").mkdir(parents=True, exist_ok=True)
    (run_dir / "evals" / "best.json").write_text(json.dumps(record))


def test_evals_best_step_reads_best_json_and_none_without_it(tmp_path):
    assert evals_best_step(str(tmp_path)) is None
    _best(tmp_path, step=40, score=2.5, package="x", promoted_to=None)
    assert evals_best_step(str(tmp_path)) == 40
    assert evals_best_step(f"file://{tmp_path}") == 40
    _best(tmp_path, score=2.5)
    with pytest.raises(EvaluatedModelError, match="no step"):
        evals_best_step(str(tmp_path))
    (tmp_path / "evals" / "best.json").write_text("{")
    with pytest.raises(EvaluatedModelError, match="not JSON"):
        evals_best_step(str(tmp_path))


def test_export_publishes_the_best_weights_package_not_the_final_checkpoint(tmp_path):
    run = tmp_path / "runs" / "r1"
    source = _weights_package(run, 40)
    _best(run, step=40, score=2.5, package=weights_package(str(run), 40), promoted_to=None)
    models = tmp_path / "models"
    uri, step = bodies.export_run_model(run="r1", run_uri=str(run), step=100, models_store=str(models))
    assert (uri, step) == (str(models / "r1-step40"), 40)
    published = models / "r1-step40"
    assert sorted(p.name for p in published.iterdir()) == sorted(PACKAGE_FILES)  # not meta.json
    for name in PACKAGE_FILES:
        assert sha256_file(published / name) == sha256_file(source / name)
    _, meta = load_package(published, require_checksums=True)
    assert meta["step"] == 40
    # A package its promotion copied already is taken as it is.
    _best(run, step=40, score=2.5, package=weights_package(str(run), 40), promoted_to="s3://m/models/r1-step-40")
    assert bodies.export_run_model(run="r1", run_uri=str(run), step=100, models_store=str(models)) \
        == ("s3://m/models/r1-step-40", 40)


def test_a_corrupt_weights_package_is_not_published(tmp_path):
    run = tmp_path / "r2"
    package = _weights_package(run, 8)
    weights = package / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    _best(run, step=8, score=3.0, package=str(package), promoted_to=None)
    with pytest.raises(InputError, match="sha256"):
        bodies.export_run_model(run="r2", run_uri=str(run), step=10, models_store=str(tmp_path / "models"))
    assert not (tmp_path / "models").exists()


def test_export_copies_the_best_package_between_object_store_prefixes(s3, tmp_path):
    _, make_bucket = s3
    client = make_bucket("pipelines-evals")
    local = _weights_package(tmp_path / "r3", 16)
    for name in (*PACKAGE_FILES, "meta.json"):
        client.upload_file(str(local / name), "pipelines-evals", f"runs/r3/weights/step-00000016/{name}")
    client.put_object(Bucket="pipelines-evals", Key="runs/r3/evals/best.json",
                      Body=json.dumps({"step": 16, "score": 1.0, "promoted_to": None}).encode())
    uri, step = bodies.export_run_model(run="r3", run_uri="s3://pipelines-evals/runs/r3", step=20,
                                        models_store="s3://pipelines-evals/models")
    assert (uri, step) == ("s3://pipelines-evals/models/r3-step16", 16)
    listed = {o["Key"] for o in client.list_objects_v2(Bucket="pipelines-evals", Prefix="models/")["Contents"]}
    assert listed == {f"models/r3-step16/{name}" for name in PACKAGE_FILES}
    body = client.get_object(Bucket="pipelines-evals", Key="models/r3-step16/model.safetensors")["Body"].read()
    assert body == (local / "model.safetensors").read_bytes()
