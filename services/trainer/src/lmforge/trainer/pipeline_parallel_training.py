"""The trainer's pipeline parallelism (`parallel.pp` > 1), built on lmforge.trainer.pipeline_parallel.

Each data-parallel rank reads one batch of data.batch_size × micro-batches sequences per
grad_accum step (the pp ranks of a data-parallel group read the same one) and the schedule cuts it
into the micro-batches. The model is split first, then each of this rank's chunks gets the other
axes in place, as torchtitan does: tensor parallelism, activation checkpointing, FSDP/HSDP
(`parallelize`). `PipelineModel` holds the chunks under the full GPT's module names, so the
optimizer, the memory figures and DCP checkpoints see `blocks.5.attn.query.weight` under any layout:
a checkpoint saved by a pipeline resumes without one, and exports, as any other.

With context parallelism (`parallel.cp` > 1) each rank cuts the batch along the sequence into its
load-balanced cp shard (context_parallel.shard_batch) before the schedule cuts it into micro-batches
along the batch; the shard's global positions go with it to every stage (lmforge.trainer.pipeline_parallel).
Document ids for document masking (lmforge.model.document_mask) stay the whole sequences' under cp.

What a pipeline refuses (tied embeddings, the MoE option, DDP, compile, too few micro-batches, …) is
lmforge.trainer.layout_rules's, checked by the trainer's start before any process group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from lmforge.model.transformer import GPT
from lmforge.trainer.context_parallel import shard_batch
from lmforge.trainer.parallelize import parallelize
from lmforge.trainer.pipeline_parallel import (
    MicrobatchLoss,
    Pipeline,
    build_pipeline,
    clip_grad_norm_pipeline,
    pipeline_eval,
    pipeline_step,
)

if TYPE_CHECKING:
    from lmforge.trainer.config import Float8Section, ParallelSection
    from lmforge.trainer.layout_rules import MeshLayout
    from lmforge.trainer.parallelize import Dist


def pipeline_microbatches(layout: MeshLayout) -> int:
    """Micro-batches one batch is cut into: the layout's (parallel.pp_microbatches, default pp); 1 without
    a pipeline (the layout's micro-batches are then grad_accum's steps)."""
    return layout.microbatches if layout.pp > 1 else 1


class PipelineModel(nn.Module):
    """This rank's pipeline chunks as one module named as the full GPT (those of wte, wpe, drop,
    blocks.N, ln_f, lm_head it holds); `pipeline` runs them."""

    def __init__(self, pipeline: Pipeline):
        super().__init__()
        self.pipeline = pipeline
        self.blocks = nn.ModuleDict()
        for chunk in pipeline.chunks:
            for name, module in chunk.named_children():
                if name == "blocks":
                    for layer, block in module.named_children():
                        self.blocks.register_module(layer, block)
                else:
                    self.register_module(name, module)

    def forward(self, *_):
        raise TypeError("a pipeline runs through train_step / eval_loss, not a forward call")

    def train_step(self, batch: torch.Tensor, documents: torch.Tensor | None = None) -> torch.Tensor:
        """Forward and backward of one batch (B, T + 1) of token ids; its mean loss, on every stage.
        `documents` (B, T): the document ids of the batch's input tokens (batch[:, :-1]), whole
        sequences also under cp, for document masking."""
        return pipeline_step(self.pipeline, *self._inputs(batch), documents)

    def eval_loss(self, batch: torch.Tensor, documents: torch.Tensor | None = None) -> torch.Tensor:
        return pipeline_eval(self.pipeline, *self._inputs(batch), documents)

    def _inputs(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(tokens, targets, global positions): this rank's cp shard of each, or the whole batch without cp."""
        if self.pipeline.cp_group is None:
            return batch[:, :-1], batch[:, 1:], None
        return tuple(shard_batch(batch[:, :-1], batch[:, 1:], self.pipeline.cp_group))

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """The gradient norm over every stage's parameters, after clipping them by it."""
        return clip_grad_norm_pipeline(self.parameters(), max_norm, self.pipeline.group)

    def set_grad_accum(self, grad_accum: int) -> None:
        """A training schedule's new stage (lmforge.trainer.schedule): new pipeline stages and schedule over the
        same chunks, whose micro-batch losses are shares of grad_accum × micro-batches and whose activation
        shapes are inferred again at the next step (the stage's sequence length and batch)."""
        from torch.distributed import pipelining

        old = self.pipeline
        stages = [pipelining.PipelineStage(stage.submod, stage.stage_index, stage.num_stages, stage.device,
                                           group=old.group) for stage in old.stages]
        interleaved = not isinstance(old.schedule, pipelining.schedules.PipelineScheduleSingle)
        old.schedule = type(old.schedule)(stages if interleaved else stages[0], old.microbatches,
                                          loss_fn=MicrobatchLoss(old.microbatches * grad_accum, old.cp_group),
                                          scale_grads=False)
        old.stages, old.grad_accum = stages, grad_accum


def build_pipeline_model(model: GPT, parallel: ParallelSection, ctx: Dist, grad_accum: int,
                         float8: Float8Section | None = None) -> PipelineModel:
    """Splits the built model (the same on every rank) into this rank's chunks, parallelizes each
    (cp, tp, activation checkpointing, FSDP/HSDP) and builds the schedule."""

    def parallelize_chunk(chunk: nn.Module) -> None:
        parallelize(chunk, parallel, ctx, float8=float8)  # in place: no DDP or compile wrapper with a pipeline

    pipeline = build_pipeline(model, ctx.mesh.get_group("pp"), parallel.pp_schedule,
                              pipeline_microbatches(ctx.layout), virtual_stages=parallel.pp_virtual_stages,
                              grad_accum=grad_accum, device=ctx.device, parallelize_chunk=parallelize_chunk,
                              cp_group=ctx.cp_group)
    return PipelineModel(pipeline)
