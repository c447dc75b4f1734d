"""Pipeline parallelism (`parallel.pp`) with torch.distributed.pipelining, torchtitan's split.

A built GPT is cut by layer count into pp · virtual_stages model chunks: chunk 0 also holds the
token (and learned position) embedding, the last chunk the final norm and the output head; rank
r of the pipeline group owns chunks r, r + pp, r + 2·pp, … (one chunk per rank unless the
schedule is interleaved). A chunk keeps the full model's parameter names (`blocks.5.attn.query.weight`
stays that), so checkpoints name the same tensors under any layout. The model code stays free of
parallelism: the chunk re-uses the GPT's own modules.

The last stage's loss is the cross-entropy mean of its micro-batch divided by the micro-batch count
(and by grad_accum), so the summed micro-batch losses, and the gradients, equal one process's over
the whole batch; torch's own gradient scaling stays off (it would rescale gradients accumulated by
earlier grad_accum calls too). Gradient clipping takes the norm over every stage's parameters
(`clip_grad_norm_pipeline`).

Under context parallelism (`cp_group`) every rank passes its cp shard of the batch (B, T/cp) and the
tokens' global positions, which the schedule splits into micro-batches like the tokens and hands to
every stage's chunk (RoPE, learned positions and the attention's causal mask read them). The last
stage's loss is then context_parallel_loss's share (the shard's cross-entropy sum over the cp group's
token count) times cp, as the trainer's own cp step scales it: FSDP over dp_shard × cp averages the
gradients, so the cp ranks' shares add up.

With document masking (lmforge.model.document_mask) the batch's document ids (B, T), whole sequences
also under cp, go to every stage's chunk the same way (torch's schedules split keyword arguments into
micro-batches along the batch and pass them to every stage, not only the first).

Not supported, refused by the layout rulebook (lmforge.trainer.layout_rules.pipeline_problems) at the
trainer's start and again by `build_pipeline`: tied embeddings (the head would live on another stage
than the embedding it shares) and the MoE option (its auxiliary losses arise on every stage, but a
pipeline backpropagates from the last stage's loss).

torch.distributed.pipelining is imported by `build_pipeline` only (it imports torch._dynamo): a process
that only validates a layout, as a rank refusing its config at start does, starts without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lmforge.model.transformer import GPT
from lmforge.trainer.context_parallel import context_parallel_loss
from lmforge.trainer.layout_rules import INTERLEAVED_SCHEDULES, ModelDims, pipeline_problems, refuse

if TYPE_CHECKING:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

__all__ = [
    "SCHEDULES", "Pipeline", "PipelineChunk", "bubble_fraction", "build_pipeline", "chunk_layers",
    "clip_grad_norm_pipeline", "pipeline_eval", "pipeline_step", "split_model",
]

# schedule name (layout_rules.PIPELINE_SCHEDULES) → its torch.distributed.pipelining class (looked up when built)
SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved_1f1b": "ScheduleInterleaved1F1B"}


def bubble_fraction(pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    """The pipeline's idle fraction relative to its ideal time: (pp − 1) / microbatches for GPipe
    and 1F1B, divided by the virtual stages per rank for interleaved 1F1B (Narayanan et al. 2021)."""
    return (pp - 1) / (microbatches * virtual_stages)


def chunk_layers(n_layer: int, chunks: int) -> list[range]:
    """The blocks of each chunk, in order (equal counts; the rulebook's pipeline_problems checks they divide)."""
    per_chunk = n_layer // chunks
    return [range(index * per_chunk, (index + 1) * per_chunk) for index in range(chunks)]


class PipelineChunk(nn.Module):
    """Consecutive blocks of a GPT, with the embeddings when first and the final norm and output
    head when last. Input: token ids (first chunk) or hidden states (B, T, n_embd); output:
    hidden states, or logits (B, T, vocab) from the last chunk."""

    def __init__(self, model: GPT, layers: range, *, first: bool, last: bool):
        super().__init__()
        self.wte = model.wte if first else None
        self.wpe = model.wpe if first else None
        self.drop = model.drop
        # A dict keyed by the layer index keeps the full model's parameter names.
        self.blocks = nn.ModuleDict({str(layer): model.blocks[layer] for layer in layers})
        self.ln_f = model.ln_f if last else None
        self.lm_head = model.lm_head if last else None
        self.rotary = model.wpe is None
        if self.rotary:
            self.register_buffer("rope_cos", model.rope_cos, persistent=False)
            self.register_buffer("rope_sin", model.rope_sin, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None,
                documents: torch.Tensor | None = None) -> torch.Tensor:
        """`positions` (B, T): the tokens' global positions, under context parallelism; `documents`
        (B, T_full): the whole sequences' document ids, for document masking (as GPT.forward's)."""
        if self.wte is not None:
            time = x.shape[1]
            x = self.wte(x)
            if self.wpe is not None:
                x = x + self.wpe(torch.arange(time, device=x.device) if positions is None else positions)
            x = self.drop(x)
        rope = (self.rope_cos, self.rope_sin) if self.rotary else None
        for block in self.blocks.values():
            x = block(x, rope, positions, documents)
        if self.lm_head is not None:
            x = self.lm_head(self.ln_f(x))
        return x


def split_model(model: GPT, pp_rank: int, pp: int, virtual_stages: int = 1) -> dict[int, PipelineChunk]:
    """This rank's chunks of `model`, by stage index (pp_rank, pp_rank + pp, …)."""
    chunks = pp * virtual_stages
    layers = chunk_layers(model.config.n_layer, chunks)
    return {stage: PipelineChunk(model, layers[stage], first=stage == 0, last=stage == chunks - 1)
            for stage in range(pp_rank, chunks, pp)}


class MicrobatchLoss:
    """The last stage's loss: the micro-batch's mean cross-entropy over `share` (micro-batches ×
    grad_accum), so the micro-batch losses of one optimizer step sum to the whole batch's mean.
    With a cp group: context_parallel_loss's share of the cp shards' mean, times cp (FSDP averages
    the gradients over dp_shard × cp; the cp ranks' shares must add up)."""

    def __init__(self, share: int, cp_group: dist.ProcessGroup | None = None):
        self.share = share
        self.cp_group = cp_group

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.cp_group is not None:
            cp_share, _ = context_parallel_loss(logits, targets, self.cp_group)
            return cp_share * (dist.get_world_size(self.cp_group) / self.share)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return loss / self.share


@dataclass
class Pipeline:
    """This rank's part of a pipeline: its chunks (their parameters are the optimizer's), the
    stages wrapping them and the schedule that runs a step."""

    chunks: list[PipelineChunk]
    stages: list[PipelineStage]
    schedule: ScheduleGPipe | Schedule1F1B | ScheduleInterleaved1F1B
    group: dist.ProcessGroup
    microbatches: int
    grad_accum: int
    bubble: float
    cp_group: dist.ProcessGroup | None = None  # context parallelism: each rank runs its cp shard of the batch

    @property
    def has_last_stage(self) -> bool:
        return any(stage.is_last for stage in self.stages)

    def parameters(self) -> Iterable[nn.Parameter]:
        for chunk in self.chunks:
            yield from chunk.parameters()


def build_pipeline(model: GPT, group: dist.ProcessGroup, schedule: str, microbatches: int, *,
                   virtual_stages: int = 1, grad_accum: int = 1, device: torch.device | None = None,
                   parallelize_chunk: Callable[[PipelineChunk], object] | None = None,
                   cp_group: dist.ProcessGroup | None = None) -> Pipeline:
    """Splits a built model (the same on every rank of `group`) into this rank's stages and builds
    the schedule. `microbatches` is the count per `pipeline_step`; `grad_accum` how many
    pipeline_step calls one optimizer step accumulates; `parallelize_chunk` applies the other axes
    (tensor parallelism, FSDP over the data-parallel ranks) to each chunk in place, before the
    stages wrap them (torchtitan's order); `cp_group`: the context-parallel ranks that share each
    batch (parallelize_chunk applies context parallelism to the chunks' attention)."""
    pp, pp_rank = dist.get_world_size(group), dist.get_rank(group)
    refuse(pipeline_problems(pp, microbatches, ModelDims.of(model.config), schedule, virtual_stages))
    device = device or torch.device("cpu")
    chunks = split_model(model, pp_rank, pp, virtual_stages)
    if parallelize_chunk is not None:
        for chunk in chunks.values():
            parallelize_chunk(chunk)
    from torch.distributed import pipelining

    stages = [pipelining.PipelineStage(chunk, index, pp * virtual_stages, device, group=group)
              for index, chunk in chunks.items()]
    loss_fn = MicrobatchLoss(microbatches * grad_accum, cp_group)
    schedule_class = getattr(pipelining, SCHEDULES[schedule])
    runner = schedule_class(stages if schedule in INTERLEAVED_SCHEDULES else stages[0], microbatches, loss_fn=loss_fn,
                            scale_grads=False)
    return Pipeline(list(chunks.values()), stages, runner, group, microbatches, grad_accum,
                    bubble_fraction(pp, microbatches, virtual_stages), cp_group)


def pipeline_step(pipeline: Pipeline, inputs: torch.Tensor, targets: torch.Tensor,
                  positions: torch.Tensor | None = None, documents: torch.Tensor | None = None) -> torch.Tensor:
    """Forward and backward of one batch (B, T) through the pipeline, gradients accumulated into
    every rank's chunks; returns the batch's mean cross-entropy on every rank of the group (the
    share of one optimizer step is this / grad_accum). Every rank passes the same batch; only the
    first stage reads the inputs and only the last the targets. With a cp group: this rank's cp
    shard (B, T/cp) and its global `positions` (B, T/cp); the mean is the whole sequences'. `documents`
    (B, T): the document ids of the whole sequences (also under cp), for document masking."""
    return _run_schedule(pipeline, inputs, targets, positions, documents, train=True)


@torch.no_grad()
def pipeline_eval(pipeline: Pipeline, inputs: torch.Tensor, targets: torch.Tensor,
                  positions: torch.Tensor | None = None, documents: torch.Tensor | None = None) -> torch.Tensor:
    """The batch's mean cross-entropy through the pipeline, forward only (put the chunks in eval
    mode first, as for a model), on every rank of the group."""
    return _run_schedule(pipeline, inputs, targets, positions, documents, train=False)


def _run_schedule(pipeline: Pipeline, inputs: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor | None,
                  documents: torch.Tensor | None = None, *, train: bool) -> torch.Tensor:
    if inputs.shape[0] % pipeline.microbatches:
        raise ValueError(f"batch of {inputs.shape[0]} sequences does not split into "
                         f"{pipeline.microbatches} pipeline micro-batches")
    losses: list[torch.Tensor] = []
    first = any(stage.is_first for stage in pipeline.stages)
    run = pipeline.schedule.step if train else pipeline.schedule.eval
    # split into micro-batches along the batch, for every stage
    kwargs = {name: value for name, value in (("positions", positions), ("documents", documents)) if value is not None}
    run(*([inputs] if first else []), target=targets if pipeline.has_last_stage else None, losses=losses,
        return_outputs=False, **kwargs)
    if pipeline.has_last_stage:
        # (under tensor parallelism each is a replicated DTensor: loss_parallel's cross-entropy)
        losses = [loss.full_tensor() if hasattr(loss, "full_tensor") else loss for loss in losses]
        loss = torch.stack([loss.detach() for loss in losses]).sum() * pipeline.grad_accum
        if pipeline.cp_group is not None:  # cp × this rank's share: the mean over the cp group is the whole mean
            dist.all_reduce(loss, group=pipeline.cp_group)
            loss /= dist.get_world_size(pipeline.cp_group)
    else:
        loss = torch.zeros((), device=targets.device)
    dist.broadcast(loss, group=pipeline.group, group_src=dist.get_world_size(pipeline.group) - 1)
    return loss


def clip_grad_norm_pipeline(params: Iterable[nn.Parameter], max_norm: float, pp_group: dist.ProcessGroup,
                            norm_type: float = 2.0) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ over the parameters of every stage: each rank's norm of
    its own gradients (a DTensor's over its whole mesh, as with FSDP) combined across the pipeline
    group; every rank scales its gradients by the same factor. Returns the total norm."""
    params = [p for p in params if p.grad is not None]
    grads = [p.grad for p in params]
    local = torch.nn.utils.get_total_norm(grads, norm_type)
    if hasattr(local, "full_tensor"):  # DTensor gradients (FSDP): reduce over their mesh first
        local = local.full_tensor()
    if math.isinf(norm_type):
        total = local.clone()
        dist.all_reduce(total, op=dist.ReduceOp.MAX, group=pp_group)
    else:
        total = local**norm_type
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=pp_group)
        total = total ** (1.0 / norm_type)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total
