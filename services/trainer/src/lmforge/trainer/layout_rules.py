"""The rulebook of parallel layouts: the one layout type the trainer and the planner share
(`MeshLayout`) and `layout_problems`, the one answer to "does the trainer run this layout for this
model, sequence length and world size?".

The trainer's start checks (lmforge.trainer.train and mesh_layout, before any process group), the
guards of its runtime code (a pipeline split, context or expert parallelism applied to a built
model) and the planner's search (lmforge.trainer.planner.search) all ask it, so the planner never
offers a layout the trainer refuses, and a refusal reads the same wherever it comes from: one line
naming the axis, each message written here and nowhere else. No torch: the planner runs without it.

The mesh: dp_replicate × dp_shard × tp × pp × cp ranks are the world size; ep borrows its ranks from
dp_shard (an ep group is consecutive dp_shard ranks) and adds none. The DeviceMesh's axes are in
MESH_ORDER, torchtitan's: pp outermost, tp innermost (a tp group is consecutive ranks, inside a node).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lmforge.common.errors import ConfigError

if TYPE_CHECKING:
    from lmforge.model.config import GPTConfig

MESH_AXES = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep")
WORLD_AXES = ("dp_replicate", "dp_shard", "tp", "pp", "cp")  # their product is the world size
MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")  # the DeviceMesh's dimensions, outermost first
PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
INTERLEAVED_SCHEDULES = ("interleaved_1f1b",)


def wrapper_mode(degrees: Mapping[str, int]) -> str:
    """The data-parallel wrapper the degrees call for: ddp when only dp_replicate > 1, fsdp when
    dp_shard > 1, hsdp when both; cp > 1 counts as dp_shard's (FSDP shards over dp_shard × cp, whose
    reduce-scatter sums the cp ranks' gradients)."""
    replicate, shard = degrees["dp_replicate"] > 1, degrees["dp_shard"] > 1 or degrees["cp"] > 1
    if shard:
        return "hsdp" if replicate else "fsdp"
    return "ddp" if replicate else "none"


@dataclass(frozen=True)
class MeshLayout:
    """A parallel layout: the mesh axes' degrees, how a step's batch is cut into micro-batches,
    activation checkpointing, and the data-parallel wrapper (none, ddp, fsdp, hsdp; left out: the
    one the degrees call for)."""

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    micro_batch: int = 1  # sequences per data-parallel rank per micro-batch
    microbatches: int = 1  # per step: the pipeline's micro-batches, or gradient-accumulation steps without PP
    activation_checkpointing: bool = False
    mode: str = ""

    def __post_init__(self):
        if not self.mode:
            object.__setattr__(self, "mode", wrapper_mode(self.axes()))

    @property
    def world_size(self) -> int:
        return math.prod(getattr(self, axis) for axis in WORLD_AXES)

    @property
    def gpus(self) -> int:
        """The world size: one GPU per rank."""
        return self.world_size

    @property
    def dp(self) -> int:
        """Data-parallel ranks: each takes its own sequences."""
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp(self) -> int:
        """Ranks one parameter shard is spread over: dp_shard × cp (context-parallel ranks hold the
        same parameters, so FSDP shards over them too, as in torchtitan)."""
        return self.dp_shard * self.cp

    @property
    def pipeline_bubble(self) -> float:
        """1F1B's idle fraction relative to the ideal time, (P − 1)/M (Narayanan et al. 2021)."""
        return (self.pp - 1) / self.microbatches

    def axes(self) -> dict[str, int]:
        return {axis: getattr(self, axis) for axis in MESH_AXES}

    def spans(self) -> dict[str, int]:
        """Consecutive ranks each axis's groups reach across (their degree times the degrees inside
        it in MESH_ORDER); ep's groups are the innermost ep of the dp_shard ranks."""
        tp_cp = self.tp * self.cp
        return {
            "tp": self.tp,
            "cp": tp_cp,
            "ep": self.tp * self.ep,
            "fsdp": tp_cp * self.dp_shard,
            "dp_replicate": tp_cp * self.dp,
            "pp": self.gpus,
        }

    def inside_node(self, gpus_per_node: int) -> dict[str, bool]:
        """Per axis: True when its groups fit in one node (its collectives stay on NVLink)."""
        return {axis: span <= gpus_per_node for axis, span in self.spans().items()}

    def describe(self) -> str:
        parts = [f"{axis}={value}" for axis, value in self.axes().items() if value > 1] or ["single GPU"]
        return (
            " ".join(parts)
            + f", micro-batch {self.micro_batch} × {self.microbatches}"
            + (", AC" if self.activation_checkpointing else "")
        )


@dataclass(frozen=True)
class ModelDims:
    """What of a model the layout splits: the heads, the MLP and the vocabulary over tp, the layers
    over pp, the experts over ep."""

    heads: int
    kv_heads: int
    ffn_hidden: int  # the MLP's hidden size (each expert's in an MoE model)
    vocab: int | None  # None: not known yet (the data's tokenizer sets it)
    layers: int
    experts: int  # routed experts per layer; 0: a dense model
    tied: bool  # the output head shares the token embedding

    @classmethod
    def of(cls, config: GPTConfig, *, vocabulary: bool = True) -> ModelDims:
        """The model config's; vocabulary=False leaves the vocabulary out (before the data's tokenizer sets it)."""
        moe = config.moe
        return cls(
            heads=config.n_head,
            kv_heads=config.kv_heads,
            ffn_hidden=(moe.expert_hidden or config.ffn_hidden_size) if moe else config.ffn_hidden_size,
            vocab=config.vocab_size if vocabulary else None,
            layers=config.n_layer,
            experts=moe.num_experts if moe else 0,
            tied=config.tie_embeddings,
        )

    @property
    def is_moe(self) -> bool:
        return self.experts > 0


def layout_problems(layout: MeshLayout, model: ModelDims | None, seq_len: int | None, world_size: int, *,
                    pp_schedule: str = "1f1b", pp_virtual_stages: int = 1, compiled: bool = False,
                    float8: bool = False) -> list[str]:
    """Why the trainer does not run `layout` (empty: it does), each problem one line naming the axis.
    model or seq_len None: not known yet, the rules that need them are left out. pp_schedule,
    pp_virtual_stages, compiled (parallel.compile) and float8 (float8.enabled) are the run's options
    the layout must go with."""
    return [
        *world_size_problems(layout, world_size),
        *wrapper_problems(layout, world_size),
        *tensor_parallel_problems(layout.tp, model, seq_len),
        *context_parallel_problems(layout.cp, layout.tp, seq_len, model),
        *expert_parallel_problems(layout.ep, None if model is None else model.experts, layout.dp_shard),
        *pipeline_problems(layout.pp, layout.microbatches, model, pp_schedule, pp_virtual_stages, compiled),
        *float8_layout_problems(layout.tp, float8),
    ]


def refuse(problems: list[str]) -> None:
    """ConfigError with the first problem (one line, naming the axis); nothing when there is none."""
    if problems:
        raise ConfigError(problems[0])


def world_size_problems(layout: MeshLayout, world_size: int) -> list[str]:
    if layout.world_size == world_size:
        return []
    return [f"parallel: the layout's {layout.world_size} ranks (dp_replicate × dp_shard × tp × pp × cp) are not "
            f"the world size {world_size}"]


def wrapper_problems(layout: MeshLayout, world_size: int) -> list[str]:
    """The axes the data-parallel wrapper does not run with: cp needs FSDP or HSDP, tp and pp refuse DDP."""
    problems = []
    if layout.cp > 1 and layout.mode in ("none", "ddp"):
        problems.append(
            f"parallel.cp={layout.cp} with parallel.mode {layout.mode} (world size {world_size}): context "
            "parallelism runs under FSDP over dp_shard × cp, which sums the cp ranks' gradients; leave mode "
            "out or use fsdp or hsdp"
        )
    if layout.tp > 1 and layout.mode == "ddp":
        problems.append(
            f"parallel.tp={layout.tp} with DDP (dp_replicate={layout.dp_replicate}, world size {world_size}): "
            "torch's DDP takes no tensor-parallel (DTensor) parameters; use dp_shard (FSDP) or hsdp for the "
            "data-parallel axis"
        )
    if layout.pp > 1 and layout.mode == "ddp":
        problems.append(f"parallel.pp={layout.pp} with DDP (dp_replicate={layout.dp_replicate}): a pipeline stage "
                        "runs its chunk in place; use dp_shard (FSDP) or hsdp for the data-parallel axis")
    return problems


def tensor_parallel_problems(tp: int, model: ModelDims | None, seq_len: int | None) -> list[str]:
    """Tensor and sequence parallelism: tp divides the heads, the kv heads, the MLP, the vocabulary
    and the sequence; the MoE layers are not split (ep is their axis)."""
    if tp == 1:
        return []
    problems = []
    if model is not None and model.is_moe:
        problems.append(f"parallel.tp={tp}: tensor parallelism of the MoE layers is not built; use ep for them")
    elif model is not None:
        divides = [("n_head", model.heads, "whole query heads"), ("n_kv_head", model.kv_heads, "whole key/value heads"),
                   ("ffn_hidden_size", model.ffn_hidden, "an equal share of the MLP")]
        if model.vocab is not None:
            divides.append(("vocab_size", model.vocab, "an equal share of the vocabulary"))
        problems += [f"parallel.tp={tp} must divide model.{field} = {value} (each rank holds {what})"
                     for field, value, what in divides if value % tp]
    if seq_len is not None and seq_len % tp:
        problems.append(f"parallel.tp={tp} must divide data.seq_len = {seq_len} (sequence parallelism splits it)")
    return problems


def context_parallel_problems(cp: int, tp: int, seq_len: int | None, model: ModelDims | None) -> list[str]:
    """Load-balanced context parallelism: the sequence cut into 2·cp chunks, each cp rank's share split
    over tp; not with the MoE option."""
    if cp == 1:
        return []
    problems = []
    if seq_len is not None and seq_len % (2 * cp):
        problems.append(f"parallel.cp={cp}: data.seq_len = {seq_len} is not divisible by 2·cp = {2 * cp} "
                        "(load-balanced context parallelism cuts the sequence into 2·cp chunks)")
    elif seq_len is not None and (seq_len // cp) % tp:
        problems.append(f"parallel.cp={cp} × tp={tp}: each cp rank's {seq_len // cp} tokens (data.seq_len / cp) "
                        f"are not divisible by tp = {tp} (sequence parallelism splits them)")
    if model is not None and model.is_moe:
        problems.append(f"parallel.cp={cp}: context parallelism does not support the MoE option yet "
                        "(its balance losses are per-rank)")
    return problems


def expert_parallel_problems(ep: int, experts: int | None, dp_shard: int | None) -> list[str]:
    """Expert parallelism: an MoE model's experts (per layer; 0: a dense model) over ep ranks borrowed from
    dp_shard (None: not known)."""
    if ep == 1:
        return []
    if experts == 0:
        return [f"parallel.ep={ep}: expert parallelism shards a mixture-of-experts model's experts, "
                "but this model is dense (no model.moe)"]
    problems = []
    if experts is not None and experts % ep:
        problems.append(f"parallel.ep={ep} does not divide the model's num_experts={experts}: "
                        "each ep rank holds num_experts/ep experts")
    if dp_shard is not None and dp_shard % ep:
        problems.append(f"parallel.ep={ep} must divide dp_shard={dp_shard}: the trainer's ep groups "
                        "are dp_shard ranks (not context-parallel ones)")
    return problems


def pipeline_problems(pp: int, microbatches: int, model: ModelDims | None, schedule: str = "1f1b",
                      virtual_stages: int = 1, compiled: bool = False) -> list[str]:
    """A pipeline of pp stages (none when pp is 1): its schedule, the layers split into pp ×
    virtual_stages chunks, enough micro-batches to fill it; not with tied embeddings, the MoE option
    or compile."""
    if pp == 1:
        return []
    if schedule not in PIPELINE_SCHEDULES:
        return [f"parallel.pp: unknown pipeline schedule {schedule!r}; choose one of {sorted(PIPELINE_SCHEDULES)}"]
    problems = []
    if virtual_stages < 1:
        problems.append(f"parallel.pp: virtual stages per rank must be at least 1, got {virtual_stages}")
    elif schedule in INTERLEAVED_SCHEDULES and virtual_stages < 2:
        problems.append(f"parallel.pp: schedule {schedule} needs at least 2 virtual stages per rank")
    elif schedule not in INTERLEAVED_SCHEDULES and virtual_stages != 1:
        problems.append(f"parallel.pp: schedule {schedule} runs one stage per rank, not {virtual_stages}")
    if compiled:
        problems.append(f"parallel.pp={pp} with parallel.compile: compiling pipeline chunks is not built")
    if model is not None:
        chunks = pp * max(virtual_stages, 1)
        if model.layers % chunks:
            problems.append(f"parallel.pp: n_layer {model.layers} does not divide into pp {pp} x {virtual_stages} "
                            f"virtual stages = {chunks} pipeline chunks")
        if model.tied:
            problems.append(f"parallel.pp: pp {pp} needs untied embeddings (model.tie_embeddings: false); a tied "
                            "output head would live on another stage than the embedding it shares")
        if model.is_moe:
            problems.append(f"parallel.pp: pp {pp} does not run the MoE option (its auxiliary losses arise on every "
                            "stage, the pipeline backpropagates from the last stage's loss)")
    if microbatches < pp:
        problems.append(f"parallel.pp_microbatches: {microbatches} micro-batches cannot fill pp {pp} stages")
    if schedule in INTERLEAVED_SCHEDULES and microbatches % pp:
        problems.append(f"parallel.pp_microbatches: {microbatches} is not a multiple of pp {pp}, as {schedule} needs")
    return problems


def float8_layout_problems(tp: int, float8: bool) -> list[str]:
    """Float8 training (float8.enabled) with the layout; the GPU's own rule is lmforge.trainer.float8's."""
    if float8 and tp > 1:
        # torchtitan pairs float8 with its own TP plans (Float8ColwiseParallel, …); those are not wired here.
        return [f"float8.enabled with parallel.tp={tp}: float8 tensor parallelism is not wired; "
                "set parallel.tp=1 or float8.enabled=false"]
    return []
