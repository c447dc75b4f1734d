"""Training telemetry: the Prometheus endpoint on rank 0 with docs/design.md's names and per-rank
gauges, step records (MFU, mixture, per-rank figures), FSDP's memory saving over DDP, and
a hung peer ending the job at the collective timeout."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.ports import free_port
from tests.trainer.helpers import random_output, read_metrics

DESIGN_NAMES = ["lmforge_train_step", "lmforge_train_loss", "lmforge_train_grad_norm", "lmforge_train_learning_rate",
                "lmforge_train_tokens_per_second", "lmforge_train_mfu_ratio", "lmforge_train_step_seconds",
                "lmforge_train_data_wait_seconds", "lmforge_train_nonfinite_steps_total",
                "lmforge_train_peak_memory_bytes", "lmforge_train_last_checkpoint_step"]
SMALL = "model.overrides={n_layer: 2, n_head: 4, n_embd: 64, context_length: 32}"


def launch(run_dir, data, *extra, nproc=2, mode="ddp", env_extra=None, model=SMALL) -> subprocess.Popen:
    overrides = [f"data.sources=[{{path: {data}}}]", "data.seq_len=32", "data.batch_size=4", f"parallel.mode={mode}",
                 "optim.warmup_steps=2", f"run_dir={run_dir}", model, *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "lmforge.trainer", *overrides]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish(process: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    _, stderr = process.communicate(timeout=timeout)
    return process.returncode, stderr


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return random_output(tmp_path_factory.mktemp("telemetry") / "data")


def scrape(port: int) -> dict[str, list]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


@pytest.mark.slow
def test_rank_zero_serves_design_metrics_with_per_rank_gauges(tmp_path, data):
    port = free_port()
    process = launch(tmp_path / "run", data, "steps=100000", f"metrics.port={port}", "metrics.peak_flops=1e11",
                     "checkpoint.every=2")
    try:
        samples, deadline = {}, time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                samples = scrape(port)
            except OSError:
                samples = {}
            if [s.value for s in samples.get("lmforge_train_last_checkpoint_step", []) if s.value >= 1] \
                    and [s.value for s in samples.get("lmforge_train_step", []) if s.value >= 5]:
                break
            assert process.poll() is None, process.communicate()[1][-3000:]
            time.sleep(0.2)
    finally:
        process.terminate()
        process.communicate(timeout=60)
    missing = [name for name in DESIGN_NAMES if name not in samples]
    assert not missing, missing
    assert samples["lmforge_train_step"][0].value >= 5
    assert samples["lmforge_train_last_checkpoint_step"][0].value >= 1
    assert 0 < samples["lmforge_train_mfu_ratio"][0].value < 1
    for name in ("lmforge_train_step_seconds", "lmforge_train_data_wait_seconds", "lmforge_train_peak_memory_bytes"):
        assert sorted(s.labels["rank"] for s in samples[name]) == ["0", "1"], name
    assert min(s.value for s in samples["lmforge_train_peak_memory_bytes"]) > 10 * 2**20


STEP_RECORD = {"step": 41, "loss": 2.75, "grad_norm": 0.5, "lr": 3e-4, "tokens_per_second": 1234.0, "mfu": None,
               "stage": 1, "tokens": 86016}
PER_RANK = [{"step_seconds": 0.25, "data_wait_seconds": 0.01, "peak_memory_bytes": 2**20}]
UNKNOWN_AT_START = ["lmforge_train_step", "lmforge_train_loss", "lmforge_train_val_loss", "lmforge_train_grad_norm",
                    "lmforge_train_learning_rate", "lmforge_train_tokens_per_second", "lmforge_train_mfu_ratio",
                    "lmforge_train_last_checkpoint_step", "lmforge_train_checkpoint_stall_seconds",
                    "lmforge_train_stage", "lmforge_train_consumed_tokens"]


def test_gauges_are_absent_until_the_trainer_knows_them():
    """A scrape before the first step (a start, a slow restore) shows no gauge sample: a 0 would
    pull lmforge:train_loss:avg_30m down and fire the loss-spike alert when training resumes."""
    from prometheus_client import generate_latest

    from lmforge.trainer.metrics import TrainMetrics
    from tests.prometheus_tools import registry_samples

    metrics = TrainMetrics()
    text = generate_latest(metrics.registry).decode()
    assert all(f"# TYPE {name} gauge" in text for name in UNKNOWN_AT_START)  # the names stay exposed
    assert [name for name in UNKNOWN_AT_START if name in registry_samples(metrics.registry)] == []

    metrics.observe_step(STEP_RECORD, PER_RANK)
    samples = registry_samples(metrics.registry)
    assert {name: samples.get(name) for name in UNKNOWN_AT_START} == {
        "lmforge_train_step": 41, "lmforge_train_loss": 2.75, "lmforge_train_grad_norm": 0.5,
        "lmforge_train_learning_rate": 3e-4, "lmforge_train_tokens_per_second": 1234.0,
        "lmforge_train_mfu_ratio": None,  # no known peak FLOP/s: never a made-up 0
        "lmforge_train_val_loss": None, "lmforge_train_checkpoint_stall_seconds": None,
        "lmforge_train_last_checkpoint_step": -1,  # a step ran and no checkpoint was restored: none yet
        "lmforge_train_stage": 1, "lmforge_train_consumed_tokens": 86016,
    }

    metrics.observe_eval(3.5, {"web": 3.25, "code": 4.0})
    metrics.checkpoint_stall.set(0.125)
    metrics.observe_step({**STEP_RECORD, "step": 42, "mfu": 0.3}, PER_RANK)
    samples = registry_samples(metrics.registry)
    assert (samples["lmforge_train_val_loss"], samples["lmforge_train_checkpoint_stall_seconds"],
            samples["lmforge_train_mfu_ratio"], samples["lmforge_train_step"]) == (3.5, 0.125, 0.3, 42)
    from prometheus_client.parser import text_string_to_metric_families

    scrape = text_string_to_metric_families(generate_latest(metrics.registry).decode())
    assert {s.labels["source"]: s.value for family in scrape for s in family.samples
            if s.name == "lmforge_train_source_val_loss"} == {"web": 3.25, "code": 4.0}


def test_a_resumed_run_shows_its_restored_checkpoint_never_minus_one():
    """Run reports the restored checkpoint's step before the first step; the first step keeps it."""
    from lmforge.trainer.metrics import TrainMetrics
    from tests.prometheus_tools import registry_samples

    metrics = TrainMetrics()
    metrics.last_checkpoint.set(40)
    assert registry_samples(metrics.registry)["lmforge_train_last_checkpoint_step"] == 40
    metrics.observe_step(STEP_RECORD, PER_RANK)
    assert registry_samples(metrics.registry)["lmforge_train_last_checkpoint_step"] == 40


def test_step_records_carry_mfu_memory_and_the_realized_mixture(tmp_path):
    from lmforge.trainer.config import TrainConfig
    from lmforge.trainer.train import train

    web = random_output(tmp_path / "web", seed=1)
    code = random_output(tmp_path / "code", seed=2)
    config = TrainConfig.model_validate({
        "data": {"sources": [{"path": str(web), "weight": 3}, {"path": str(code), "weight": 1}], "seq_len": 16,
                 "batch_size": 8},
        "model": {"overrides": {"n_layer": 1, "n_embd": 32, "n_head": 2, "context_length": 16}},
        "steps": 40, "metrics": {"peak_flops": 1e12}, "run_dir": str(tmp_path / "run")})
    train(config)
    steps = read_metrics(tmp_path / "run")
    last = steps[-1]
    assert last["mfu"] == pytest.approx(last["flops_per_second"] / 1e12)
    assert last["mixture"]["web"] == pytest.approx(0.75, abs=0.08)
    assert last["mixture"]["code"] == pytest.approx(0.25, abs=0.08)
    assert len(last["ranks"]) == 1 and last["ranks"][0]["peak_memory_bytes"] > 0
    memory = read_metrics(tmp_path / "run", "memory")[0]
    assert memory["total"] == memory["params"] + memory["grads"] + memory["optimizer"] > 0


@pytest.mark.slow
def test_a_slow_data_rank_shows_in_its_own_data_wait(tmp_path, data):
    delay = 0.5
    process = launch(tmp_path / "run", data, "steps=6", "data.prefetch=0",
                     env_extra={"LMFORGE_TRAINER_SLOW_DATA_SECONDS": str(delay), "LMFORGE_TRAINER_FAULT_RANK": "1"})
    code, stderr = finish(process)
    assert code == 0, stderr[-3000:]
    waits = [[r["data_wait_seconds"] for r in step["ranks"]] for step in read_metrics(tmp_path / "run")]
    assert len(waits) == 6
    # The slow rank's every load takes at least the delay, so every step's wait holds it; rank 0
    # waits for rank 1 in the gradient all-reduce, which is not data wait: its waits hold no delay
    # (the median, so that one step of a busy machine cannot decide it).
    assert all(slow >= delay for _, slow in waits), waits
    assert statistics.median(fast for fast, _ in waits) < delay / 2, waits


@pytest.mark.slow
def test_fsdp_holds_at_most_55_percent_of_ddp_state_per_rank(tmp_path, data):
    model = "model.overrides={n_layer: 4, n_head: 4, n_embd: 128, context_length: 32}"
    totals = {}
    for mode in ("ddp", "fsdp"):
        code, stderr = finish(launch(tmp_path / mode, data, "steps=2", model=model, mode=mode))
        assert code == 0, stderr[-3000:]
        totals[mode] = read_metrics(tmp_path / mode, "memory")[0]
    for part in ("params", "grads", "optimizer"):
        assert totals["fsdp"][part] <= 0.55 * totals["ddp"][part], (part, totals)
    assert totals["fsdp"]["total"] <= 0.55 * totals["ddp"]["total"]
    every = totals["fsdp"]["ranks"]  # each rank's own state, gathered: both hold one half
    assert [r["rank"] for r in every] == [0, 1] and every[0]["total"] == totals["fsdp"]["total"]
    assert abs(every[0]["total"] + every[1]["total"] - totals["ddp"]["total"]) <= 0.05 * totals["ddp"]["total"]


@pytest.mark.slow
def test_a_hung_peer_ends_the_job_at_the_collective_timeout(tmp_path, data):
    started = time.monotonic()
    process = launch(tmp_path / "run", data, "steps=20", "parallel.timeout_seconds=5",
                     env_extra={"LMFORGE_TRAINER_HANG_AT_STEP": "3", "LMFORGE_TRAINER_FAULT_RANK": "1"})
    code, stderr = finish(process, timeout=120)
    assert code != 0
    assert time.monotonic() - started < 90
    assert "timed out" in stderr.lower() or "timeout" in stderr.lower(), stderr[-3000:]


def test_step_log_lines_keep_the_logger_time_and_carry_a_timestamp(tmp_path):
    import json

    data = random_output(tmp_path / "data", train_tokens=20000)
    command = [sys.executable, "-m", "lmforge.trainer", f"data.sources=[{{path: {data}}}]", "data.seq_len=16",
               "data.batch_size=2", "steps=2", f"run_dir={tmp_path / 'run'}",
               "model.overrides={n_layer: 1, n_head: 2, n_embd: 32, context_length: 16}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    steps = [line for line in lines if line.get("event") == "step"]
    assert len(steps) == 2 and all(isinstance(line["time"], str) and "T" in line["time"] for line in steps)
    assert all(r["timestamp"] > 1.7e9 for r in read_metrics(tmp_path / "run"))
