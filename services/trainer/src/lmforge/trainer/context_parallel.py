"""Context parallelism by all-gathered keys and values (Llama 3's choice; runs on any backend).

The sequence is cut into 2·cp chunks and rank r of the cp group holds chunks r and 2·cp−1−r,
so under a causal mask every rank has the same attention work. Each rank embeds its tokens
with their global positions (RoPE or learned), projects its queries, keys and values, gathers
every rank's keys and values (only the kv heads under GQA; the gather's backward sums each
rank's key/value gradients back to their owner), and attends its queries to the whole
sequence under a mask built from global positions (and, with document masking, the whole sequence's
document ids, which every rank holds: lmforge.model.document_mask). The loss is each rank's cross-entropy sum
over the global token count, so the shares add up to the one-process mean.

This is what the trainer runs on every backend (train.Trainer, parallelize.parallelize). torch's
ring attention (torch.distributed.tensor.experimental.context_parallel) is CUDA-only and not wired.
What it refuses (a sequence the 2·cp chunks do not divide, the MoE option) is lmforge.trainer.layout_rules's.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn

from lmforge.model.config import GPTConfig
from lmforge.model.document_mask import document_attention, query_documents
from lmforge.trainer.layout_rules import ModelDims, context_parallel_problems, refuse

__all__ = [
    "ContextParallelBatch", "all_reduce_gradients", "apply_context_parallel", "context_parallel_forward",
    "context_parallel_loss", "gather_sequence", "shard_batch", "shard_sequence", "unshard_sequence",
]

IGNORE_INDEX = -100  # F.cross_entropy's default


def shard_sequence(tensor: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """Rank `rank`'s load-balanced shard: chunks rank and 2·cp−1−rank of 2·cp along `dim` (ConfigError
    when they do not divide it)."""
    refuse(context_parallel_problems(cp, 1, tensor.shape[dim], None))
    chunks = tensor.chunk(2 * cp, dim=dim)
    return torch.cat((chunks[rank], chunks[2 * cp - 1 - rank]), dim=dim)


def unshard_sequence(shards: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """The whole sequence from every rank's shard, in rank order (the inverse of shard_sequence)."""
    cp = len(shards)
    halves = [shard.chunk(2, dim=dim) for shard in shards]
    return torch.cat([halves[r][0] for r in range(cp)] + [halves[r][1] for r in reversed(range(cp))], dim=dim)


def gather_sequence(local: torch.Tensor, group: dist.ProcessGroup, dim: int = 1) -> torch.Tensor:
    """Every rank's shard gathered and put back in sequence order (not differentiable)."""
    shards = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(shards, local.contiguous(), group=group)
    return unshard_sequence(shards, dim=dim)


class ContextParallelBatch(NamedTuple):
    """One rank's shard of a batch: token ids, targets and global positions, each (B, T/cp)."""

    idx: torch.Tensor
    targets: torch.Tensor | None
    positions: torch.Tensor


def shard_batch(idx: torch.Tensor, targets: torch.Tensor | None, group: dist.ProcessGroup) -> ContextParallelBatch:
    """This rank's shard of a (B, T) batch that every rank of the cp group holds whole."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    positions = torch.arange(idx.shape[1], device=idx.device).expand(idx.shape[0], -1)
    return ContextParallelBatch(shard_sequence(idx, cp, rank),
                                None if targets is None else shard_sequence(targets, cp, rank),
                                shard_sequence(positions, cp, rank))


def _gather_heads(local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Every rank's (B, H, T/cp, D) put together in sequence order (B, H, T, D). The functional
    all-gather's backward reduce-scatters: each rank's gradient is summed back to its owner.
    (torch.distributed.nn's all_gather is not used: on gloo its backward takes group ranks for
    global ones, which fails for a cp group that is not ranks 0…cp-1, as under tp.)"""
    gathered = funcol.all_gather_single(local.contiguous(), 0, group)
    return unshard_sequence(list(gathered.chunk(dist.get_world_size(group), dim=0)), dim=2)


def all_gather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                         dropout_p: float, documents: torch.Tensor | None = None, *,
                         group: dist.ProcessGroup) -> torch.Tensor:
    """Local queries (B, H, T/cp, D) attend to every rank's keys and values (B, kv_heads, T/cp, D)
    under a causal mask of global positions (B, T/cp). The gathered keys are put back in
    sequence order, so the softmax sums in the one-process order. `documents` (B, T): the whole
    sequence's document ids; a query then attends only to keys of its own document."""
    if positions is None:
        raise ValueError("context parallel attention needs the tokens' global positions (GPT.forward(positions=…))")
    keys, values = _gather_heads(k, group), _gather_heads(v, group)
    if documents is not None:  # the keys are in sequence order: their documents are the sequence's
        return document_attention(q, keys, values, positions, query_documents(documents, positions), documents,
                                  dropout_p)
    key_positions = torch.arange(keys.shape[2], device=q.device)
    mask = positions[:, None, :, None] >= key_positions  # (B, 1, T/cp, T)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, dropout_p=dropout_p,
                                          enable_gqa=q.shape[1] != k.shape[1])


def apply_context_parallel(model: nn.Module, group: dist.ProcessGroup) -> nn.Module:
    """Make every attention layer of a built GPT (or pipeline chunk) attend across the cp group; the
    model then expects shard_batch's shards with their positions (GPT.forward(idx, positions=…))."""
    config = getattr(model, "config", None)  # (a pipeline chunk has none: the trainer checked its model at start)
    if isinstance(config, GPTConfig):  # the MoE option is refused (ConfigError)
        refuse(context_parallel_problems(dist.get_world_size(group), 1, None, ModelDims.of(config)))
    attention = partial(all_gather_attention, group=group)
    for block in model.blocks.children():  # a GPT's list or a pipeline chunk's dict
        block.attn.attention_fn = attention
    return model


def context_parallel_loss(logits: torch.Tensor, targets: torch.Tensor,
                          group: dist.ProcessGroup) -> tuple[torch.Tensor, torch.Tensor]:
    """(this rank's share, the global mean): the share is the local cross-entropy sum over the
    token count of the whole cp group, so the shares sum to the one-process mean loss and
    summing gradients over the group gives its gradient. The mean is detached, for logging."""
    local_sum = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1),
                                ignore_index=IGNORE_INDEX, reduction="sum")
    if hasattr(local_sum, "full_tensor"):  # vocabulary-sharded logits under tp (loss_parallel): a replicated DTensor
        local_sum = local_sum.full_tensor()
    count = (targets != IGNORE_INDEX).sum().to(local_sum.dtype)
    dist.all_reduce(count, group=group)
    share = local_sum / count
    mean = share.detach().clone()
    dist.all_reduce(mean, group=group)
    return share, mean


def context_parallel_forward(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor, group: dist.ProcessGroup,
                             documents: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Shard a whole (B, T) batch, run the context-parallel model on this rank's shard:
    (local logits (B, T/cp, vocab), this rank's loss share to backpropagate, the global mean).
    `documents` (B, T): the whole batch's document ids, for document masking (every rank holds them whole)."""
    batch = shard_batch(idx, targets, group)
    logits, _ = model(batch.idx, positions=batch.positions, documents=documents)
    share, mean = context_parallel_loss(logits, batch.targets, group)
    return logits, share, mean


def all_reduce_gradients(model: nn.Module, group: dist.ProcessGroup) -> None:
    """Sum the parameters' gradients over the group (replicated parameters, no FSDP)."""
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, group=group)
