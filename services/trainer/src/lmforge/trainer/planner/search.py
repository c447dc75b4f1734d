"""The candidate layouts of a plan, each evaluated, and the recommendation: the fastest
predicted step among the layouts that fit in memory.

Candidates: TP ∈ {1, 2, 4, 8, …} dividing the GPUs per node and both head counts (TP stays inside
a node); PP dividing the node count and the layer count (PP goes across nodes); CP a power of two
up to 16 with the sequence split into 2·CP chunks (load-balanced causal attention); every split
of the remaining data-parallel ranks into dp_replicate × dp_shard (DDP, HSDP, FSDP); EP (MoE
only) dividing the expert count and dp_shard·cp; activation checkpointing off and on. For each
of these the micro-batch size (powers of two dividing a rank's share of the global batch; under
PP at least P micro-batches) that gives the fastest step that fits is kept, or, when none fits,
the one that needs the least memory.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from lmforge.common.errors import ConfigError
from lmforge.trainer.planner.comm import AxisComm, communication
from lmforge.trainer.planner.hardware import Cluster
from lmforge.trainer.planner.layout import AXES, Layout
from lmforge.trainer.planner.memory import Memory, StateConfig, memory_per_gpu
from lmforge.trainer.planner.shape import ModelShape
from lmforge.trainer.planner.timing import StepTime, step_time

MAX_CP = 16
MAX_MICRO_BATCH = 64


@dataclass(frozen=True)
class PlanRequest:
    shape: ModelShape
    cluster: Cluster
    seq_len: int
    global_batch: int  # sequences per optimizer step
    tokens: float  # to train on
    precision: str = "bf16"
    state: StateConfig = field(default_factory=StateConfig)
    activation_checkpointing: str = "auto"  # auto | on | off
    flash_attention: bool = True
    memory_headroom: float = 0.10  # share of GPU memory kept free
    fixed_mfu: float | None = None
    attention_flops: bool = True
    pinned: dict[str, int] = field(default_factory=dict)  # axis (or micro_batch) → required value

    def __post_init__(self):
        if self.seq_len < 1 or self.global_batch < 1 or self.tokens <= 0:
            raise ConfigError("--seq-len, the global batch and --tokens must be positive")
        if self.precision not in ("bf16", "fp8"):
            raise ConfigError(f"--precision: {self.precision!r} is not bf16 or fp8")
        self.cluster.peak_flops(self.precision)  # an FP8 plan on a GPU without FP8 fails here
        if self.activation_checkpointing not in ("auto", "on", "off"):
            raise ConfigError(f"--activation-checkpointing: {self.activation_checkpointing!r} is not auto, on or off")
        if not 0 <= self.memory_headroom < 1:
            raise ConfigError(f"--memory-headroom must be in [0, 1), got {self.memory_headroom}")
        if self.fixed_mfu is not None and not 0 < self.fixed_mfu <= 1:
            raise ConfigError(f"--mfu must be in (0, 1], got {self.fixed_mfu}")
        for axis, value in self.pinned.items():
            if axis not in (*AXES, "micro_batch"):
                raise ConfigError(f"unknown layout axis {axis!r}; choose from {', '.join(AXES)}, micro_batch")
            if value < 1:
                raise ConfigError(f"--{axis.replace('_', '-')} must be at least 1, got {value}")

    @property
    def usable_memory(self) -> float:
        return self.cluster.gpu.memory_bytes * (1 - self.memory_headroom)

    @property
    def peak_flops(self) -> float:
        return self.cluster.peak_flops(self.precision)


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    memory: Memory
    comm: dict[str, AxisComm]
    time: StepTime
    fits: bool


def evaluate(request: PlanRequest, layout: Layout) -> Candidate:
    """One layout's memory, communication and step time."""
    memory = memory_per_gpu(request.shape, layout, request.seq_len, request.state, request.flash_attention)
    comm = communication(request.shape, layout, request.seq_len, request.state, request.cluster, request.precision)
    time = step_time(
        request.shape,
        layout,
        request.seq_len,
        request.global_batch,
        request.peak_flops,
        comm,
        request.fixed_mfu,
        request.attention_flops,
    )
    return Candidate(layout, memory, comm, time, memory.total <= request.usable_memory)


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _allowed(request: PlanRequest, axis: str, values: list[int]) -> list[int]:
    pinned = request.pinned.get(axis)
    return values if pinned is None else [v for v in values if v == pinned]


def _layout_axes(request: PlanRequest):
    """(tp, pp, cp, dp_replicate, dp_shard, ep) tuples the model and cluster allow."""
    shape, cluster = request.shape, request.cluster
    tps = [
        t
        for t in _powers_of_two(cluster.gpus_per_node)
        if cluster.gpus_per_node % t == 0 and shape.heads % t == 0 and shape.kv_heads % t == 0
    ]
    # What the trainer refuses is not searched: a pipeline with tied embeddings or MoE layers
    # (lmforge.trainer.pipeline.validate_pipeline), context parallelism with MoE layers.
    pipeline_ok = not (shape.tied or shape.is_moe)
    pps = [p for p in _divisors(cluster.nodes) if shape.layers % p == 0 and (p == 1 or pipeline_ok)]
    cps = [c for c in _powers_of_two(MAX_CP) if c == 1 or (request.seq_len % (2 * c) == 0 and not shape.is_moe)]
    for tp, pp, cp in itertools.product(
        *(_allowed(request, axis, values) for axis, values in (("tp", tps), ("pp", pps), ("cp", cps)))
    ):
        if cluster.gpus % (tp * pp * cp):
            continue
        dp = cluster.gpus // (tp * pp * cp)
        for shard in _allowed(request, "dp_shard", _divisors(dp)):
            replicate = dp // shard
            if request.pinned.get("dp_replicate", replicate) != replicate:
                continue
            eps = [e for e in _divisors(shape.experts) if (shard * cp) % e == 0] if shape.is_moe else [1]
            for ep in _allowed(request, "ep", eps):
                yield tp, pp, cp, replicate, shard, ep


def _micro_batches(request: PlanRequest, dp: int, pp: int) -> list[tuple[int, int]]:
    """(micro-batch size, micro-batches per step) that split a rank's share of the global batch."""
    if request.global_batch % dp:
        return []
    per_rank = request.global_batch // dp
    sizes = _allowed(request, "micro_batch", [b for b in _powers_of_two(MAX_MICRO_BATCH) if per_rank % b == 0])
    return [(b, per_rank // b) for b in sizes if per_rank // b >= pp]


def search(request: PlanRequest) -> tuple[list[Candidate], int]:
    """Every candidate (best micro-batch each), fitting ones first by predicted step time, then
    the others by memory; and how many layouts were evaluated in all."""
    checkpointing = {"auto": (False, True), "on": (True,), "off": (False,)}[request.activation_checkpointing]
    kept: list[Candidate] = []
    evaluated = 0
    for (tp, pp, cp, replicate, shard, ep), ac in itertools.product(_layout_axes(request), checkpointing):
        options = [
            evaluate(request, Layout(replicate, shard, tp, pp, cp, ep, b, m, ac))
            for b, m in _micro_batches(request, replicate * shard, pp)
        ]
        evaluated += len(options)
        fitting = [c for c in options if c.fits]
        if fitting:
            kept.append(min(fitting, key=lambda c: c.time.step_seconds))
        elif options:
            kept.append(min(options, key=lambda c: c.memory.total))
    if not kept:
        raise ConfigError(_no_layout_message(request))
    kept.sort(key=lambda c: (not c.fits, c.time.step_seconds if c.fits else c.memory.total))
    return kept, evaluated


def _no_layout_message(request: PlanRequest) -> str:
    cluster = request.cluster
    pins = ", ".join(f"{axis}={value}" for axis, value in request.pinned.items())
    return (
        f"no layout of {cluster.nodes} × {cluster.gpus_per_node} GPUs divides this model and batch"
        + (f" with {pins}" if pins else "")
        + f": TP must divide the GPUs per node and the heads ({request.shape.heads}) and KV heads "
        f"({request.shape.kv_heads}), PP the nodes and the layers ({request.shape.layers}), and the data-parallel "
        f"ranks the global batch ({request.global_batch} sequences)"
    )
