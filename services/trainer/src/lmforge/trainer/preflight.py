"""Preflight: find a broken or slow rank before a job spends its allocation on it.

Every rank runs a fixed matmul workload on its device (timed, result checked against a
known value); the ranks exchange the results and, when every device is healthy, time an
all-reduce of `payload_mb` float32 and report its bus bandwidth. All ranks then reach the
same verdict from the same gathered data, so the job fails as a whole with one message
naming the rank and host at fault.

    lmforge-train preflight --nproc N [--config F] [key=value …]   # alone, under torchrun
    preflight.enabled: true                                        # before every training start

Bandwidths are in GB/s (10^9 bytes/s) with the nccl-tests convention: algbw = payload /
time, busbw = algbw * 2(n-1)/n. A single process checks its device and skips the
collectives (there is no interconnect to measure).

Fault injection for the tests (in the style of LMFORGE_TRAINER_KILL_AT_STEP), comma-separated:
    LMFORGE_TRAINER_PREFLIGHT_FAULT=R:broken   rank R's device check fails as if the device raised
    LMFORGE_TRAINER_PREFLIGHT_FAULT=R:slow     rank R's timed workload is made ~10x slower
"""

from __future__ import annotations

import functools
import json
import os
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Literal

import torch
import torch.distributed as dist
from pydantic import ConfigDict, Field, model_validator

from lmforge.common.cli import ServiceCli
from lmforge.common.config import StrictModel, load_config
from lmforge.common.errors import ConfigError, LmforgeError
from lmforge.common.logging import get_logger
from lmforge.trainer.config import ENV_PREFIX, ParallelSection, PreflightSection, TrainConfig
from lmforge.trainer.launch import die_with_launcher
from lmforge.trainer.parallelize import Dist, init_distributed
from lmforge.trainer.process_exit import frozen_exit

FAULT_ENV = "LMFORGE_TRAINER_PREFLIGHT_FAULT"
# Powers of two, so that x @ x with x = 1/n everywhere is exactly x again in fp32 (and tf32).
MATMUL_SIZE = {"cpu": 1024, "cuda": 4096}


class PreflightError(LmforgeError):
    """A rank failed the preflight checks; the message names the rank(s) and host(s)."""

    exit_code = 6


@dataclass
class RankResult:
    rank: int
    host: str
    local_rank: int
    device: str
    ok: bool
    error: str | None = None
    compute_seconds: float | None = None  # median time of one matmul iteration
    all_reduce_seconds: float | None = None  # mean time of one all-reduce, as this rank saw it


@dataclass
class PreflightReport:
    world_size: int
    ranks: list[RankResult]
    payload_bytes: int
    iterations: int
    all_reduce_seconds: float | None = None  # the slowest rank's mean
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def find_problems(report: PreflightReport, section: PreflightSection) -> list[str]:
    """The verdict, a pure function of the gathered results: an empty list means healthy."""
    problems = [f"device check failed on rank {r.rank} (host {r.host}, {r.device}): {r.error}"
                for r in report.ranks if not r.ok]
    timed = [r for r in report.ranks if r.ok and r.compute_seconds is not None]
    if len(timed) > 1:
        # The lower median: with two ranks the slow one is compared with the healthy one.
        median = statistics.median_low(r.compute_seconds for r in timed)
        for r in timed:
            ratio = r.compute_seconds / median if median > 0 else 1.0
            if ratio > section.slow_factor:
                problems.append(f"rank {r.rank} (host {r.host}, {r.device}) is slow: {r.compute_seconds:.4f} s per "
                                f"matmul iteration, {ratio:.1f}x the median {median:.4f} s "
                                f"(preflight.slow_factor {section.slow_factor:g})")
    if section.min_bus_bandwidth_gbps > 0 and report.busbw_gbps is not None \
            and report.busbw_gbps < section.min_bus_bandwidth_gbps:
        problems.append(f"all-reduce bus bandwidth {report.busbw_gbps:.3f} GB/s is below "
                        f"preflight.min_bus_bandwidth_gbps {section.min_bus_bandwidth_gbps:g}")
    return problems


def run_preflight(ctx: Dist, section: PreflightSection, timeout: timedelta | None = None) -> PreflightReport:
    """Check every rank; returns the report (the same on all ranks) or raises PreflightError.
    `timeout` bounds the extra gloo group's collectives (pass parallel.timeout_seconds)."""
    log = get_logger("trainer", rank=ctx.rank)
    faults = _injected_faults()
    result = check_device(ctx, section.iterations, faults.get(ctx.rank))
    # Results travel over gloo even when training uses NCCL, so a broken GPU is still reported.
    group = _object_group(ctx, timeout)
    ranks = _all_gather(result, ctx, group)
    payload_bytes = max(4, int(section.payload_mb * 1e6) // 4 * 4)
    report = PreflightReport(ctx.world_size, ranks, payload_bytes, section.iterations)
    if ctx.world_size > 1 and all(r.ok for r in ranks):
        seconds = _time_all_reduce(ctx, payload_bytes, section.iterations)
        for r, s in zip(ranks, _all_gather(seconds, ctx, group)):
            r.all_reduce_seconds = s
        report.all_reduce_seconds = max(r.all_reduce_seconds for r in ranks)
        report.algbw_gbps = payload_bytes / report.all_reduce_seconds / 1e9
        report.busbw_gbps = report.algbw_gbps * 2 * (ctx.world_size - 1) / ctx.world_size
    report.problems = find_problems(report, section)
    if ctx.is_main:
        (log.info if report.ok else log.error)("preflight", **report.to_dict())
    if not report.ok:
        if ctx.world_size > 1:
            dist.barrier(group=group)  # torchrun stops all ranks when one exits: let rank 0 log first
        raise PreflightError("preflight failed: " + "; ".join(report.problems))
    return report


def check_device(ctx: Dist, iterations: int, fault: str | None = None) -> RankResult:
    result = RankResult(ctx.rank, socket.gethostname(), ctx.local_rank, str(ctx.device), ok=False)
    try:
        if fault == "broken":
            raise RuntimeError(f"injected device fault ({FAULT_ENV})")
        n = MATMUL_SIZE.get(ctx.device.type, 1024)
        x = torch.full((n, n), 1.0 / n, dtype=torch.float32, device=ctx.device)
        y = x @ x  # warm-up: library initialisation is not part of the timing
        _synchronize(ctx.device)
        times = []
        for _ in range(iterations):
            start = time.perf_counter()
            y = y @ x
            _synchronize(ctx.device)
            elapsed = time.perf_counter() - start
            if fault == "slow":
                time.sleep(9 * elapsed)
                elapsed = time.perf_counter() - start
            times.append(elapsed)
        if not torch.equal(y, x):
            error = (y - x).abs().max().item()
            raise RuntimeError(f"matmul result is wrong: max error {error:g} (expected {1.0 / n:g} everywhere)")
        result.compute_seconds = statistics.median(times)
        result.ok = True
    except Exception as exc:  # any device failure is a finding to report, not a crash
        result.error = f"{type(exc).__name__}: {exc}"
    return result


def _time_all_reduce(ctx: Dist, payload_bytes: int, iterations: int) -> float:
    """Mean seconds of one all-reduce (sum) of payload_bytes of float32 on this rank's device."""
    buffer = torch.full((payload_bytes // 4,), float(ctx.rank + 1), dtype=torch.float32, device=ctx.device)
    try:
        dist.all_reduce(buffer)  # warm-up (connections, NCCL channels) and a correctness check
        expected = ctx.world_size * (ctx.world_size + 1) / 2
        if not bool((buffer == expected).all()):
            raise RuntimeError(f"all-reduce returned wrong values (expected {expected:g})")
        buffer.zero_()
        _synchronize(ctx.device)
        start = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(buffer)
        _synchronize(ctx.device)
        return (time.perf_counter() - start) / iterations
    except RuntimeError as exc:
        raise PreflightError(f"all-reduce failed on rank {ctx.rank} (host {socket.gethostname()}, "
                             f"{ctx.device}): {exc}") from exc


def _object_group(ctx: Dist, timeout: timedelta | None):
    if ctx.world_size == 1 or dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo", timeout=timeout)


def _all_gather(value, ctx: Dist, group) -> list:
    if ctx.world_size == 1:
        return [value]
    gathered = [None] * ctx.world_size
    dist.all_gather_object(gathered, value, group=group)
    return gathered


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _injected_faults() -> dict[int, str]:
    faults = {}
    for item in filter(None, os.environ.get(FAULT_ENV, "").split(",")):
        rank, _, kind = item.strip().partition(":")
        if not rank.isdigit() or kind not in ("broken", "slow"):
            raise ConfigError(f"{FAULT_ENV}={item!r}: expected RANK:broken or RANK:slow")
        faults[int(rank)] = kind
    return faults


class PreflightConfig(StrictModel):
    """The sections preflight uses, read from the same YAML/env/overrides as training; the
    other training keys (data, model, …) are accepted and ignored, so no data is needed."""

    model_config = ConfigDict(extra="allow")

    device: Literal["auto", "cpu", "cuda"] = "auto"
    parallel: ParallelSection = Field(default_factory=ParallelSection)
    preflight: PreflightSection = Field(default_factory=PreflightSection)

    @model_validator(mode="after")
    def _known_keys(self) -> PreflightConfig:
        unknown = sorted(set(self.model_extra or {}) - set(TrainConfig.model_fields))
        if unknown:
            raise ValueError(f"unknown config keys: {', '.join(unknown)}")
        return self


def preflight(args, config: PreflightConfig) -> int:
    try:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        # Only a process group is needed, whatever the training parallelism is.
        parallel = ParallelSection(mode="ddp" if world_size > 1 else "none",
                                   timeout_seconds=config.parallel.timeout_seconds)
        ctx = init_distributed(config.device, parallel)
        report = run_preflight(ctx, config.preflight, timedelta(seconds=config.parallel.timeout_seconds))
        if ctx.is_main:
            sys.stdout.write(json.dumps(report.to_dict()) + "\n")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


CLI = ServiceCli("python -m lmforge.trainer.preflight", name="lmforge-train preflight", service="trainer",
                 load_config=functools.partial(load_config, PreflightConfig, env_prefix=ENV_PREFIX), set_help=None,
                 config_help="YAML config file (the training one works)")
CLI.command(None, preflight, config="load")


def main(argv=None) -> int:
    die_with_launcher()
    return CLI.main(argv)


if __name__ == "__main__":
    sys.exit(frozen_exit(main()))
