"""Bytes each GPU sends per step on each axis of a layout, and the time at the cluster's links.

Ring collectives over n ranks send (n − 1)/n of the full tensor per GPU for an all-gather or a
reduce-scatter, twice that for an all-reduce; an all-to-all sends the (n − 1)/n of its buffer
bound for other ranks. Per step:

  fsdp          parameters all-gathered (bf16; 1 byte with FP8's float8 all-gather) for the
                forward and again for the backward, gradients reduce-scattered (reduce_dtype),
                on every micro-batch (FSDP2 re-gathers per micro-batch and syncs each one; the
                trainer does not defer the sync). Under PP, once per step: the stage stays
                unsharded across micro-batches and syncs on the last. Overlaps with compute.
  dp_replicate  HSDP's all-reduce of the reduce-scattered gradient shard across replicas, as
                often as fsdp syncs. Overlaps with compute.
  tp            Megatron's sequence-parallel layer: an all-gather before and a reduce-scatter
                after attention and the MLP, forward and backward (8 per layer; the forward's 4
                again when activation checkpointing recomputes it) of s/c·b·h bf16 activations.
                On the critical path (no async TP assumed).
  cp            all-gather of K and V (full sequence) per layer forward (again when recomputed),
                reduce-scatter of their gradients backward. On the critical path.
  pp            the activation forward and its gradient backward at each stage boundary, per
                micro-batch (s/c·b·h/t bf16: sequence-parallel). On the critical path.
  ep            MoE dispatch and combine all-to-alls, forward and backward (and the recomputed
                forward), of top_k·capacity_factor copies of each token. On the critical path.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.trainer.planner.hardware import Cluster
from lmforge.trainer.planner.layout import Layout
from lmforge.trainer.planner.memory import ACTIVATION_BYTES, StateConfig, stage_params
from lmforge.trainer.planner.shape import ModelShape


@dataclass(frozen=True)
class AxisComm:
    collective: str
    bytes: float  # sent per GPU per step
    inside_node: bool
    seconds: float
    overlapped: bool  # runs behind compute (FSDP prefetch / async reduce) rather than on the critical path


def _ring(n: int) -> float:
    return (n - 1) / n


def communication(
    shape: ModelShape, layout: Layout, seq_len: int, state: StateConfig, cluster: Cluster, precision: str
) -> dict[str, AxisComm]:
    """Per axis with a degree above 1 (fsdp counts dp_shard × cp)."""
    inside = layout.inside_node(cluster.gpus_per_node)
    out: dict[str, AxisComm] = {}

    def add(axis: str, collective: str, volume: float, overlapped: bool) -> None:
        seconds = volume / cluster.link_bytes_per_s(inside[axis])
        out[axis] = AxisComm(collective, volume, inside[axis], seconds, overlapped)

    micro = layout.microbatches
    syncs = 1 if layout.pp > 1 else micro
    gathers = 1 if layout.pp > 1 else 2 * micro
    layers = shape.layers // layout.pp
    local_tokens = seq_len // layout.cp * layout.micro_batch
    activation = local_tokens * shape.dim * ACTIVATION_BYTES  # one full (unsharded) layer activation
    recompute = layout.activation_checkpointing

    stages = ("only",) if layout.pp == 1 else ("first", "last")
    dense, experts = max((stage_params(shape, layout, stage) for stage in stages), key=sum)
    if layout.fsdp > 1:
        expert_group = layout.fsdp // layout.ep
        shard_traffic = dense * _ring(layout.fsdp) + (experts * _ring(expert_group) if expert_group > 1 else 0)
        gather_bytes = 1 if precision == "fp8" else ACTIVATION_BYTES
        volume = shard_traffic * (gathers * gather_bytes + syncs * state.reduce_bytes)
        add("fsdp", "all-gather + reduce-scatter", volume, overlapped=True)
    if layout.dp_replicate > 1:
        shard = (dense + experts * layout.ep) / layout.fsdp
        volume = syncs * 2 * _ring(layout.dp_replicate) * shard * state.reduce_bytes
        add("dp_replicate", "all-reduce", volume, overlapped=True)
    if layout.tp > 1:
        collectives = 8 + (4 if recompute else 0)
        add(
            "tp",
            "all-gather + reduce-scatter",
            layers * micro * collectives * _ring(layout.tp) * activation,
            overlapped=False,
        )
    if layout.cp > 1:
        kv = seq_len * layout.micro_batch * 2 * shape.kv_heads * shape.head_dim * ACTIVATION_BYTES / layout.tp
        collectives = 2 + (1 if recompute else 0)
        add("cp", "all-gather + reduce-scatter", layers * micro * collectives * _ring(layout.cp) * kv, overlapped=False)
    if layout.pp > 1:
        add("pp", "send/recv", micro * 2 * activation / layout.tp, overlapped=False)
    if layout.ep > 1 and shape.is_moe:
        routed = activation / layout.tp * shape.top_k * shape.capacity_factor
        collectives = 4 + (2 if recompute else 0)
        add("ep", "all-to-all", layers * micro * collectives * _ring(layout.ep) * routed, overlapped=False)
    return out
