"""torch.profiler traces of the steps `profile.steps` names, and the communication they show.

For each such step every rank writes RUN_DIR/<profile.dir>/step-NNNNN/rank-R.pt.trace.json, a
Chrome trace (Perfetto, chrome://tracing; the `*.pt.trace.json` name is what TensorBoard's
profiler plugin reads: `tensorboard --logdir RUN_DIR/profile` shows each step as a run and each
rank as a worker). Rank 0 then records a metrics.jsonl "profile" record, per rank and averaged:
the time in each kind of collective, and how much of it was exposed (not overlapped by compute).

Reading a trace (`summarize_trace`): with CUDA kernels in it, communication is the NCCL kernels
and compute every other kernel, on the device's timeline. On CPU (gloo) communication is the
`gloo:<op>` events (run on gloo's worker threads) plus the `c10d::` calls that issued them (on
the training thread: a blocking recv waits inside its call), and compute is the `aten::` ops
outside those. A transport event takes the kind of the call that issued it: gloo runs a
reduce-scatter as an all-reduce, NCCL an all-to-all as send/recv. Gloo collectives mostly block
the training thread, so on CPU nearly all communication shows as exposed; that is a measurement
of gloo, not an assumption, and says nothing about NCCL's overlap on a GPU.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from lmforge.trainer.config import ProfileSection

STEP_EVENT = "lmforge::train_step"
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast", "barrier", "other")
# Transport kind -> the issuing calls' kinds it can stand for.
STANDS_FOR = {"all_reduce": ("reduce_scatter",), "send_recv": ("all_to_all",)}

Interval = tuple[float, float]  # microseconds, start < end


def collective_kind(name: str) -> str:
    """The kind of collective an event's name says (c10d::_reduce_scatter_base_, gloo:all_gather,
    ncclDevKernel_AllReduce_Sum_f32_RING_LL, …)."""
    flat = name.lower().replace("_", "")
    for token, kind in (("reducescatter", "reduce_scatter"), ("allgather", "all_gather"),
                        ("allreduce", "all_reduce"), ("alltoall", "all_to_all"), ("broadcast", "broadcast"),
                        ("barrier", "barrier"), ("sendrecv", "send_recv"), ("send", "send_recv"),
                        ("recv", "send_recv")):
        if token in flat:
            return kind
    return "other"


def union(intervals: list[Interval]) -> list[Interval]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def subtract(intervals: list[Interval], removed: list[Interval]) -> list[Interval]:
    """`intervals` minus `removed` (both merged, as union returns them)."""
    out, cuts = [], union(removed)
    for start, end in intervals:
        for cut_start, cut_end in cuts:
            if cut_end <= start or cut_start >= end:
                continue
            if cut_start > start:
                out.append((start, cut_start))
            start = max(start, cut_end)
            if start >= end:
                break
        if start < end:
            out.append((start, end))
    return out


def length(intervals: list[Interval]) -> float:
    return sum(end - start for start, end in intervals)


@dataclass(frozen=True)
class CommSummary:
    timeline: str  # "cuda" (kernels) or "cpu" (gloo)
    step_seconds: float
    comm_seconds: dict[str, float]  # per kind (KINDS), each the union of its events
    comm_total_seconds: float  # the union over every kind
    exposed_comm_seconds: float  # communication while no compute ran

    @property
    def exposed_comm_fraction(self) -> float:
        """Share of the step spent communicating with no compute under it."""
        return self.exposed_comm_seconds / self.step_seconds if self.step_seconds else 0.0

    @property
    def overlapped_comm_fraction(self) -> float:
        """Share of the communication hidden under compute (HTA's comm/comp overlap)."""
        return 1 - self.exposed_comm_seconds / self.comm_total_seconds if self.comm_total_seconds else 0.0

    def figures(self) -> list[float]:
        return [self.step_seconds, self.comm_total_seconds, self.exposed_comm_seconds,
                *(self.comm_seconds[kind] for kind in KINDS)]

    @classmethod
    def from_figures(cls, timeline: str, figures: list[float]) -> CommSummary:
        return cls(timeline, figures[0], dict(zip(KINDS, figures[3:], strict=True)), figures[1], figures[2])

    def record(self) -> dict:
        return {"step_seconds": self.step_seconds, "comm_seconds": self.comm_seconds,
                "comm_total_seconds": self.comm_total_seconds, "exposed_comm_seconds": self.exposed_comm_seconds,
                "exposed_comm_fraction": self.exposed_comm_fraction,
                "overlapped_comm_fraction": self.overlapped_comm_fraction}


def _span(event: dict) -> Interval:
    return float(event["ts"]), float(event["ts"]) + float(event.get("dur", 0))


def summarize_trace(trace: dict) -> CommSummary:
    """Communication per kind and exposed communication within the trace's STEP_EVENT (module doc)."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "ts" in e]
    window = next((_span(e) for e in events if e["name"] == STEP_EVENT), None)
    if window is None:
        window = (min(e["ts"] for e in events), max(_span(e)[1] for e in events))
    events = [e for e in events if _span(e)[0] >= window[0] and _span(e)[1] <= window[1]]
    issuers = sorted((e for e in events if e.get("cat") == "cpu_op" and e["name"].startswith("c10d::")),
                     key=lambda e: e["ts"])
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if kernels:
        timeline = "cuda"
        transports = [e for e in kernels if "nccl" in e["name"].lower()]
        compute = union([_span(e) for e in kernels if "nccl" not in e["name"].lower()])
        labelled = _label(transports, issuers)
    else:
        timeline = "cpu"
        transports = [e for e in events if e["name"].startswith("gloo:")]
        labelled = _label(transports, issuers) + [(collective_kind(e["name"]), e) for e in issuers]
        compute = _cpu_compute(events, [e for _, e in labelled])
    comm = union([_span(e) for _, e in labelled])
    per_kind = {kind: length(union([_span(e) for k, e in labelled if k == kind])) / 1e6 for kind in KINDS}
    return CommSummary(timeline, (window[1] - window[0]) / 1e6, per_kind, length(comm) / 1e6,
                       length(subtract(comm, compute)) / 1e6)


def _label(transports: list[dict], issuers: list[dict]) -> list[tuple[str, dict]]:
    """Each transport event with the kind of the oldest unmatched call that could have issued it."""
    pending = list(issuers)
    labelled = []
    for event in sorted(transports, key=lambda e: e["ts"]):
        kind = collective_kind(event["name"])
        accepted = (kind, *STANDS_FOR.get(kind, ()))
        match = next((i for i in pending if i["ts"] <= event["ts"] and collective_kind(i["name"]) in accepted), None)
        if match is not None:
            pending.remove(match)
            kind = collective_kind(match["name"])
        labelled.append((kind, event))
    return labelled


def _cpu_compute(events: list[dict], comm_events: list[dict]) -> list[Interval]:
    """The aten ops' time on each thread outside that thread's communication events."""
    compute: list[Interval] = []
    for tid in {e.get("tid") for e in events}:
        ops = union([_span(e) for e in events if e.get("tid") == tid and e.get("cat") == "cpu_op"
                     and e["name"].startswith("aten::")])
        compute += subtract(ops, union([_span(e) for e in comm_events if e.get("tid") == tid]))
    return union(compute)


class StepProfiler:
    """`with profiler.step(step):` around a training step profiles it when profile.steps names it."""

    def __init__(self, section: ProfileSection, run_dir: str | Path, rank: int, world_size: int,
                 device: torch.device, record: Callable[[str, dict], None]):
        self.steps = set(section.steps)
        self.dir = Path(run_dir) / section.dir
        self.record_shapes = section.record_shapes
        self.rank, self.world_size, self.device, self.record = rank, world_size, device, record

    def trace_path(self, step: int, rank: int | None = None) -> Path:
        return self.dir / f"step-{step:05d}" / f"rank-{self.rank if rank is None else rank}.pt.trace.json"

    @contextmanager
    def step(self, step: int) -> Iterator[None]:
        if step not in self.steps:
            yield
            return
        from torch.profiler import ProfilerActivity, profile, record_function

        cuda = self.device.type == "cuda"
        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
        with profile(activities=activities, record_shapes=self.record_shapes) as prof, record_function(STEP_EVENT):
            yield
            if cuda:
                torch.cuda.synchronize(self.device)
        path = self.trace_path(step)
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        summary = summarize_trace(json.loads(path.read_text()))
        self._record(step, summary)

    def _record(self, step: int, summary: CommSummary) -> None:
        """Every rank's summary to rank 0 (a collective: every rank profiles the same steps)."""
        local = torch.tensor(summary.figures(), dtype=torch.float64, device=self.device)
        gathered = [local]
        if self.world_size > 1:
            gathered = [torch.empty_like(local) for _ in range(self.world_size)]
            dist.all_gather(gathered, local)
        if self.rank != 0:
            return
        ranks = [CommSummary.from_figures(summary.timeline, t.tolist()) for t in gathered]
        means = [sum(values) / len(ranks) for values in zip(*(r.figures() for r in ranks), strict=True)]
        mean = CommSummary.from_figures(summary.timeline, means)
        self.record("profile", {"step": step, "trace_dir": str(self.trace_path(step).parent),
                                "timeline": summary.timeline, **mean.record(),
                                "ranks": [{"rank": i, **r.record()} for i, r in enumerate(ranks)]})
