"""The trainer's pipeline parallelism (`parallel.pp` > 1), built on lmforge.trainer.pipeline.

Each data-parallel rank reads one batch of data.batch_size × micro-batches sequences per
grad_accum step (the pp ranks of a data-parallel group read the same one) and the schedule cuts it
into the micro-batches. The model is split first, then each of this rank's chunks gets the other
axes in place, as torchtitan does: tensor parallelism, activation checkpointing, FSDP/HSDP
(`parallelize`). `PipelineModel` holds the chunks under the full GPT's module names, so the
optimizer, the memory figures and DCP checkpoints see `blocks.5.attn.query.weight` under any layout:
a checkpoint saved by a pipeline resumes without one, and exports, as any other.

With context parallelism (`parallel.cp` > 1) each rank cuts the batch along the sequence into its
load-balanced cp shard (context_parallel.shard_batch) before the schedule cuts it into micro-batches
along the batch; the shard's global positions go with it to every stage (lmforge.trainer.pipeline).

Refused with pp > 1, before any process group: what validate_pipeline refuses, DDP (a pipeline
stage runs its chunk in place; use dp_shard) and compile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from lmforge.common.errors import ConfigError
from lmforge.common.model import GPT, GPTConfig
from lmforge.trainer.context_parallel import shard_batch
from lmforge.trainer.parallel import parallelize
from lmforge.trainer.pipeline import (
    Pipeline,
    build_pipeline,
    clip_grad_norm_pipeline,
    pipeline_eval,
    pipeline_step,
    validate_pipeline,
)

if TYPE_CHECKING:
    from lmforge.trainer.config import Float8Section, ParallelSection
    from lmforge.trainer.mesh_layout import MeshLayout
    from lmforge.trainer.parallel import Dist


def pipeline_microbatches(parallel: ParallelSection, layout: MeshLayout) -> int:
    """Micro-batches one batch is cut into: parallel.pp_microbatches (default pp); 1 without a pipeline."""
    if layout.pp == 1:
        return 1
    return parallel.pp_microbatches or layout.pp


def refuse_unrunnable_pipeline(config: GPTConfig, parallel: ParallelSection, layout: MeshLayout) -> None:
    """ConfigError (one line, naming the axis) for a pipeline the trainer cannot run; nothing without one."""
    if layout.pp == 1:
        return
    if layout.mode == "ddp":
        raise ConfigError(f"parallel.pp={layout.pp} with DDP (dp_replicate={layout.dp_replicate}): a pipeline "
                          "stage runs its chunk in place; use dp_shard (FSDP) or hsdp for the data-parallel axis")
    if parallel.compile:
        raise ConfigError(f"parallel.pp={layout.pp} with parallel.compile: compiling pipeline chunks is not built")
    validate_pipeline(config, layout.pp, parallel.pp_schedule, pipeline_microbatches(parallel, layout),
                      parallel.pp_virtual_stages)


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

    def train_step(self, batch: torch.Tensor) -> torch.Tensor:
        """Forward and backward of one batch (B, T + 1) of token ids; its mean loss, on every stage."""
        return pipeline_step(self.pipeline, *self._inputs(batch))

    def eval_loss(self, batch: torch.Tensor) -> torch.Tensor:
        return pipeline_eval(self.pipeline, *self._inputs(batch))

    def _inputs(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(tokens, targets, global positions): this rank's cp shard of each, or the whole batch without cp."""
        if self.pipeline.cp_group is None:
            return batch[:, :-1], batch[:, 1:], None
        return tuple(shard_batch(batch[:, :-1], batch[:, 1:], self.pipeline.cp_group))

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """The gradient norm over every stage's parameters, after clipping them by it."""
        return clip_grad_norm_pipeline(self.parameters(), max_norm, self.pipeline.group)


def build_pipeline_model(model: GPT, parallel: ParallelSection, ctx: Dist, grad_accum: int,
                         float8: Float8Section | None = None) -> PipelineModel:
    """Splits the built model (the same on every rank) into this rank's chunks, parallelizes each
    (cp, tp, activation checkpointing, FSDP/HSDP) and builds the schedule."""

    def parallelize_chunk(chunk: nn.Module) -> None:
        parallelize(chunk, parallel, ctx, float8=float8)  # in place: no DDP or compile wrapper with a pipeline

    pipeline = build_pipeline(model, ctx.mesh.get_group("pp"), parallel.pp_schedule,
                              pipeline_microbatches(parallel, ctx.layout), virtual_stages=parallel.pp_virtual_stages,
                              grad_accum=grad_accum, device=ctx.device, parallelize_chunk=parallelize_chunk,
                              cp_group=ctx.cp_group)
    return PipelineModel(pipeline)
