"""The planner offers only layouts the trainer runs (lmforge.trainer.layout_rules, asked by both).

A property over every model preset × a sample of clusters (1–512 nodes × 1–8 GPUs), sequence
lengths, precisions and pinned axes: each candidate `plan` emits, rendered as the chart's values and
loaded as the trainer's config, passes the trainer's own start checks (with the model's vocabulary,
as when it is built), and the trainer reads back the very layout the planner evaluated. A pinned
axis the trainer refuses is refused by `plan` with the trainer's own message."""

from __future__ import annotations

import argparse
import random
import subprocess
import sys

import pytest

from lmforge.common.errors import ConfigError
from lmforge.model.config import PRESETS
from lmforge.trainer.config import TrainConfig
from lmforge.trainer.layout_rules import ModelDims
from lmforge.trainer.mesh_layout import trainer_layout
from lmforge.trainer.planner.command import add_arguments
from lmforge.trainer.planner.render import chart_values
from lmforge.trainer.planner.request import build_request
from lmforge.trainer.planner.search import search
from lmforge.trainer.train import refuse_unrunnable_layout, refuse_unsplittable_model

NODES = (1, 2, 3, 4, 6, 8, 16, 32, 64, 128, 256, 512)
GPUS_PER_NODE = (1, 2, 3, 4, 6, 8)
SEQ_LENS = (None, 1000, 2048, 4096, 6144, 8192)  # None: the model's context length
PINS = ("tp", "pp", "cp", "ep", "dp_shard", "dp_replicate")
PLANS_PER_PRESET = 8


def plan_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def sampled_plans() -> list[list[str]]:
    """PLANS_PER_PRESET plans per preset over the grid (seeded): the smallest and the largest cluster
    always, the rest drawn, a third of them with a pinned axis, one in fp8; the global batch mostly a
    multiple of the GPUs (else few layouts divide it)."""
    draw = random.Random(32)
    plans = []
    for preset in sorted(PRESETS):
        clusters = [(1, 1), (512, 8)] + [(draw.choice(NODES), draw.choice(GPUS_PER_NODE))
                                         for _ in range(PLANS_PER_PRESET - 2)]
        for index, (nodes, per_node) in enumerate(clusters):
            batch = draw.choice((96, 512, nodes * per_node * draw.choice((1, 2, 4, 8, 16))))
            argv = ["--model", preset, "--nodes", str(nodes), "--gpus-per-node", str(per_node),
                    "--global-batch-sequences", str(batch)]
            seq_len = draw.choice(SEQ_LENS)
            if seq_len is not None:
                argv += ["--seq-len", str(seq_len)]
            if index % 3 == 2:
                argv += [f"--{draw.choice(PINS).replace('_', '-')}", str(draw.choice((1, 2, 3, 4, 8)))]
            if index == 3:
                argv += ["--precision", "fp8"]  # float8 training: the trainer runs it without tp
            plans.append(argv)
    return plans


def trainer_config(request, candidate, model: dict) -> tuple[TrainConfig, int]:
    """The candidate as the trainer loads it from the chart's values (an fp8 plan's turn float8 training on)."""
    training = chart_values(request, candidate, model, steps=1)["training"]
    config = dict(training["config"], data={**training["config"]["data"], "sources": [{"path": "unused"}]})
    assert ("float8" in config) == (request.precision == "fp8")
    return TrainConfig.model_validate(config), training["nodes"] * training["nprocPerNode"]


def test_every_candidate_the_planner_emits_passes_the_trainers_checks(monkeypatch):
    checked, refused_pins = 0, 0
    for argv in sampled_plans():
        request, model = build_request(plan_arguments(argv))
        try:
            candidates, _ = search(request)
        except ConfigError as refusal:  # nothing left: the pins (or the batch) rule every layout out
            assert request.pinned or str(refusal).startswith("no layout of"), (argv, str(refusal))
            refused_pins += 1
            continue
        for candidate in candidates:
            layout = candidate.layout
            assert all(getattr(layout, axis) == value for axis, value in request.pinned.items()), argv
            config, world_size = trainer_config(request, candidate, model)
            monkeypatch.setenv("WORLD_SIZE", str(world_size))
            refuse_unsplittable_model(config)  # the trainer's start check, before any process group
            resolved = trainer_layout(config.parallel, world_size, micro_batch=config.data.batch_size,
                                      grad_accum=config.grad_accum)
            assert resolved == layout, argv  # the trainer reads back the layout the planner evaluated
            # again once the model is built, with its vocabulary
            refuse_unrunnable_layout(resolved, ModelDims.of(config.model.build()), config, world_size)
            checked += 1
    assert checked > 1000 and refused_pins > 0  # the sample reaches both sides


def test_an_moe_plan_offers_no_tensor_parallelism():
    request, _ = build_request(plan_arguments(["--model", "moe-8x1b", "--nodes", "4", "--gpu", "H100"]))
    candidates, _ = search(request)
    assert candidates and all(c.layout.tp == 1 for c in candidates)
    assert any(c.layout.ep > 1 for c in candidates)


@pytest.mark.parametrize(("plan", "trainer"), [
    (["--model", "moe-8x1b", "--nodes", "4", "--tp", "2"], ["model.preset=moe-8x1b", "parallel.tp=2",
                                                           "parallel.dp_shard=-1"]),
    (["--model", "llama-1b", "--nodes", "1", "--tp", "2", "--dp-shard", "1", "--cp", "1"],
     ["model.preset=llama-1b", "parallel.tp=2", "parallel.dp_replicate=-1"]),
    (["--model", "llama-1b", "--nodes", "2", "--pp", "2"], ["model.preset=llama-1b", "parallel.pp=2",
                                                           "parallel.dp_shard=-1"]),
])
def test_a_pinned_axis_the_trainer_refuses_is_refused_with_the_trainers_message(plan, trainer, monkeypatch):
    """`lmforge-train plan` exits 2 with one line, the message the trainer itself gives for that axis."""
    result = subprocess.run([sys.executable, "-m", "lmforge.trainer.cli", "plan", *plan],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    request, _ = build_request(plan_arguments(plan))
    monkeypatch.setenv("WORLD_SIZE", str(request.cluster.gpus))
    config = TrainConfig.model_validate({"data": {"sources": [{"path": "unused"}]}, **_nested(trainer)})
    with pytest.raises(ConfigError) as refused:
        refuse_unsplittable_model(config)
    assert result.stderr.strip() == f"lmforge-train plan: error: {refused.value}"


def _nested(overrides: list[str]) -> dict:
    """{"model": {"preset": …}, "parallel": {…}} from `section.key=value` overrides."""
    nested: dict = {}
    for override in overrides:
        key, value = override.split("=", 1)
        section, field = key.split(".")
        nested.setdefault(section, {})[field] = int(value) if value.lstrip("-").isdigit() else value
    return nested
