"""The capacity planner (`lmforge-train plan`): the seed's 70B arithmetic, parameter and FLOP
counts equal to the model's, state bytes equal to what the trainer allocates, Korthikanti's
activation formula, the 70B recommendation on 1,024 H100s, layouts that do not fit, and the
CLI's JSON, chart values and errors."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import yaml

from lmforge.model.config import PRESETS, GPTConfig
from lmforge.model.transformer import flops_per_token, parameter_counts
from lmforge.trainer.planner.comm import communication
from lmforge.trainer.planner.costs import gpu_seconds, training_flops, wall_clock_days
from lmforge.trainer.planner.hardware import GPUS, Cluster, gpu_named
from lmforge.trainer.planner.layout import AXES, Layout
from lmforge.trainer.planner.memory import StateConfig, layer_activation_bytes, memory_per_gpu
from lmforge.trainer.planner.search import PlanRequest, evaluate, search
from lmforge.trainer.planner.shape import ModelShape
from tests.conftest import REPO_ROOT
from tests.trainer.helpers import random_output, read_metrics


def cluster(nodes: int, gpus_per_node: int = 8, gpu: str = "H100") -> Cluster:
    spec = gpu_named(gpu)
    return Cluster(spec, nodes, gpus_per_node, spec.nvlink_bytes_per_s, spec.network_bits_per_s / 8)


def shape_of(preset: str, **overrides) -> ModelShape:
    return ModelShape.from_config(GPTConfig.preset(preset, **overrides))


def plan_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lmforge.trainer.cli", "plan", *args], capture_output=True, text=True, timeout=120
    )


LLAMA_70B_ON_1024_H100 = [
    "--model",
    "llama-70b",
    "--tokens",
    "1.5e12",
    "--seq-len",
    "8192",
    "--global-batch-tokens",
    "16777216",
    "--gpu",
    "H100",
    "--nodes",
    "128",
    "--gpus-per-node",
    "8",
]


# --- the seed's 70B arithmetic ------------------------------------------------------------------


def test_the_seeds_70b_arithmetic_corrected():
    flops = training_flops(70e9, 1.5e12)
    assert flops == pytest.approx(6.3e23)
    seconds = gpu_seconds(flops, 400e12, 0.45)
    assert seconds == pytest.approx(3.5e9)  # GPU-seconds: the seed's "3.5M" was a slip
    assert wall_clock_days(seconds, 1024) == pytest.approx(40, abs=0.5)

    llama = shape_of("llama-70b")
    assert 2 * llama.params == pytest.approx(140e9, rel=0.01)  # bf16 weights
    assert training_flops(llama.six_n_flops_per_token() / 6, 1.5e12) == pytest.approx(6.3e23, rel=0.01)


def test_the_plan_reproduces_the_seeds_figures_at_its_assumptions():
    """At the seed's 400 TFLOP/s × 0.45 and 6·N·D, the planner's run totals are the seed's."""
    result = plan_cli(
        *LLAMA_70B_ON_1024_H100, "--peak-tflops", "400", "--mfu", "0.45", "--flops-convention", "6N", "--format", "json"
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["model"]["weights_bf16_bytes"] == pytest.approx(140e9, rel=0.01)
    assert plan["flops"]["six_n_d"] == pytest.approx(6.3e23, rel=0.01)
    run = plan["recommended"]["run"]
    assert run["gpu_seconds"] == pytest.approx(3.5e9, rel=0.01)
    assert run["wall_clock_days"] == pytest.approx(40, abs=1)


# --- the model as the planner counts it ---------------------------------------------------------

VARIANTS = [{}, {"bias": True, "qk_norm": True}, {"tie_embeddings": False}]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_parameters_and_flops_equal_the_models(preset):
    for overrides in VARIANTS:
        config = GPTConfig.preset(preset, **overrides)
        shape = ModelShape.from_config(config)
        assert (shape.params, shape.active_params) == parameter_counts(config), overrides
        assert shape.flops_per_token(512) == pytest.approx(flops_per_token(config, 512), rel=1e-12)


def test_counts_cover_shared_experts_and_learned_positions():
    for config in (
        GPTConfig.preset("moe-debug", moe={"num_experts": 4, "top_k": 1, "shared_expert": True}),
        GPTConfig.preset("tiny", positions="learned", dropout=0.1, tie_embeddings=False),
    ):
        shape = ModelShape.from_config(config)
        assert (shape.params, shape.active_params) == parameter_counts(config)


# --- state bytes against the trainer ------------------------------------------------------------


def _trainer_memory_record(tmp_path: Path, preset: str) -> tuple[dict, GPTConfig]:
    """One CPU step of the real trainer (one process, no wrapper): its `memory` record, the
    figure bench/train_memory.py reports."""
    from lmforge.trainer.config import TrainConfig
    from lmforge.trainer.train import train

    data = random_output(tmp_path / "data", vocab_size=8192, train_tokens=20_000)
    config = TrainConfig.model_validate(
        {
            "data": {"sources": [{"path": str(data)}], "seq_len": 32, "batch_size": 2},
            "model": {"preset": preset, "overrides": {"context_length": 32}},
            "steps": 1,
            "device": "cpu",
            "run_dir": str(tmp_path / "run"),
            "checkpoint": {"async_save": False},
        }
    )
    train(config)
    return read_metrics(tmp_path / "run", "memory")[0], config.model.build(vocab_size=8192)


@pytest.mark.parametrize("preset", ["tiny", "llama-debug", "moe-debug"])
def test_state_bytes_equal_what_the_trainer_allocates(tmp_path, preset):
    measured, model = _trainer_memory_record(tmp_path, preset)
    layout = Layout(1, 1, 1, 1, 1, 1, micro_batch=2, microbatches=1, activation_checkpointing=False)
    predicted = memory_per_gpu(ModelShape.from_config(model), layout, 32, StateConfig())
    for part in ("params", "grads", "optimizer"):
        assert getattr(predicted, part) == pytest.approx(measured[part], rel=0.05), (part, measured)


def _bench_train_memory():
    spec = importlib.util.spec_from_file_location("bench_train_memory", REPO_ROOT / "bench" / "train_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_fsdp_shards_match_the_memory_benchmark_on_two_ranks(tmp_path):
    """bench/train_memory.py's own run (torchrun, FSDP2, 2 CPU ranks) against dp_shard=2."""
    bench = _bench_train_memory()
    data = random_output(tmp_path / "data", vocab_size=8192, train_tokens=40_000)
    args = Namespace(preset="llama-debug", device="cpu", seq_len=32, batch=2)
    measured = bench.run("fsdp", 2, data, tmp_path / "run", args)
    model = GPTConfig.preset("llama-debug", context_length=32)
    layout = Layout(1, 2, 1, 1, 1, 1, micro_batch=2, microbatches=1, activation_checkpointing=False)
    predicted = memory_per_gpu(ModelShape.from_config(model), layout, 32, StateConfig())
    for part in ("params", "grads", "optimizer"):
        assert getattr(predicted, part) == pytest.approx(measured[part], rel=0.05), (part, measured)


# --- activations: Korthikanti et al. 2022 -------------------------------------------------------


def test_activations_follow_korthikanti_for_a_gpt_layer():
    """sbh(34 + 5as/h) per layer without flash attention (a GPT layer: GeLU 4h MLP, dropout, full
    multi-head attention), divided by t with tensor and sequence parallelism."""
    shape = shape_of("1.3b", dropout=0.1)
    s, b, h, a = 1024, 4, shape.dim, shape.heads
    for tp in (1, 2, 4, 8):
        layout = Layout(1, 1, tp, 1, 1, 1, micro_batch=b, microbatches=1, activation_checkpointing=False)
        expected = s * b * h * (34 + 5 * a * s / h) / tp
        assert layer_activation_bytes(shape, layout, s, flash_attention=False) == pytest.approx(expected)


def test_gqa_swiglu_and_checkpointing_change_activations_as_documented():
    llama = shape_of("llama-8b")
    s, h, f = 8192, llama.dim, llama.ffn_hidden
    layout = Layout(1, 1, 1, 1, 1, 1, micro_batch=1, microbatches=1, activation_checkpointing=True)
    g = llama.kv_heads / llama.heads
    per_token = 4 * h + 6 * h + 4 * h * g + 4 * llama.heads + 2 * h + 8 * f  # no dropout, flash attention
    assert layer_activation_bytes(llama, layout, s) == pytest.approx(s * per_token)
    memory = memory_per_gpu(llama, layout, s, StateConfig())
    assert memory.activations_with_ac == pytest.approx(llama.layers * 2 * s * h + s * per_token)
    assert memory.activations == memory.activations_with_ac < memory.activations_without_ac


# --- layouts -------------------------------------------------------------------------------------


def test_llama_70b_on_1024_h100_uses_tensor_parallelism_inside_a_node_and_fits():
    request = PlanRequest(shape_of("llama-70b"), cluster(128), seq_len=8192, global_batch=2048, tokens=1.5e12)
    candidates, evaluated = search(request)
    best = candidates[0]
    assert evaluated > 100 and best.fits
    assert best.layout.gpus == 1024 and best.layout.tp in (2, 4, 8)
    assert best.comm["tp"].inside_node
    assert best.memory.total <= 80e9 * 0.9
    assert all(c.time.step_seconds >= best.time.step_seconds for c in candidates if c.fits)
    assert 0.3 < best.time.mfu < 0.7


@pytest.mark.parametrize("preset", ["llama-1b", "moe-8x1b"])
def test_layouts_the_trainer_refuses_are_not_searched(preset):
    """A pipeline needs untied embeddings and a dense model; context parallelism a dense model."""
    shape = shape_of(preset)
    request = PlanRequest(shape, cluster(4), seq_len=4096, global_batch=256, tokens=1e11)
    candidates, _ = search(request)
    assert candidates and all(c.layout.pp == 1 for c in candidates)
    assert all(c.layout.cp == 1 for c in candidates) == shape.is_moe
    untied, _ = search(PlanRequest(shape_of("llama-1b", tie_embeddings=False), cluster(4), seq_len=4096,
                                   global_batch=256, tokens=1e11))
    assert any(c.layout.pp > 1 for c in untied)


def test_70b_on_eight_gpus_without_sharding_does_not_fit():
    shape = shape_of("llama-70b")
    request = PlanRequest(shape, cluster(1), seq_len=8192, global_batch=64, tokens=1e12)
    ddp = evaluate(request, Layout(8, 1, 1, 1, 1, 1, micro_batch=1, microbatches=8, activation_checkpointing=True))
    assert not ddp.fits
    assert ddp.memory.params + ddp.memory.grads + ddp.memory.optimizer == pytest.approx(16 * shape.params)
    candidates, _ = search(request)  # even fully sharded, 16 bytes × 70.6e9 / 8 GPUs is 141 GB
    assert not any(c.fits for c in candidates)


def test_fsdp_traffic_is_two_gathers_and_a_reduce_scatter_per_micro_batch():
    shape = shape_of("llama-1b")
    layout = Layout(1, 8, 1, 1, 1, 1, micro_batch=2, microbatches=4, activation_checkpointing=False)
    comm = communication(shape, layout, 2048, StateConfig(), cluster(1), "bf16")
    assert set(comm) == {"fsdp"} and comm["fsdp"].inside_node
    assert comm["fsdp"].bytes == pytest.approx(4 * (2 * 2 + 4) * shape.params * 7 / 8)


def test_pipeline_bubble_is_p_minus_one_over_m():
    layout = Layout(1, 32, 4, 4, 1, 1, micro_batch=1, microbatches=64, activation_checkpointing=False)
    assert layout.pipeline_bubble == pytest.approx(3 / 64)


def test_an_moe_plan_uses_expert_parallelism_axes():
    request = PlanRequest(shape_of("moe-8x1b"), cluster(2), seq_len=4096, global_batch=256, tokens=1e11)
    candidates, _ = search(request)
    with_ep = [c for c in candidates if c.layout.ep > 1]
    assert with_ep and all("ep" in c.comm and c.comm["ep"].collective == "all-to-all" for c in with_ep)
    assert candidates[0].fits


def test_fp8_on_a_gpu_without_it_is_refused():
    from lmforge.common.errors import ConfigError

    with pytest.raises(ConfigError, match="A100 has no FP8"):
        PlanRequest(shape_of("llama-1b"), cluster(1, gpu="A100"), 2048, 64, 1e10, precision="fp8")
    assert {"H100", "H200", "B200", "A100"} <= set(GPUS)  # the four, and the PCIe cards MFU knows


# --- the command ---------------------------------------------------------------------------------


def test_json_output_parses_and_the_values_map_onto_the_parallel_axes():
    args = "--model llama-1b --seq-len 4096 --nodes 2 --tokens 1e11 --usd-per-gpu-hour 2 --format json"
    result = plan_cli(*args.split())
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    best = plan["recommended"]
    assert best["fits"] and plan["fitting_count"] >= 1
    assert plan["candidates"][0] == {key: value for key, value in best.items() if key != "run"}
    assert best["run"]["cost_usd"] == pytest.approx(best["run"]["gpu_hours"] * 2)
    values = plan["chart_values"]["training"]
    parallel = values["config"]["parallel"]
    assert set(AXES) <= set(parallel) and values["nodes"] * values["nprocPerNode"] == 16
    assert math.prod(parallel[axis] for axis in ("dp_replicate", "dp_shard", "tp", "pp", "cp")) == 16
    micro = parallel.get("pp_microbatches", values["config"].get("grad_accum", 1))
    dp = parallel["dp_replicate"] * parallel["dp_shard"]
    assert dp * values["config"]["data"]["batch_size"] * micro == plan["workload"]["global_batch_sequences"]


def test_values_output_is_the_charts_training_section():
    result = plan_cli(*LLAMA_70B_ON_1024_H100, "--format", "values")
    assert result.returncode == 0, result.stderr
    values = yaml.safe_load(result.stdout)
    training = values["training"]
    assert training["enabled"] and training["gpusPerProcess"] == 1
    assert training["config"]["model"]["preset"] == "llama-70b"
    parallel = training["config"]["parallel"]
    assert 1 < parallel["tp"] <= 8 and math.prod(parallel[a] for a in AXES if a != "ep") == 1024
    chart = yaml.safe_load((REPO_ROOT / "helm" / "lmforge" / "values.yaml").read_text())["training"]
    assert set(training) - {"enabled"} <= set(chart)  # only keys the chart's training section has


def test_the_table_shows_memory_communication_and_the_recommendation():
    result = plan_cli(*LLAMA_70B_ON_1024_H100, "--usd-per-gpu-hour", "2.5")
    assert result.returncode == 0, result.stderr
    for text in (
        "recommended",
        "memory per GPU",
        "communication per step",
        "tp ",
        "pipeline bubble",
        "MFU",
        "days",
        "GPU-hours",
        "$",
        "parallel:",
    ):
        assert text in result.stdout, text


def test_a_plan_where_nothing_fits_says_so_and_exits_1():
    result = plan_cli("--model", "llama-70b", "--nodes", "1", "--dp-shard", "1", "--tp", "1", "--format", "json")
    assert result.returncode == 1
    plan = json.loads(result.stdout)
    assert plan["recommended"] is None and plan["fitting_count"] == 0
    assert not plan["candidates"][0]["fits"] and plan["smallest_memory"]["memory_bytes"]["total"] > 80e9
    assert "no layout fits" in result.stderr


def test_an_unknown_gpu_type_exits_2_with_one_line():
    result = plan_cli("--model", "tiny", "--gpu", "V100")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "unknown GPU type 'V100'" in result.stderr and "H100" in result.stderr


def test_a_bad_shape_exits_2_naming_the_field():
    result = plan_cli("--model", "tiny", "--shape", "n_head=3")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "n_embd" in result.stderr
