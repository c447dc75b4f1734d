"""A recipe of four stages trained for real (torchrun, gloo, CPU, fp32): a batch ramp, a longer
sequence with a new RoPE base and document masking, then an anneal on one source while WSD decays.
FSDP, TP, PP and CP runs of it log the one-process run's losses step by step; a run killed at a
stage boundary, or before one and resumed across it, on the same or another world size, logs the
uninterrupted run's losses; the stages, the LR over tokens and the per-source val losses are
recorded."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lmforge.sample_data.token_shards import synthetic_output
from tests.trainer.helpers import losses_by_step, read_metrics

STEPS = 12
# 16-token sequences, 2 a rank a micro-batch: 8 sequences a step, 16 from step 4, 32-token sequences
# (1 a rank a micro-batch) from step 7, the anneal on `code` alone from step 10.
SCHEDULE = ("schedule=[{global_batch_tokens: 128}, {start_tokens: 512, global_batch_tokens: 256}, "
            "{start_tokens: 1280, seq_len: 32, rope_theta: 1000000}, "
            "{start_tokens: 2048, mixture: {code: 1}, name: anneal}]")
BOUNDARIES = (4, 7, 10)
MODEL = ("model.overrides={n_layer: 2, n_head: 4, n_kv_head: 2, n_embd: 64, context_length: 32, "
         "vocab_size: 256, tie_embeddings: false}")
TOLERANCE = 2e-5


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("schedule-data")
    return (synthetic_output(root / "web", train_tokens=30_000, seed=0, document_tokens=12),
            synthetic_output(root / "code", train_tokens=20_000, seed=1, document_tokens=20))


def train(run_dir: Path, data, nproc: int = 1, *extra: str, kill_at: int | None = None) -> subprocess.CompletedProcess:
    web, code = data
    overrides = [f"data.sources=[{{path: {web}, weight: 3}}, {{path: {code}, weight: 1}}]", "data.seq_len=16",
                 "data.batch_size=2", "model.preset=llama-debug", MODEL, SCHEDULE, f"steps={STEPS}",
                 "optim.warmup_steps=2", "optim.lr=0.003", "optim.schedule=wsd", "optim.decay_fraction=0.25",
                 "eval_every=6", "eval_batches=1", "data.prefetch=2", f"run_dir={run_dir}", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("LMFORGE_TRAINER_KILL_AT_STEP", None)
    if kill_at is not None:
        env["LMFORGE_TRAINER_KILL_AT_STEP"] = str(kill_at)
    launcher = [] if nproc == 1 else ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return subprocess.run([sys.executable, *launcher, "-m", "lmforge.trainer", *overrides], capture_output=True,
                          text=True, env=env, timeout=300)


def trained(run_dir: Path, data, nproc: int = 1, *extra: str) -> dict[int, float]:
    result = train(run_dir, data, nproc, *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    return losses_by_step(run_dir)


def assert_matches(reference: dict[int, float], losses: dict[int, float], tolerance: float = TOLERANCE) -> None:
    assert sorted(losses) == list(range(STEPS))
    assert max(abs(reference[s] - losses[s]) for s in range(STEPS)) <= tolerance, \
        [(s, reference[s], losses[s]) for s in range(STEPS)]


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> tuple[Path, dict[int, float]]:
    run_dir = tmp_path_factory.mktemp("schedule-runs") / "one-process"
    return run_dir, trained(run_dir, data)


def test_the_stages_steps_and_evaluations_are_recorded(reference):
    run_dir, _ = reference
    stages = read_metrics(run_dir, "stage")
    assert [(s["step"], s["name"]) for s in stages] == [(0, "stage-0"), (4, "stage-1"), (7, "stage-2"),
                                                         (10, "anneal")]
    assert [s["micro_batches"] for s in stages] == [4, 8, 8, 8]
    assert [s["document_masking"] for s in stages] == [False, False, True, True]
    assert stages[-1]["mixture"] == {"web": 0.0, "code": 1.0} and stages[2]["rope_theta"] == 1e6
    steps = read_metrics(run_dir)
    assert [s["seq_len"] for s in steps] == [16] * 7 + [32] * 5
    assert [s["tokens"] for s in steps] == [128 * (s + 1) for s in range(4)] + [512 + 256 * (s - 3)
                                                                              for s in range(4, 12)]
    lrs = [s["lr"] for s in steps]
    assert lrs[2:10] == [0.003] * 8 and lrs[10] < 0.003 and lrs[-1] == pytest.approx(0.0003)  # the last 25% decay
    evals = read_metrics(run_dir, "eval")
    assert [e["seq_len"] for e in evals] == [16, 32]
    assert set(evals[-1]["val_loss_by_source"]) == {"web", "code"}
    assert evals[0]["val_loss_by_source"]["web"] != evals[0]["val_loss_by_source"]["code"]
    config = json.loads((run_dir / "checkpoints" / "step-00000011" / "meta.json").read_text())
    assert config["model_config"]["rope_theta"] == 1e6  # an export takes the last stage's RoPE


@pytest.mark.slow
@pytest.mark.parametrize(("name", "nproc", "extra"), [
    ("fsdp2", 2, ["parallel.dp_shard=2"]),
    ("tp2", 2, ["parallel.tp=2"]),
    ("pp2", 2, ["parallel.pp=2"]),
    ("cp2", 2, ["parallel.cp=2"]),
])
def test_every_layout_runs_the_schedule_as_one_process(reference, data, name, nproc, extra):
    run_dir, losses = reference
    assert_matches(losses, trained(run_dir.parent / name, data, nproc, *extra))


@pytest.mark.slow
@pytest.mark.parametrize(("name", "every", "attempts"), [
    # a checkpoint every step: each kill resumes exactly at the stage's first step
    ("at-boundaries", 1, [(1, 4), (1, 7), (1, 10), (1, None)]),
    # a checkpoint every 3 steps (2, 5, 8): each resume redoes steps before the boundary, then crosses it,
    # on another world size each time
    ("across-boundaries", 3, [(1, 4), (2, 7), (1, 10), (2, None)]),
])
def test_a_run_killed_at_or_before_each_boundary_resumes_with_the_same_losses(reference, data, name, every,
                                                                                attempts):
    _, losses = reference
    run_dir = reference[0].parent / name
    for nproc, kill_at in attempts:
        extra = [f"checkpoint.every={every}", "checkpoint.async_save=false",
                 *(["parallel.dp_shard=2"] if nproc == 2 else [])]
        result = train(run_dir, data, nproc, *extra, kill_at=kill_at)
        assert (result.returncode == 0) == (kill_at is None), result.stderr[-3000:]
    starts = [r["resumed_from"] for r in read_metrics(run_dir, "start")]
    expected = [None, *(b - 1 for b in BOUNDARIES)] if every == 1 else [None, 2, 5, 8]
    assert starts == expected
    assert_matches(losses, losses_by_step(run_dir))


@pytest.mark.slow
def test_a_stage_planned_for_another_layout_stops_the_run_before_it(data, tmp_path):
    """Stage 1's 6 sequences do not split over 2 ranks of 2: the 2-rank run checkpoints step 3 and exits 8;
    resumed on 1 rank it trains the rest as a 1-rank run of the whole schedule does."""
    schedule = "schedule=[{global_batch_tokens: 128}, {start_tokens: 512, global_batch_tokens: 96}]"
    first = train(tmp_path / "switch", data, 2, "parallel.dp_shard=2", schedule, "steps=8")
    # torchrun exits 1, naming each rank's code
    assert first.returncode != 0 and re.search(r"exitcode\s*: 8 ", first.stderr), first.stderr[-3000:]
    assert "stopped before step 4: schedule[1] (stage-1): a global batch of 6 sequences does not split" in first.stderr
    assert [r["step"] for r in read_metrics(tmp_path / "switch")] == [0, 1, 2, 3]
    resumed = train(tmp_path / "switch", data, 1, schedule, "steps=8")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert read_metrics(tmp_path / "switch", "start")[-1]["resumed_from"] == 3
    whole = trained(tmp_path / "whole", data, 1, schedule, "steps=8")
    switched = losses_by_step(tmp_path / "switch")
    assert max(abs(whole[s] - switched[s]) for s in range(8)) <= TOLERANCE, (whole, switched)
    refused = train(tmp_path / "refused", data, 2, "parallel.dp_shard=2",
                    "schedule=[{global_batch_tokens: 96}]", "steps=2")
    assert refused.returncode != 0 and "run the stage on its own layout" in refused.stderr
