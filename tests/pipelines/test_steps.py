"""The steps' parameter plumbing: UI values → the services' CLI arguments."""

from __future__ import annotations

import json

import pytest

from lmforge.common.config import cli_overrides
from lmforge.dataprep.config import load_dataprep_config
from lmforge.sample_data.inputs import write_sample_inputs
from lmforge.trainer.config import load_train_config
from lmforge_pipelines import component_bodies as bodies


def test_flatten_nested_and_dotted_keys_with_kfp_struct_numbers():
    # KFP hands dict parameters over as protobuf Structs: every number is a double.
    config = {"tokenizer": {"vocab_size": 512.0}, "shards.val_fraction": 0.1, "model": {"overrides": {}},
              "optim": {"betas": [0.9, 0.95]}, "steps": {"langid": {"enabled": False}}, "tracking": {"run_name": "a b"}}
    pairs = bodies.flatten(config)
    assert pairs == ["tokenizer.vocab_size=512", "shards.val_fraction=0.1", "model.overrides={}",
                     "optim.betas=[0.9, 0.95]", "steps.langid.enabled=false", 'tracking.run_name="a b"']
    assert cli_overrides(pairs)["tokenizer"]["vocab_size"] == 512


def test_languages():
    assert bodies.parse_languages(" en, DE ,") == ["en", "de"]
    assert bodies.parse_languages(["fr"]) == ["fr"]
    for bad in ("", "english", "en;de"):
        with pytest.raises(bodies.StepError, match="languages"):
            bodies.parse_languages(bad)


def test_dataprep_overrides_load_as_the_services_config():
    args = bodies.dataprep_overrides("en,de", {"tokenizer": {"vocab_size": 4096.0}})
    assert args[0::2] == ["--set"] * (len(args) // 2)
    config = load_dataprep_config(None, args[1::2])
    assert config.steps.langid.languages == ["en", "de"] and config.tokenizer.vocab_size == 4096


def test_trainer_overrides_load_as_the_trainers_config():
    pairs = bodies.trainer_overrides(data="s3://lmforge/datasets/x", model_preset="124m", steps=50,
                                     parallel_mode="fsdp",
                                     train_config={"data": {"seq_len": 128.0}, "model": {"overrides": {"n_layer": 2}}})
    config = load_train_config(None, pairs)
    assert config.model.preset == "124m" and config.steps == 50 and config.parallel.mode == "fsdp"
    assert config.data.sources[0].path == "s3://lmforge/datasets/x" and config.data.seq_len == 128
    assert config.model.overrides == {"n_layer": 2}
    with pytest.raises(bodies.StepError, match="the launcher sets these"):
        bodies.trainer_overrides(data="d", model_preset="tiny", steps=1, parallel_mode="none",
                                train_config={"run_dir": "/x", "metrics": {"port": 1}})


def test_train_parameters_are_checked_before_anything_starts(tmp_path):
    common = {"run": "r", "data": "d", "model_preset": "tiny", "steps": 1, "train_config": {}, "launcher": "local",
              "checkpoint_store": str(tmp_path), "timeout_hours": 1.0}
    with pytest.raises(bodies.StepError, match="needs ddp, fsdp or hsdp"):
        bodies.train(**common, nodes=1, gpus_per_node=2, parallel_mode="none")
    with pytest.raises(bodies.StepError, match="nodes must be"):
        bodies.train(**common, nodes=0, gpus_per_node=1, parallel_mode="fsdp")
    with pytest.raises(ValueError, match="launcher 'slurm'"):
        bodies.train(**{**common, "launcher": "slurm"}, nodes=1, gpus_per_node=1, parallel_mode="none")
    assert not any(tmp_path.iterdir())


def test_run_name_and_workers():
    assert bodies.run_name("", "0f3c-11ee") == "run-0f3c-11ee"
    assert bodies.run_name("My Run_2", "x") == "my-run-2"
    assert bodies.plan_workers(3) == [0, 1, 2]
    with pytest.raises(bodies.StepError):
        bodies.plan_workers(0)


def test_stage_tasks_are_checked_before_the_cli_runs(tmp_path):
    out = str(tmp_path)
    assert bodies.plan_tasks("shards", {"shards": 3}, output=out) == [0, 1, 2]
    assert bodies.plan_tasks("combine", {}, output=out) == [0]  # a stage left out gets one task
    with pytest.raises(bodies.StepError, match=r"stage_tasks\['tokenize'\] must be a whole number ≥ 1, got 0"):
        bodies.plan_tasks("tokenize", {"tokenize": 0}, output=out)
    with pytest.raises(bodies.StepError, match="stage_tasks names no split stage: cluster"):
        bodies.plan_tasks("dedup", {"cluster": 2}, output=out)
    with pytest.raises(bodies.StepError, match="'tokenizer' is one task, not a split stage"):
        bodies.plan_tasks("tokenizer", {}, output=out)
    with pytest.raises(bodies.StepError, match=r"dedup task_index 2 is not in \[0, 2\)"):
        bodies.stage_task(stage="dedup", output=out, task_index=2, num_tasks=2)
    with pytest.raises(bodies.StepError, match="'finalize' is not a global data-prep stage"):
        bodies.stage_task(stage="finalize", output=out)
    assert not any(tmp_path.iterdir())


def test_fetch_sample_takes_the_placed_files_and_records_them(tmp_path):
    out = tmp_path / "data"
    with pytest.raises(bodies.StepError, match=r"reads 2 WET file\(s\) placed .* holds 0: .*lmforge-sample-data"):
        bodies.fetch_inputs(crawl="sample", shards=2, output=str(out))
    placed = write_sample_inputs(out / "wet", 3, 20)
    (out / "wet" / "notes.txt").write_text("not a WET file")
    uris = bodies.fetch_inputs(crawl="sample", shards=2, output=str(out))
    assert uris == [uri for uri, _ in placed[:2]]  # the first two in name order
    assert uris == [str(out / "wet" / f"sample-{i:05d}.warc.wet.gz") for i in range(2)]
    assert json.loads((out / "wet" / "inputs.json").read_text()) == uris == bodies.read_inputs(str(out))
    assert bodies.fetch_inputs(crawl="sample", shards=2, output=str(out)) == uris, "a retry takes the same files"
    with pytest.raises(bodies.StepError, match="holds 3"):
        bodies.fetch_inputs(crawl="sample", shards=4, output=str(out))
    with pytest.raises(bodies.StepError, match="inputs.json not found"):
        bodies.read_inputs(str(tmp_path / "elsewhere"))


def test_fetch_sample_from_the_object_store(s3):
    _, make_bucket = s3
    client = make_bucket("pipelines-fetch")
    output = "s3://pipelines-fetch/datasets/x"
    placed = write_sample_inputs(f"{output}/wet", 2, 20)  # what `lmforge-sample-data --files 2` uploads
    uris = bodies.fetch_inputs(crawl="sample", shards=2, output=output)
    assert uris == [uri for uri, _ in placed] == [f"{output}/wet/sample-{i:05d}.warc.wet.gz" for i in range(2)]
    assert bodies.read_inputs(output) == uris
    listed = {o["Key"] for o in client.list_objects_v2(Bucket="pipelines-fetch")["Contents"]}
    assert listed == {"datasets/x/wet/inputs.json", *(u.removeprefix("s3://pipelines-fetch/") for u in uris)}


def test_fetch_inputs_downloads_a_crawls_warc_files(tmp_path, monkeypatch):
    """The pipeline's fetch step with input_kind "warc": the crawl's warc.paths.gz, then its first
    WARC files, recorded as the workers' inputs (`lmforge-dataprep fetch --kind warc` underneath)."""
    import gzip
    from pathlib import Path

    from tests.dataprep.test_fetch import CRAWL, serving
    from tests.dataprep.wet_records import gz_member, wet_record

    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    paths = [f"crawl-data/{CRAWL}/segments/1/warc/CC-MAIN-0000{i}.warc.gz" for i in range(3)]
    files = {f"crawl-data/{CRAWL}/warc.paths.gz": gzip.compress("".join(p + "\n" for p in paths).encode())}
    for i, rel in enumerate(paths):
        files[rel] = gz_member(wet_record(f"https://w.example/{i}", b"HTTP/1.1 200 OK\r\n\r\n<p>hi</p>",
                                          rec_type="response"))
    with serving(files) as server:
        uris = bodies.fetch_inputs(crawl=CRAWL, shards=2, output=str(tmp_path), base_url=server.base_url, kind="warc")
    assert [Path(uri).name for uri in uris] == ["CC-MAIN-00000.warc.gz", "CC-MAIN-00001.warc.gz"]
    assert [Path(uri).read_bytes() for uri in uris] == [files[rel] for rel in paths[:2]]
    assert bodies.read_inputs(str(tmp_path)) == uris
