"""torch.profiler traces on request (profile.steps) and the communication figures read from them:
a real 2-rank FSDP run on gloo, and the trace reading on a GPU-shaped trace (NCCL kernels
overlapping compute kernels, which a CPU run cannot produce)."""

from __future__ import annotations

import json

import pytest

from lmforge.trainer.profiling import KINDS, STEP_EVENT, subtract, summarize_trace, union
from tests.trainer.helpers import random_output, read_metrics, run_trainer

STEPS = 4


def overrides(data, run_dir, *extra: str) -> list[str]:
    return [f"data.sources=[{{path: {data}}}]", "data.seq_len=32", "data.batch_size=4", "model.preset=llama-debug",
            f"steps={STEPS}", f"run_dir={run_dir}", *extra]


@pytest.mark.slow
def test_fsdp_run_writes_a_trace_per_rank_for_the_profiled_step_and_a_profile_record(tmp_path):
    data, run_dir = random_output(tmp_path / "data"), tmp_path / "run"
    result = run_trainer(overrides(data, run_dir, "parallel.mode=fsdp", "profile.steps=[2]"), nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(STEPS))

    profile = run_dir / "profile"
    assert sorted(p.relative_to(profile).as_posix() for p in profile.rglob("*") if p.is_file()) == [
        "step-00002/rank-0.pt.trace.json", "step-00002/rank-1.pt.trace.json"]
    for rank in (0, 1):
        trace = json.loads((profile / "step-00002" / f"rank-{rank}.pt.trace.json").read_text())
        names = {e.get("name") for e in trace["traceEvents"]}
        assert {STEP_EVENT, "c10d::_allgather_base_", "c10d::_reduce_scatter_base_", "gloo:all_gather"} <= names
        assert trace["distributedInfo"]["rank"] == rank
        assert not any("Input Dims" in e.get("args", {}) for e in trace["traceEvents"])  # record_shapes off

    [record] = read_metrics(run_dir, "profile")
    assert record["step"] == 2 and record["timeline"] == "cpu" and len(record["ranks"]) == 2
    assert record["trace_dir"] == str(profile / "step-00002")
    for figures in (record, *record["ranks"]):
        comm = figures["comm_seconds"]
        assert set(comm) == set(KINDS)
        assert comm["all_gather"] > 0 and comm["reduce_scatter"] > 0
        assert comm["all_reduce"] > 0  # the loss's mean and the clipping norm
        assert comm["all_to_all"] == comm["send_recv"] == comm["broadcast"] == 0
        assert 0 < figures["exposed_comm_seconds"] <= figures["comm_total_seconds"] <= sum(comm.values()) + 1e-9
        assert figures["comm_total_seconds"] < figures["step_seconds"]
        assert 0 < figures["exposed_comm_fraction"] < 1 and 0 <= figures["overlapped_comm_fraction"] < 1


def test_a_run_without_profile_writes_no_trace(tmp_path):
    data, run_dir = random_output(tmp_path / "data"), tmp_path / "run"
    result = run_trainer(overrides(data, run_dir, "steps=2"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(read_metrics(run_dir)) == 2
    assert not (run_dir / "profile").exists()
    assert read_metrics(run_dir, "profile") == []


def kernel(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "tid": 7}


def cpu_op(name: str, ts: float, dur: float = 5) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": 1}


def test_gpu_trace_counts_only_communication_no_compute_kernel_hides():
    """All-gather 100-300 µs under compute 150-250: 100 µs exposed. NCCL runs all-to-all as SendRecv
    kernels: the c10d call that issued them names the kind."""
    trace = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": STEP_EVENT, "ts": 0, "dur": 1000, "tid": 1},
        cpu_op("c10d::_allgather_base_", 90), cpu_op("c10d::alltoall_base_", 390), cpu_op("aten::mm", 140),
        kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 100, 200),
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 150, 100),
        kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 400, 50),
        kernel("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 600, 100),
        kernel("elementwise_kernel", 650, 100),
        kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 1200, 50),  # after the step
    ]}
    summary = summarize_trace(trace)
    assert summary.timeline == "cuda"
    assert summary.comm_seconds == pytest.approx(
        {**dict.fromkeys(KINDS, 0.0), "all_gather": 200e-6, "all_to_all": 50e-6, "reduce_scatter": 100e-6})
    assert summary.comm_total_seconds == pytest.approx(350e-6)
    assert summary.exposed_comm_seconds == pytest.approx(100e-6 + 50e-6 + 50e-6)
    assert summary.exposed_comm_fraction == pytest.approx(200e-6 / 1e-3)
    assert summary.overlapped_comm_fraction == pytest.approx(1 - 200 / 350)


def test_interval_arithmetic():
    assert union([(5, 8), (0, 2), (1, 3), (8, 9)]) == [(0, 3), (5, 9)]
    assert subtract([(0, 10), (20, 30)], [(2, 4), (8, 22), (29, 40)]) == [(0, 2), (4, 8), (22, 29)]
    assert subtract([(0, 10)], []) == [(0, 10)]
