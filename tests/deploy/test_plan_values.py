"""`lmforge-train plan --format values` writes values the chart takes as they are: Helm's SDK
validates them against values.schema.json, the chart (its defaults merged in, `parallel.mode: ddp`
among them) renders a trainer command, the trainer's own entry point loads that command's config,
and the trainer's layout check resolves the `parallel:` axes for nodes × nprocPerNode ranks."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from lmforge.trainer import __main__ as trainer_main
from lmforge.trainer.config import TrainConfig
from lmforge.trainer.mesh_layout import MESH_AXES, MeshLayout, resolve_layout, trainer_layout
from lmforge.trainer.train import refuse_unsplittable_model
from tests.deploy.chart_values import NAMESPACE, container
from tests.helm_chart import find, render

LLAMA_1B_ON_8_H100 = ["--model", "llama-1b", "--gpu", "H100", "--nodes", "1", "--gpus-per-node", "8"]
LLAMA_70B_ON_1024_H100 = [
    *("--model", "llama-70b", "--tokens", "1.5e12", "--seq-len", "8192", "--global-batch-tokens", "16777216"),
    *("--gpu", "H100", "--nodes", "128", "--gpus-per-node", "8"),
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No LMFORGE_TRAINER__* from the environment in the configs the trainer loads."""
    import os

    for key in list(os.environ):
        if key.startswith("LMFORGE_"):
            monkeypatch.delenv(key)


def plan_output(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "lmforge.trainer.cli", "plan", *args, "--format", "values"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def plan_values(*args: str) -> dict:
    return yaml.safe_load(plan_output(*args))


def plan_header(*args: str) -> str:
    return "".join(line for line in plan_output(*args).splitlines(keepends=True) if line.startswith("#"))


def chart_trainer_config(values: dict, monkeypatch) -> TrainConfig:
    """The config the trainer's entry point loads from the chart's command for these values."""
    (job,) = find(render(values, namespace=NAMESPACE), "PyTorchJob")
    args = container(job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"], "pytorch")["args"]
    captured = []
    monkeypatch.setattr(trainer_main, "train", captured.append)
    assert trainer_main.main(args[2:]) == 0
    (config,) = captured
    return config


@pytest.mark.parametrize(
    ("pin", "expected"),
    [
        ([], MeshLayout(dp_replicate=8, mode="ddp")),  # what the planner recommends for 1B on 8 GPUs
        (["--dp-shard", "8"], MeshLayout(dp_shard=8, mode="fsdp")),  # FSDP alone
    ],
)
def test_a_data_parallel_plan_is_values_the_chart_and_the_trainer_accept(chart, monkeypatch, pin, expected):
    values = plan_values(*LLAMA_1B_ON_8_H100, *pin)
    chart.validate_schema(values)
    training = values["training"]
    rendered = training["config"]
    config = chart_trainer_config(values, monkeypatch)
    assert config.model.preset == "llama-1b" and config.data.seq_len == rendered["data"]["seq_len"]
    assert config.data.batch_size == rendered["data"]["batch_size"]
    assert config.grad_accum == rendered.get("grad_accum", 1)
    assert config.parallel.model_dump(include={"mode", *MESH_AXES}) == {
        key: rendered["parallel"][key] for key in ("mode", *MESH_AXES)
    }
    world_size = training["nodes"] * training["nprocPerNode"]
    assert trainer_layout(config.parallel, world_size) == expected


def test_the_70b_plan_is_values_the_chart_accepts_and_the_trainer_starts(chart, monkeypatch):
    values = plan_values(*LLAMA_70B_ON_1024_H100)
    chart.validate_schema(values)
    training = values["training"]
    parallel = training["config"]["parallel"]
    assert parallel["tp"] > 1 and parallel["pp"] > 1 and parallel["pp_microbatches"] >= parallel["pp"]
    assert "persistentVolumeClaim" in plan_header(*LLAMA_70B_ON_1024_H100)  # the one key a multi-node run adds
    training["checkpoints"] = {"persistentVolumeClaim": "lmforge-checkpoints"}
    config = chart_trainer_config(values, monkeypatch)
    world_size = training["nodes"] * training["nprocPerNode"]
    layout = resolve_layout(config.parallel, world_size)  # the axes fit the world size as they are
    assert layout.axes() == {axis: parallel[axis] for axis in MESH_AXES} and layout.world_size == 1024
    assert trainer_layout(config.parallel, world_size) == layout
    # what the trainer checks before any process group (heads by tp, layers by pp, sequence by 2·cp) passes
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    refuse_unsplittable_model(config)
