"""The candidate layouts of a plan, each evaluated, and the recommendation: the fastest
predicted step among the layouts that fit in memory.

The search space: TP ∈ {1, 2, 4, 8, …} dividing the GPUs per node (TP stays inside a node); PP
dividing the node count (PP goes across nodes); CP a power of two up to 16; every split of the
remaining data-parallel ranks into dp_replicate × dp_shard (DDP, HSDP, FSDP); EP (MoE only)
dividing the expert count; micro-batches of a power of two sequences dividing a rank's share of
the global batch; activation checkpointing off and on. A pinned axis takes its value only.
Of these, a candidate is a layout the trainer runs: lmforge.trainer.layout_rules.layout_problems,
the trainer's own start check, finds nothing wrong with it for this model, sequence length, world
size and precision (fp8 is float8 training). So no candidate is one the trainer refuses, and when
the pins leave none, the plan is refused with the trainer's message. For each (axes, activation
checkpointing) the micro-batch size that gives the fastest step that fits is kept, or, when none
fits, the one that needs the least memory.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field, replace

from lmforge.common.errors import ConfigError
from lmforge.trainer.layout_rules import ModelDims, layout_problems
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
        precision=request.precision,
    )
    return Candidate(layout, memory, comm, time, memory.total <= request.usable_memory)


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _searched(request: PlanRequest, axis: str, values: list[int], placed=lambda value: True) -> list[int]:
    """The values searched on an axis: its pinned value (when `placed` allows it), or `values`."""
    pinned = request.pinned.get(axis)
    if pinned is None:
        return values
    return [pinned] if placed(pinned) else []


def _layout_axes(request: PlanRequest):
    """(tp, pp, cp, dp_replicate, dp_shard, ep) tuples of the search space that fill the cluster."""
    shape, cluster = request.shape, request.cluster
    per_node = cluster.gpus_per_node
    tps = _searched(request, "tp", [t for t in _powers_of_two(per_node) if per_node % t == 0],
                    lambda t: per_node % t == 0)
    pps = _searched(request, "pp", _divisors(cluster.nodes), lambda p: cluster.nodes % p == 0)
    cps = _searched(request, "cp", _powers_of_two(MAX_CP))
    eps = _searched(request, "ep", _divisors(shape.experts) if shape.is_moe else [1])
    for tp, pp, cp in itertools.product(tps, pps, cps):
        if cluster.gpus % (tp * pp * cp):
            continue
        dp = cluster.gpus // (tp * pp * cp)
        for shard in [d for d in _searched(request, "dp_shard", _divisors(dp)) if dp % d == 0]:
            replicate = dp // shard
            if request.pinned.get("dp_replicate", replicate) != replicate:
                continue
            for ep in eps:
                yield tp, pp, cp, replicate, shard, ep


def _micro_batches(request: PlanRequest, dp: int) -> list[tuple[int, int]]:
    """(micro-batch size, micro-batches per step) that split a rank's share of the global batch."""
    if request.global_batch % dp:
        return []
    per_rank = request.global_batch // dp
    sizes = _searched(request, "micro_batch", [b for b in _powers_of_two(MAX_MICRO_BATCH) if per_rank % b == 0],
                      lambda b: per_rank % b == 0)
    return [(b, per_rank // b) for b in sizes]


def model_dims(shape: ModelShape) -> ModelDims:
    """What the layout rules check of the model: ModelDims.of(the config the shape was read from)."""
    return ModelDims(heads=shape.heads, kv_heads=shape.kv_heads, ffn_hidden=shape.ffn_hidden, vocab=shape.vocab,
                     layers=shape.layers, experts=shape.experts, tied=shape.tied)


def trainer_problems(request: PlanRequest, layout: Layout) -> list[str]:
    """Why the trainer would refuse to run this layout for the plan's model (empty: it runs it): its own
    start check, with the planner's pipeline schedule (1F1B) and fp8 as float8 training."""
    return layout_problems(layout, model_dims(request.shape), request.seq_len, request.cluster.gpus,
                           float8=request.precision == "fp8")


def search(request: PlanRequest) -> tuple[list[Candidate], int]:
    """Every candidate (best micro-batch each), fitting ones first by predicted step time, then
    the others by memory; and how many layouts were evaluated in all. ConfigError when none is left:
    with the trainer's message when the layouts the pins leave are all ones the trainer refuses."""
    checkpointing = {"auto": (False, True), "on": (True,), "off": (False,)}[request.activation_checkpointing]
    kept: list[Candidate] = []
    evaluated = 0
    refusals: Counter[str] = Counter()  # the trainer's problems with the layouts left out
    for tp, pp, cp, replicate, shard, ep in _layout_axes(request):
        runnable = []
        for micro_batch, microbatches in _micro_batches(request, replicate * shard):
            layout = Layout(replicate, shard, tp, pp, cp, ep, micro_batch=micro_batch, microbatches=microbatches)
            problems = trainer_problems(request, layout)
            refusals.update(problems)
            if not problems:
                runnable.append(layout)
        for ac in checkpointing:
            options = [evaluate(request, replace(layout, activation_checkpointing=ac)) for layout in runnable]
            evaluated += len(options)
            fitting = [c for c in options if c.fits]
            if fitting:
                kept.append(min(fitting, key=lambda c: c.time.step_seconds))
            elif options:
                kept.append(min(options, key=lambda c: c.memory.total))
    if not kept:
        raise ConfigError(_no_layout_message(request, refusals))
    kept.sort(key=lambda c: (not c.fits, c.time.step_seconds if c.fits else c.memory.total))
    return kept, evaluated


def _no_layout_message(request: PlanRequest, refusals: Counter[str]) -> str:
    """For a pinned axis the trainer refuses, the trainer's refusal of it (the one the most of the layouts the
    pins leave share: every one's); else what a layout must divide, and the trainer's most common refusal."""
    naming_a_pin = Counter({problem: count for problem, count in refusals.items()
                            if any(f"parallel.{axis}=" in problem or f"parallel.{axis}:" in problem
                                   for axis in request.pinned)})
    if naming_a_pin:
        return naming_a_pin.most_common(1)[0][0]
    refusal = refusals.most_common(1)[0][0] if refusals else None
    cluster = request.cluster
    pins = ", ".join(f"{axis}={value}" for axis, value in request.pinned.items())
    return (
        f"no layout of {cluster.nodes} × {cluster.gpus_per_node} GPUs divides this model and batch"
        + (f" with {pins}" if pins else "")
        + f": TP must divide the GPUs per node, PP the nodes, and the data-parallel ranks the global batch "
        f"({request.global_batch} sequences)"
        + (f"; the trainer refuses the layouts that do ({refusal})" if refusal else "")
    )
