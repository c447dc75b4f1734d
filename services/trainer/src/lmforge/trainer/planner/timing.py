"""Predicted step time and MFU of a layout.

    compute   = tokens per data-parallel rank per step × FLOPs per token of the slowest pipeline
                stage (its layers, the output head on the last; one more forward of its layers
                under activation checkpointing) / (tp · cp · peak · efficiency)
    bubble    = compute · (P − 1)/M  (1F1B)
    step      = compute + bubble + the critical-path communication (TP, CP, PP, EP)
                + whatever FSDP/HSDP traffic the compute it overlaps cannot hide
                  (without PP it overlaps every micro-batch's compute; under PP only the first
                  forward's and the last backward's, about compute/M)
    MFU       = model FLOPs per step (lmforge.common.model.flops_per_token: 6·N + attention, no
                recomputation) / (GPUs · peak · step)

`efficiency` is the share of peak FLOP/s the model's kernels reach when nothing waits on
communication: matmuls reach 70-80 % of dense peak on Hopper, attention and the element-wise
work less, and published large runs land at 38-43 % MFU with communication included (Llama 3,
Dubey et al. 2024, Table 4: 16K H100s). The planner's range is EFFICIENCY's low and high; the
point estimate its middle. A measured MFU (--mfu) replaces the model: step = FLOPs / (GPUs ·
peak · MFU).
"""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.trainer.planner.comm import AxisComm
from lmforge.trainer.planner.layout import Layout
from lmforge.trainer.planner.shape import ModelShape

EFFICIENCY = {"low": 0.5, "mid": 0.6, "high": 0.7}


@dataclass(frozen=True)
class StepTime:
    compute_seconds: float
    bubble_seconds: float
    exposed_comm_seconds: float  # critical-path collectives
    unhidden_overlap_seconds: float  # FSDP/HSDP traffic longer than the compute it overlaps
    step_seconds: float
    step_seconds_range: tuple[float, float]  # at high and low efficiency
    mfu: float
    mfu_range: tuple[float, float]


def model_flops_per_step(shape: ModelShape, seq_len: int, global_batch: int, attention: bool = True) -> float:
    """6·N per token plus attention's (the MFU convention), or 6·N alone (the 6·N·D one)."""
    per_token = shape.flops_per_token(seq_len) if attention else shape.six_n_flops_per_token()
    return global_batch * seq_len * per_token


def stage_flops_per_token(shape: ModelShape, layout: Layout, seq_len: int) -> float:
    """Hardware FLOPs per token of the slowest stage (the last: it has the output head)."""
    layers = shape.layers // layout.pp
    per_layer = shape.layer_flops_per_token(seq_len) * (4 / 3 if layout.activation_checkpointing else 1)
    return layers * per_layer + shape.head_flops_per_token()


def step_time(
    shape: ModelShape,
    layout: Layout,
    seq_len: int,
    global_batch: int,
    peak_flops: float,
    comm: dict[str, AxisComm],
    fixed_mfu: float | None = None,
    attention_flops: bool = True,
) -> StepTime:
    model_flops = model_flops_per_step(shape, seq_len, global_batch, attention_flops)
    if fixed_mfu is not None:
        step = model_flops / (layout.gpus * peak_flops * fixed_mfu)
        return StepTime(step, 0.0, 0.0, 0.0, step, (step, step), fixed_mfu, (fixed_mfu, fixed_mfu))

    tokens_per_rank = global_batch // layout.dp * seq_len
    work = tokens_per_rank * stage_flops_per_token(shape, layout, seq_len) / (layout.tp * layout.cp * peak_flops)
    exposed = sum(c.seconds for c in comm.values() if not c.overlapped)
    overlapped = sum(c.seconds for c in comm.values() if c.overlapped)

    def at(efficiency: float) -> tuple[float, float, float, float]:
        compute = work / efficiency
        window = compute if layout.pp == 1 else compute / layout.microbatches
        unhidden = max(0.0, overlapped - window)
        bubble = compute * layout.pipeline_bubble
        return compute, bubble, unhidden, compute + bubble + exposed + unhidden

    compute, bubble, unhidden, step = at(EFFICIENCY["mid"])
    fast, slow = at(EFFICIENCY["high"])[3], at(EFFICIENCY["low"])[3]

    def mfu(seconds: float) -> float:
        return model_flops / (layout.gpus * peak_flops * seconds)

    return StepTime(compute, bubble, exposed, unhidden, step, (fast, slow), mfu(step), (mfu(slow), mfu(fast)))
