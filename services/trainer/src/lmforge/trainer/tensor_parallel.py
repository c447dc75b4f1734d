"""Tensor and sequence parallelism (Megatron-style, on DTensor) applied to a built GPT, as
torchtitan's parallelize step does before activation checkpointing, compile and FSDP.

Inside each block the attention's query/key/value and the MLP's gate/up (or fc) are
column-parallel (each rank holds some heads, some hidden units) and attn.proj / mlp.proj
row-parallel; between them the residual stream is split along the sequence (sequence
parallelism: the norms, dropout and residual adds run on a rank's T/tp tokens). The embedding
is row-parallel over the vocabulary and hands on a sequence shard; the output head is
column-parallel over the vocabulary and its logits stay sharded: the model's cross-entropy runs
under torch's loss_parallel (loss_context), which never gathers (B, T, vocab).
A tied head shares the embedding's DTensor (both shard the vocabulary rows).
What tp must divide (heads, kv heads, MLP, vocabulary, sequence; not the MoE layers) is
lmforge.trainer.layout_rules's.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from lmforge.model.transformer import GPT


def loss_context(tp: int) -> AbstractContextManager:
    """Around the forward and backward of a tensor-parallel model: cross-entropy on vocabulary-sharded logits."""
    if tp == 1:
        return nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def replicated_value(loss: torch.Tensor) -> torch.Tensor:
    """The loss as a plain tensor (under tp a replicated DTensor, the same on every tp rank)."""
    from torch.distributed.tensor import DTensor

    return loss.full_tensor() if isinstance(loss, DTensor) else loss


def apply_tensor_parallel(model: GPT, tp_mesh: DeviceMesh) -> None:
    """Shards the model's parameters over `tp_mesh` in place (DTensors), with sequence parallelism.
    `model` may be a pipeline chunk: the embedding, final norm and head only where it holds them,
    its hidden states handed on as sequence shards."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tied = model.lm_head is not None and model.wte is not None and model.lm_head.weight is model.wte.weight
    top = {
        "wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        # learned positions (T, C), or (B, T, C) under cp: the same sequence shard as the tokens'
        "wpe": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-2)),
        "ln_f": SequenceParallel(),
        # the logits stay sharded by vocabulary: loss_context's cross-entropy never gathers them
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    }
    top = {name: style for name, style in top.items() if getattr(model, name) is not None}
    if top:
        parallelize_module(model, tp_mesh, top)
    if tied:  # the head and the embedding are one (vocab, C) tensor, both sharded by vocabulary rows
        model.lm_head.weight = model.wte.weight
    for name in ("wte", "wpe"):
        if getattr(model, name) is not None:
            _keep_gradient_sharded(getattr(model, name).weight)
    for block in model.blocks.children():  # a GPT's list or a pipeline chunk's dict
        mlp: nn.Module = block.mlp
        columns = ("gate", "up") if hasattr(mlp, "gate") else ("fc",)
        plan = {
            "ln_1": SequenceParallel(),
            "attn.query": ColwiseParallel(),
            "attn.key": ColwiseParallel(),
            "attn.value": ColwiseParallel(),
            "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
            "ln_2": SequenceParallel(),
            **{f"mlp.{name}": ColwiseParallel() for name in columns},
            "mlp.proj": RowwiseParallel(output_layouts=Shard(1)),
        }
        parallelize_module(block, tp_mesh, plan)
        for module in (block.attn, block.mlp):
            module.register_forward_pre_hook(_whole_sequence(tp_mesh))


def _keep_gradient_sharded(weight: nn.Parameter) -> None:
    """DTensor's embedding backward returns the row-sharded table's gradient replicated (whole, on
    every tp rank); sliced back to the weight's own shard as it arrives (no communication), the
    accumulated gradient and the optimizer's view of it stay 1/tp the size. FSDP replaces the
    parameter (and this hook) with its own and reduce-scatters instead."""

    def as_placed(grad: torch.Tensor) -> torch.Tensor:
        if grad.placements == weight.placements:
            return grad
        return grad.redistribute(weight.device_mesh, weight.placements)

    weight.register_hook(as_placed)


def _whole_sequence(tp_mesh: DeviceMesh):
    """A pre-hook that all-gathers the first input's sequence shards (torchtitan's PrepareModuleInput
    for x alone: the attention's rope and positions pass as they are). It hands on a DTensor, so the
    column-parallel projections' input gradients are summed once, by the gather's backward."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    def hook(_module: nn.Module, args: tuple):
        x = args[0]
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, tp_mesh, (Shard(1),), run_check=False)
        return (x.redistribute(tp_mesh, (Replicate(),)), *args[1:])

    return hook
