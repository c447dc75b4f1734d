"""Context parallelism in the trainer (torchrun, gloo, CPU, fp32, llama-debug, seq_len 32 = 2·cp·8):
CP = 2, CP = 2 × TP = 2 and CP = 2 × FSDP = 2 log a 1-rank run's losses step by step (the cp ranks of
a data-parallel group read the same batch and each runs its load-balanced shard), and so does GPT-2's
shape (learned positions, tied head) under CP × TP; a CP checkpoint
resumes under FSDP alone; a sequence the cp ranks cannot split, and the MoE option, are refused
before any process group."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lmforge.common.errors import ConfigError
from lmforge.trainer.config import ParallelSection
from lmforge.trainer.layout_rules import MeshLayout, context_parallel_problems
from lmforge.trainer.mesh_layout import trainer_layout
from tests.trainer.helpers import random_output, read_metrics
from tests.trainer.test_parallel import STEPS, run_trainer
from tests.trainer.test_tensor_parallel import refused_at_start

# fp32 over 20 steps: the cp ranks' loss shares and gradient sums add in another order than one process.
TOLERANCE = 1e-5
# With tp, test_tensor_parallel's: its sharded matmuls and row-parallel all-reduce add in another order
# still, and Adam turns rounding-sized gradient differences into parameter-sized ones (steps up to ~1e-5).
TP_TOLERANCE = 5e-5


LEARNED = "model.overrides={n_layer: 2, n_head: 4, n_embd: 64, context_length: 32, positions: learned}"


def assert_matches(single: list[float], losses: list[float], tolerance: float = TOLERANCE) -> None:
    assert max(abs(a - b) for a, b in zip(single, losses, strict=True)) <= tolerance, list(zip(single, losses))


@pytest.mark.slow
@pytest.mark.parametrize(("name", "nproc", "batch_size", "extra", "tolerance"), [
    ("cp2", 2, 8, ["parallel.cp=2"], TOLERANCE),  # FSDP over the cp ranks: its reduce-scatter sums their gradients
    ("cp2-tp2", 4, 8, ["parallel.cp=2", "parallel.tp=2"], TP_TOLERANCE),  # tp-local heads attend the cp sequence
    # FSDP over dp_shard × cp, 2 micro-batches of 2 per data-parallel group: the same 8 sequences per step
    ("cp2-fsdp2-accum2", 4, 2, ["parallel.cp=2", "parallel.dp_shard=2", "grad_accum=2"], TOLERANCE),
])
def test_context_parallel_layouts_match_one_process(llama_reference, name, nproc, batch_size, extra, tolerance):
    """GQA (4 query heads, 2 key/value heads), RoPE at global positions, SwiGLU, RMSNorm, untied head."""
    tmp, data, single, model = llama_reference
    assert_matches(single, run_trainer(tmp, name, nproc, None, batch_size, data, *extra, model=model), tolerance)


@pytest.mark.slow
def test_learned_positions_and_a_tied_head_under_cp_and_tp_match_one_process(tmp_path):
    """The position embedding is looked up at the cp shard's global positions (B, T/cp) and split
    along the sequence over tp like the tokens; the tied head shares the embedding's vocabulary shards."""
    data = random_output(tmp_path / "data")
    single = run_trainer(tmp_path, "single", 1, "none", 8, data, LEARNED)
    losses = run_trainer(tmp_path, "cp2-tp2", 4, None, 8, data, LEARNED, "parallel.cp=2", "parallel.tp=2")
    model = json.loads((tmp_path / "cp2-tp2" / "config.json").read_text())["model"]
    assert model["preset"] == "tiny" and model["overrides"]["positions"] == "learned"  # tiny ties the head
    assert_matches(single, losses, TP_TOLERANCE)


@pytest.mark.slow
def test_a_cp_checkpoint_resumes_under_fsdp_alone(llama_reference):
    """Killed at step 12 under CP = 2 (checkpoint at step 9, sharded over dp_shard × cp), resumed on 2
    FSDP ranks without cp: the parameters are the model's own, and steps 10… are the uninterrupted run's."""
    tmp, data, single, model = llama_reference
    run_dir = tmp / "cp-to-fsdp"
    common = [f"data.sources=[{{path: {data}}}]", "data.shuffle=global", "data.seq_len=32", f"steps={STEPS}",
              "optim.warmup_steps=2", "optim.lr=0.003", "checkpoint.every=5", f"run_dir={run_dir}",
              "model.preset=llama-debug"]  # the reference's shuffle (test_parallel.run_trainer)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                "-m", "lmforge.trainer"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    killed = subprocess.run([*torchrun, *common, "data.batch_size=8", "parallel.cp=2"], capture_output=True,
                            text=True, timeout=300, env={**env, "LMFORGE_TRAINER_KILL_AT_STEP": "12"})
    assert killed.returncode != 0
    resumed = subprocess.run([*torchrun, *common, "data.batch_size=4", "parallel.dp_shard=2"], capture_output=True,
                             text=True, timeout=300, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [start["resumed_from"] for start in read_metrics(run_dir, "start")] == [None, 9]
    got = {r["step"]: r["loss"] for r in read_metrics(run_dir)}  # the resumed attempt's steps 10… are logged last
    assert_matches(single, [got[step] for step in range(STEPS)])


def test_a_sequence_the_cp_ranks_cannot_split_is_refused_at_start_with_exit_2(tmp_path):
    err = refused_at_start(tmp_path, 2, "parallel.cp=2", "data.seq_len=30", "model.preset=llama-debug")
    assert "parallel.cp=2: data.seq_len = 30 is not divisible by 2·cp = 4" in err


def test_the_moe_option_with_cp_is_refused_at_start_with_exit_2(tmp_path):
    err = refused_at_start(tmp_path, 2, "parallel.cp=2", "data.seq_len=32", "model.preset=moe-debug")
    assert "parallel.cp=2: context parallelism does not support the MoE option" in err


def test_each_cp_ranks_tokens_must_split_over_tp():
    assert context_parallel_problems(2, 4, 20, None) == [
        "parallel.cp=2 × tp=4: each cp rank's 10 tokens (data.seq_len / cp) are not divisible by tp = 4 "
        "(sequence parallelism splits them)"]
    assert context_parallel_problems(2, 4, 32, None) == []


def test_cp_runs_under_fsdp_over_dp_shard_and_cp_and_is_refused_under_ddp_or_no_wrapper():
    assert trainer_layout(ParallelSection(cp=2), 2) == MeshLayout(cp=2, mode="fsdp")
    assert trainer_layout(ParallelSection(cp=2, dp_replicate=2), 4) == MeshLayout(dp_replicate=2, cp=2, mode="hsdp")
    for mode in ("ddp", "none"):
        with pytest.raises(ConfigError, match=f"parallel.cp=2 with parallel.mode {mode} "):
            trainer_layout(ParallelSection(mode=mode, cp=2), 2)
