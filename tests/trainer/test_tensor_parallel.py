"""Tensor + sequence parallelism on the trainer's DeviceMesh (torchrun, gloo, CPU, fp32): TP = 2,
TP = 2 × FSDP = 2 and HSDP 2 × 2 log a 1-rank run's losses step by step (same global batch, the
tp ranks of a data-parallel group reading the same one); a checkpoint saved under TP2 × DP2 resumes
under DP4 and the reverse, and exports; a tp that does not divide the heads is refused before any process group."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from lmforge.model.package import load_package
from lmforge.trainer.data import ShardSource
from lmforge.trainer.export import export
from lmforge.trainer.sampling import GlobalSampler
from tests.trainer.helpers import losses_by_step, read_metrics
from tests.trainer.helpers import run_trainer as run_trainer_process
from tests.trainer.test_parallel import STEPS, run_trainer

# fp32 over 20 steps. Looser than 1e-5 because the sharded matmuls and the row-parallel all-reduce
# add in another order than one process, and Adam's normalised update turns rounding-sized
# gradient differences into parameter-sized ones: steps differ by 0 to 7e-6 with single steps
# up to 2.5e-5 (at a loss of ~5, where one fp32 ulp is 4.8e-7), not a drift that grows.
TOLERANCE = 5e-5


def assert_matches(single: list[float], losses: list[float]) -> None:
    assert max(abs(a - b) for a, b in zip(single, losses, strict=True)) <= TOLERANCE, list(zip(single, losses))


@pytest.mark.slow
@pytest.mark.parametrize(("name", "nproc", "batch_size", "extra"), [
    ("tp2", 2, 8, ["parallel.tp=2"]),  # one data-parallel group: both ranks read the 8 sequences
    ("tp2-fsdp2", 4, 4, ["parallel.dp_shard=2", "parallel.tp=2"]),  # FSDP2 over the tp DTensors (2-D)
    ("hsdp-2x2", 4, 2, ["parallel.dp_replicate=2", "parallel.dp_shard=2"]),
])
def test_llama_debug_layouts_match_one_process(llama_reference, name, nproc, batch_size, extra):
    """GQA (4 query heads, 2 key/value heads: one kv head per tp rank), SwiGLU, RMSNorm, untied head."""
    tmp, data, single, model = llama_reference
    assert_matches(single, run_trainer(tmp, name, nproc, None, batch_size, data, *extra, model=model))
    for rank in read_metrics(tmp / name, "memory")[0]["ranks"]:  # every gradient as sharded as its parameter
        assert rank["grads"] == rank["params"], rank


@pytest.mark.slow
def test_tied_head_and_learned_positions_under_tp_match_one_process(gpt_reference):
    """GPT-2's shape: the tied head shares the embedding's vocabulary shards; positions follow the sequence shard."""
    tmp, data, single, model = gpt_reference
    assert_matches(single, run_trainer(tmp, "tp2", 2, None, 8, data, "parallel.tp=2", model=model))


@pytest.mark.slow
@pytest.mark.parametrize(("name", "saved", "resumed"), [
    ("tp2xdp2-to-dp4", ("parallel.tp=2", "parallel.dp_shard=2"), ("parallel.dp_shard=4",)),
    ("dp4-to-tp2xdp2", ("parallel.dp_shard=4",), ("parallel.tp=2", "parallel.dp_shard=2")),
])
def test_a_checkpoint_resumes_under_another_layout_and_exports(llama_reference, name, saved, resumed):
    """Killed at step 12 on 4 ranks under one layout (checkpoint at step 9), resumed on 4 ranks under
    another: DCP reshards the DTensors, and steps 10… are the uninterrupted one-process run's; export
    consolidates the checkpoint saved under the first layout."""
    tmp, data, single, model = llama_reference
    run_dir = tmp / name
    common = [f"data.sources=[{{path: {data}}}]", "data.shuffle=global", "data.seq_len=32", f"steps={STEPS}",
              "optim.warmup_steps=2",
              "optim.lr=0.003", "checkpoint.every=5", f"run_dir={run_dir}", "model.preset=llama-debug"]

    def batch(layout: tuple[str, ...]) -> str:  # the same 8-sequence global batch: 8 / data-parallel ranks
        return f"data.batch_size={4 if 'parallel.tp=2' in layout else 2}"

    killed = run_trainer_process([*common, batch(saved), *saved], nproc=4, kill_at=12)
    assert killed.returncode != 0
    finished = run_trainer_process([*common, batch(resumed), *resumed], nproc=4)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert [start["resumed_from"] for start in read_metrics(run_dir, "start")] == [None, 9]
    got = losses_by_step(run_dir)  # the resumed attempt's steps 10… are logged last
    assert_matches(single[10:], [got[step] for step in range(10, STEPS)])

    # export consolidates the step 9 saved under the first layout: the package's loss on step 10's batch
    package = export(run_dir / "checkpoints" / "step-00000009", tmp / f"{name}-package")
    model, _ = load_package(package)
    sampler = GlobalSampler([ShardSource(data, "train", 32, name="data")], [1.0], seed=1234)  # as the runs
    tokens = torch.from_numpy(sampler.batch(10, 0, 1, 8)[0])
    with torch.no_grad():
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
    assert abs(loss.item() - got[10]) <= TOLERANCE


def refused_at_start(tmp_path, world_size: int, *overrides: str) -> str:
    """The trainer's stderr, started as one of `world_size` ranks with nothing to connect to: a refusal
    must come before any process group (else it would wait for its peers) and any run directory."""
    env = {**os.environ, "WORLD_SIZE": str(world_size), "RANK": "0"}
    command = [sys.executable, "-m", "lmforge.trainer", f"data.sources=[{{path: {tmp_path}}}]",
               f"run_dir={tmp_path / 'run'}", *overrides]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    assert not (tmp_path / "run").exists()
    assert result.stderr.strip().count("\n") == 0, result.stderr
    return result.stderr


def test_a_tp_that_does_not_divide_the_heads_is_refused_at_start_with_exit_2(tmp_path):
    err = refused_at_start(tmp_path, 2, "parallel.tp=2", "model.overrides={n_layer: 1, n_head: 3, n_embd: 48}")
    assert "parallel.tp=2 must divide model.n_head = 3 (each rank holds whole query heads)" in err


def test_tp_with_ddp_alone_is_refused_naming_the_axis(tmp_path):
    err = refused_at_start(tmp_path, 4, "parallel.tp=2", "parallel.dp_replicate=2")
    assert "parallel.tp=2 with DDP (dp_replicate=2, world size 4)" in err
