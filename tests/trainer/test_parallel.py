"""2-rank DDP and 2-rank FSDP2 (torchrun, gloo, CPU, fp32) match a 1-rank run with the
same global batch, step by step."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.trainer.helpers import random_output, read_metrics

STEPS = 20
MODEL = ["model.overrides={n_layer: 2, n_head: 4, n_embd: 64, context_length: 32}"]


def run_trainer(tmp_path, name: str, nproc: int, mode: str, batch_size: int, data) -> list[float]:
    run_dir = tmp_path / name
    overrides = [f"data.sources=[{{path: {data}}}]", "data.seq_len=32", f"data.batch_size={batch_size}",
                 f"parallel.mode={mode}", f"steps={STEPS}", "optim.warmup_steps=2", "optim.lr=0.003",
                 f"run_dir={run_dir}", *MODEL]
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


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("parallel")
    data = random_output(tmp / "data")
    return tmp, data, run_trainer(tmp, "single", 1, "none", 8, data)


def test_single_process_learns(reference):
    _, _, losses = reference
    assert losses[-1] < losses[0] - 1.0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_ranks_match_one(reference, mode):
    tmp, data, single = reference
    losses = run_trainer(tmp, mode, 2, mode, 4, data)
    assert max(abs(a - b) for a, b in zip(single, losses)) < 1e-4, list(zip(single, losses))
