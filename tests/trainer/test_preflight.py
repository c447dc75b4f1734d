"""Preflight: 2 ranks under torchrun (gloo, CPU) with injected faults, and the verdict on
synthetic per-rank results."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from lmforge.common.config import load_config
from lmforge.common.errors import ConfigError
from lmforge.trainer.config import PreflightSection
from lmforge.trainer.parallelize import Dist
from lmforge.trainer.preflight import (
    FAULT_ENV,
    PreflightConfig,
    PreflightError,
    PreflightReport,
    RankResult,
    find_problems,
    run_preflight,
)


def preflight(*overrides: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop(FAULT_ENV, None)
    if fault:
        env[FAULT_ENV] = fault
    command = [sys.executable, "-m", "lmforge.trainer.cli", "preflight", "--nproc", "2", "preflight.payload_mb=4",
               *overrides]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


def test_healthy_ranks_pass_and_report_bandwidth():
    result = preflight()
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    report = next(line for line in lines if "event" not in line)
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert all(r["ok"] and r["compute_seconds"] > 0 and r["host"] == socket.gethostname() for r in report["ranks"])
    assert report["ok"] and report["busbw_gbps"] > 0 and report["payload_bytes"] == 4_000_000
    assert report["busbw_gbps"] == pytest.approx(report["algbw_gbps"])  # 2(n-1)/n = 1 for two ranks
    assert [line["event"] for line in lines if "event" in line] == ["preflight"]  # logged once, by rank 0


def test_broken_rank_fails_fast_naming_rank_and_host():
    result = preflight(fault="1:broken")
    assert result.returncode != 0
    assert f"device check failed on rank 1 (host {socket.gethostname()}, cpu)" in result.stderr
    assert "rank 0" not in result.stderr.split("error: ", 1)[1].splitlines()[0]


def test_slow_rank_fails_naming_rank():
    result = preflight(fault="1:slow")
    assert result.returncode != 0
    assert f"rank 1 (host {socket.gethostname()}, cpu) is slow" in result.stderr


def test_bandwidth_below_the_minimum_fails():
    result = preflight("preflight.min_bus_bandwidth_gbps=1e9")
    assert result.returncode != 0
    assert "all-reduce bus bandwidth" in result.stderr and "min_bus_bandwidth_gbps" in result.stderr


def rank(index: int, seconds: float | None = 0.01, error: str | None = None) -> RankResult:
    return RankResult(index, f"node-{index // 8}", index % 8, f"cuda:{index % 8}", ok=error is None, error=error,
                      compute_seconds=None if error else seconds)


def report(ranks: list[RankResult], busbw: float | None = 100.0) -> PreflightReport:
    return PreflightReport(len(ranks), ranks, 16_000_000, 5, busbw_gbps=busbw)


def test_verdict_on_synthetic_results():
    section = PreflightSection(slow_factor=3.0, min_bus_bandwidth_gbps=50.0)
    assert find_problems(report([rank(i, 0.01 + i * 0.001) for i in range(16)]), section) == []

    broken = find_problems(report([rank(0), rank(9, error="CUDA error: ECC")], busbw=None), section)
    assert broken == ["device check failed on rank 9 (host node-1, cuda:1): CUDA error: ECC"]

    [slow] = find_problems(report([rank(0), rank(1, 0.1)]), section)  # two ranks: the slow one is caught
    assert slow.startswith("rank 1 (host node-0, cuda:1) is slow") and "10.0x" in slow
    assert find_problems(report([rank(0), rank(1, 0.029)]), section) == []

    [slow] = find_problems(report([rank(i, 0.05 if i == 12 else 0.01) for i in range(16)]), section)
    assert slow.startswith("rank 12 (host node-1, cuda:4) is slow")

    [low] = find_problems(report([rank(0), rank(1)], busbw=20.0), section)
    assert "bus bandwidth 20.000 GB/s is below" in low
    assert find_problems(report([rank(0), rank(1)], busbw=20.0), PreflightSection()) == []  # 0: off
    assert find_problems(report([rank(0)], busbw=None), section) == []  # one process: nothing to measure


def test_single_process_checks_its_device(monkeypatch):
    ctx = Dist(0, 1, 0, torch.device("cpu"), None)
    monkeypatch.delenv(FAULT_ENV, raising=False)
    result = run_preflight(ctx, PreflightSection(iterations=2, min_bus_bandwidth_gbps=1e9))
    assert result.ok and result.ranks[0].compute_seconds > 0 and result.busbw_gbps is None
    monkeypatch.setenv(FAULT_ENV, "0:broken")
    with pytest.raises(PreflightError, match="device check failed on rank 0") as err:
        run_preflight(ctx, PreflightSection(iterations=2))
    assert err.value.exit_code == 6
    monkeypatch.setenv(FAULT_ENV, "zero:broken")
    with pytest.raises(ConfigError, match=FAULT_ENV):
        run_preflight(ctx, PreflightSection(iterations=2))


def test_config_reads_a_training_config_without_needing_data(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("data: {sources: [{path: /nowhere}]}\nsteps: 3\nparallel: {mode: fsdp, timeout_seconds: 30}\n")
    config = load_config(PreflightConfig, path, ["preflight.iterations=2"])
    assert config.parallel.timeout_seconds == 30 and config.preflight.iterations == 2
    assert load_config(PreflightConfig, None, ["device=cpu"]).device == "cpu"
    with pytest.raises(ConfigError, match="stepz"):
        load_config(PreflightConfig, None, ["stepz=3"])
    with pytest.raises(ConfigError, match="preflight"):
        load_config(PreflightConfig, None, ["preflight.iterationz=3"])


def test_training_with_preflight_enabled_stops_before_the_first_step(tmp_path):
    from tests.trainer.helpers import random_output

    data = random_output(tmp_path / "data")
    env = {**os.environ, "OMP_NUM_THREADS": "1", FAULT_ENV: "1:broken"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "lmforge.trainer", f"data.sources=[{{path: {data}}}]", "data.seq_len=16", "parallel.mode=ddp",
               "preflight.enabled=true", "preflight.payload_mb=1", "steps=5", f"run_dir={tmp_path / 'run'}",
               "model.overrides={n_layer: 1, n_head: 2, n_embd: 32, context_length: 16}"]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode != 0
    assert "device check failed on rank 1" in result.stderr
    assert not (tmp_path / "run").exists()  # stopped before anything was written
