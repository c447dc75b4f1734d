"""Checkpoints written by the real trainer (tiny model, 2 ranks, DCP) go through the store
and back byte-identical, and training resumed from the restored copy continues with the
same losses as a run that was never interrupted."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lmforge.common.checkpoint_layout import UPLOADED_MARKER, committed_steps, step_dir
from tests.trainer.helpers import random_output, read_metrics
from tests.uploader.helpers import files_of, in_process_uploader, run_uploader

STEPS = 16


def train(run_dir, data, kill_at=None) -> subprocess.CompletedProcess:
    overrides = [f"data.sources=[{{path: {data}}}]", "data.seq_len=32", "data.batch_size=4", "parallel.mode=ddp",
                 f"steps={STEPS}", "optim.warmup_steps=2", "checkpoint.every=4", f"run_dir={run_dir}",
                 "model.overrides={n_layer: 2, n_head: 4, n_embd: 64, context_length: 32, dropout: 0.1}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("LMFORGE_TRAINER_KILL_AT_STEP", None)
    if kill_at is not None:
        env["LMFORGE_TRAINER_KILL_AT_STEP"] = str(kill_at)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "lmforge.trainer", *overrides]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)


@pytest.mark.slow
def test_trainer_checkpoints_round_trip_and_resume_identically(s3, tmp_path):
    _, make_bucket = s3
    make_bucket("trainer-ckpt")
    data = random_output(tmp_path / "data")
    reference = train(tmp_path / "reference", data)
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "reference")}

    first = tmp_path / "first-pod"
    assert train(first, data, kill_at=10).returncode != 0  # the pod dies at step 10
    local = first / "checkpoints"
    uploader = in_process_uploader(local, "s3://trainer-ckpt/runs/r1")
    uploaded = uploader.run_once()
    uploader.close()
    assert uploaded == committed_steps(local) and uploaded[-1] in (3, 7)

    second = tmp_path / "second-pod"  # a new pod on another node: empty disk, restore first
    result = run_uploader("restore", "--src", "s3://trainer-ckpt/runs/r1", "--dir", str(second / "checkpoints"))
    assert result.returncode == 0, result.stderr
    step = uploaded[-1]
    restored = files_of(step_dir(second / "checkpoints", step))
    original = files_of(step_dir(local, step))
    assert restored == original  # both carry COMMITTED and UPLOADED markers too
    assert UPLOADED_MARKER in restored

    resumed = train(second, data)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got = {r["step"]: r["loss"] for r in read_metrics(second)}
    assert sorted(got) == list(range(step + 1, STEPS))
    assert max(abs(got[s] - expected[s]) for s in got) < 1e-6  # data order and dropout RNG included
