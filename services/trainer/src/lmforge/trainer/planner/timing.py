"""Predicted step time and MFU of a layout.

    compute   = tokens per data-parallel rank per step × seconds per token of the slowest pipeline
                stage (its layers, the output head on the last; one more forward of its layers
                under activation checkpointing), where a token's FLOPs run at
                  (linear FLOPs / float8_speedup(w) + attention and head FLOPs)
                  / (tp · cp · bf16 peak · efficiency(w))
                and w is the block's matmul width (efficiency.py; float8_speedup only at fp8)
    bubble    = compute · (P − 1)/M  (1F1B)
    step      = compute + bubble + the critical-path communication (TP, CP, PP, EP)
                + whatever FSDP/HSDP traffic the compute it overlaps cannot hide
                  (without PP it overlaps every micro-batch's compute; under PP only the first
                  forward's and the last backward's, about compute/M)
    MFU       = model FLOPs per step (lmforge.model.transformer.flops_per_token: 6·N + attention, no
                recomputation) / (GPUs · peak of the plan's precision · step)

`efficiency(w)` is the share of the dense bf16 peak the kernels reach when nothing waits on
communication, fitted to measured runs (calibration.json: H200 runs of our trainer, torchtitan's
published Llama 3.1 70B runs); the range scales it by the fit's band, the smallest and largest
measured / predicted ratio over those runs. At fp8 the linear layers' matmuls run Float8 (the head,
attention and element-wise work stay bf16, as the trainer does it) and the bf16 peak is the plan's
peak over FP8_OVER_BF16. A measured MFU (--mfu) replaces the model: step = FLOPs / (GPUs · peak · MFU).
"""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.trainer.planner.comm import AxisComm
from lmforge.trainer.planner.efficiency import KernelEfficiency, calibrated
from lmforge.trainer.planner.layout import Layout
from lmforge.trainer.planner.shape import ModelShape

FP8_OVER_BF16 = 2.0  # every FP8-capable GPU in hardware.GPUS: its dense FP8 peak is twice its bf16 peak
RECOMPUTE = 4 / 3  # full activation checkpointing: one more forward (a third of forward + backward)


@dataclass(frozen=True)
class StepTime:
    compute_seconds: float
    bubble_seconds: float
    exposed_comm_seconds: float  # critical-path collectives
    unhidden_overlap_seconds: float  # FSDP/HSDP traffic longer than the compute it overlaps
    step_seconds: float
    step_seconds_range: tuple[float, float]  # at the band's high and low efficiency
    mfu: float
    mfu_range: tuple[float, float]


def model_flops_per_step(shape: ModelShape, seq_len: int, global_batch: int, attention: bool = True) -> float:
    """6·N per token plus attention's (the MFU convention), or 6·N alone (the 6·N·D one)."""
    per_token = shape.flops_per_token(seq_len) if attention else shape.six_n_flops_per_token()
    return global_batch * seq_len * per_token


def stage_flops_per_token(shape: ModelShape, layout: Layout, seq_len: int) -> float:
    """Hardware FLOPs per token of the slowest stage (the last: it has the output head)."""
    layers = shape.layers // layout.pp
    per_layer = shape.layer_flops_per_token(seq_len) * (RECOMPUTE if layout.activation_checkpointing else 1)
    return layers * per_layer + shape.head_flops_per_token()


def stage_seconds_per_token(
    shape: ModelShape, layout: Layout, seq_len: int, peak_flops: float, precision: str, efficiency: KernelEfficiency
) -> float:
    """Seconds the slowest stage's GPUs spend on one token of their data-parallel rank: its FLOPs
    (stage_flops_per_token's, the linears' divided by Float8's speed-up at fp8) at the kernel
    efficiency of the model's matmul width."""
    recompute = RECOMPUTE if layout.activation_checkpointing else 1
    layers = shape.layers // layout.pp
    linear = layers * 6 * shape.layer_matmul_params * recompute
    other = layers * (shape.layer_flops_per_token(seq_len) - 6 * shape.layer_matmul_params) * recompute
    other += shape.head_flops_per_token()
    bf16_peak = peak_flops
    if precision == "fp8":
        bf16_peak = peak_flops / FP8_OVER_BF16
        linear /= efficiency.float8_speedup(shape.matmul_width, FP8_OVER_BF16)
    return (linear + other) / (layout.tp * layout.cp * bf16_peak * efficiency.at(shape.matmul_width))


def step_time(
    shape: ModelShape,
    layout: Layout,
    seq_len: int,
    global_batch: int,
    peak_flops: float,
    comm: dict[str, AxisComm],
    fixed_mfu: float | None = None,
    attention_flops: bool = True,
    precision: str = "bf16",
    efficiency: KernelEfficiency | None = None,
) -> StepTime:
    """`peak_flops` is the plan's precision's; `efficiency` defaults to the calibrated one."""
    model_flops = model_flops_per_step(shape, seq_len, global_batch, attention_flops)
    if fixed_mfu is not None:
        step = model_flops / (layout.gpus * peak_flops * fixed_mfu)
        return StepTime(step, 0.0, 0.0, 0.0, step, (step, step), fixed_mfu, (fixed_mfu, fixed_mfu))

    efficiency = efficiency or calibrated()
    tokens_per_rank = global_batch // layout.dp * seq_len
    work = tokens_per_rank * stage_seconds_per_token(shape, layout, seq_len, peak_flops, precision, efficiency)
    exposed = sum(c.seconds for c in comm.values() if not c.overlapped)
    overlapped = sum(c.seconds for c in comm.values() if c.overlapped)

    def at(scale: float) -> tuple[float, float, float, float]:
        compute = work / scale
        window = compute if layout.pp == 1 else compute / layout.microbatches
        unhidden = max(0.0, overlapped - window)
        bubble = compute * layout.pipeline_bubble
        return compute, bubble, unhidden, compute + bubble + exposed + unhidden

    compute, bubble, unhidden, step = at(1.0)
    low, high = efficiency.band
    fast, slow = at(high)[3], at(low)[3]

    def mfu(seconds: float) -> float:
        return model_flops / (layout.gpus * peak_flops * seconds)

    return StepTime(compute, bubble, exposed, unhidden, step, (fast, slow), mfu(step), (mfu(slow), mfu(fast)))
