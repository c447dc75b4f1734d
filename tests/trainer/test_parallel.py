"""2-rank DDP and 2-rank FSDP2 (torchrun, gloo, CPU, fp32) match a 1-rank run with the
same global batch, step by step; for the GPT-2 shape and the Llama-style debug preset (the MoE
option: tests/trainer/test_moe_training.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.trainer.helpers import random_output, read_metrics

STEPS = 20
MODEL = ["model.overrides={n_layer: 2, n_head: 4, n_embd: 64, context_length: 32}"]
MODELS = {"gpt": MODEL, "llama-debug": ["model.preset=llama-debug"]}


def run_trainer(tmp_path, name: str, nproc: int, mode: str | None, batch_size: int, data, *extra: str,
                model: str = "gpt") -> list[float]:
    """`mode` None: the `parallel:` mesh axes in `extra` alone choose the wrapper."""
    run_dir = tmp_path / name
    # data.shuffle=global: these runs compare the layouts' numerics step by step, with tolerances
    # calibrated on the uniform shuffle's batches. Under the block shuffle the batches are the same
    # on every layout too (tests/trainer/test_sampling.py; the first steps' losses are equal), but
    # the layouts' rounding differences grew to ~1e-3 by step 20 on this data, past the tolerances.
    overrides = [f"data.sources=[{{path: {data}}}]", "data.shuffle=global", "data.seq_len=32",
                 f"data.batch_size={batch_size}",
                 *([f"parallel.mode={mode}"] if mode else []), f"steps={STEPS}", "optim.warmup_steps=2",
                 "optim.lr=0.003", f"run_dir={run_dir}", *MODELS[model], *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if nproc == 1:
        command = [sys.executable, "-m", "lmforge.trainer", *overrides]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                   "-m", "lmforge.trainer", *overrides]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == list(range(STEPS))
    return [r["loss"] for r in records]


class Reference(NamedTuple):
    tmp: Path
    data: Path
    losses: list[float]  # the 1-rank run's
    model: str


def single_rank_reference(tmp_path_factory, model: str) -> Reference:
    tmp = tmp_path_factory.mktemp(f"parallel-{model}")
    data = random_output(tmp / "data")
    return Reference(tmp, data, run_trainer(tmp, "single", 1, "none", 8, data, model=model), model)


# The references (conftest.py: gpt_reference, llama_reference) are shared with test_tensor_parallel and
# test_context_parallel_training, which compare against the same runs.


@pytest.mark.parametrize("fixture", ["gpt_reference", "llama_reference"])
def test_single_process_learns(request, fixture):
    losses = request.getfixturevalue(fixture).losses
    assert losses[-1] < losses[0] - 1.0


@pytest.mark.slow
@pytest.mark.parametrize(("name", "mode", "extra"), [
    ("ddp", "ddp", []),
    ("fsdp", "fsdp", []),
    ("shard-grad-op", "fsdp", ["parallel.reshard_after_forward=false"]),
    ("hsdp", "hsdp", ["parallel.replicate_degree=2"]),  # 2 replicas x 1 shard: the 2-D mesh path
    ("mesh-axes", None, ["parallel.dp_shard=-1"]),  # no mode: FSDP over every rank, from the axis
])
def test_two_ranks_match_one(gpt_reference, name, mode, extra):
    tmp, data, single, _ = gpt_reference
    losses = run_trainer(tmp, name, 2, mode, 4, data, *extra)
    assert max(abs(a - b) for a, b in zip(single, losses)) < 1e-4, list(zip(single, losses))


@pytest.mark.slow
def test_llama_debug_on_two_fsdp_ranks_matches_one(llama_reference):
    tmp, data, single, model = llama_reference
    losses = run_trainer(tmp, "fsdp", 2, "fsdp", 4, data, model=model)
    assert max(abs(a - b) for a, b in zip(single, losses)) < 1e-4, list(zip(single, losses))


@pytest.mark.parametrize(("name", "batch_size", "extra"), [
    ("grad-accum", 4, ["grad_accum=2"]),  # 2 micro-batches of 4 = the same 8 sequences per step
    ("activation-checkpointing", 8, ["parallel.activation_checkpointing=true"]),
])
def test_single_process_variants_match(gpt_reference, name, batch_size, extra):
    tmp, data, single, _ = gpt_reference
    losses = run_trainer(tmp, name, 1, "none", batch_size, data, *extra)
    assert max(abs(a - b) for a, b in zip(single, losses)) < 1e-5, list(zip(single, losses))


@pytest.mark.slow
def test_compiled_model_matches_eager(gpt_reference):
    tmp, data, single, _ = gpt_reference
    losses = run_trainer(tmp, "compiled", 1, "none", 8, data, "parallel.compile=true")
    assert max(abs(a - b) for a, b in zip(single, losses)) < 1e-4, list(zip(single, losses))


@pytest.mark.slow
def test_two_nodes_rendezvous_from_the_training_operator_environment(tmp_path):
    """Two torchrun agents ("pods") configured only by the PET_* variables that the Kubeflow
    Training Operator injects, as the PyTorchJob's Master and Worker run them."""
    from tests.ports import free_port

    data = random_output(tmp_path / "data")
    port = free_port()
    overrides = [f"data.sources=[{{path: {data}}}]", "data.seq_len=32", "data.batch_size=4", "parallel.mode=ddp",
                 "steps=3", f"run_dir={tmp_path / 'run'}", *MODEL]
    pods = []
    for node_rank in (0, 1):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "1",
               "PET_NODE_RANK": str(node_rank), "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)}
        command = [sys.executable, "-m", "torch.distributed.run", "-m", "lmforge.trainer", *overrides]
        pods.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outputs = [pod.communicate(timeout=180) for pod in pods]
    for pod, (_, stderr) in zip(pods, outputs, strict=True):
        assert pod.returncode == 0, stderr[-3000:]
    starts = [json.loads(line) for out, _ in outputs for line in out.splitlines() if '"train_start"' in line]
    assert [s["world_size"] for s in starts] == [2, 2]
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [0, 1, 2]
