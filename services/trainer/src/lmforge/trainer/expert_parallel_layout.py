"""Expert parallelism in the trainer (parallel.ep > 1, the MoE option): the ep groups over the
data-parallel ranks, and the step's expert-gradient reduction and clipping (what ep must divide is
the layout rulebook's, lmforge.trainer.layout_rules).

EP ranks are data-parallel ranks (torchtitan's layout): each reads its own batch, and the ep ranks
of a group run one MoE forward over their concatenated tokens (lmforge.trainer.expert_parallel).
dp_shard splits into (dp_shard_outside_ep, ep), ep inner, so an ep group is consecutive dp_shard
ranks. FSDP/HSDP shard every other parameter over the whole data-parallel mesh, as without EP,
and leave the experts alone (`ignored_params`); after backward the ranks that hold the same
experts (dp_replicate × dp_shard_outside_ep) sum their expert gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from lmforge.trainer.layout_rules import MeshLayout


@dataclass(frozen=True)
class ExpertParallelGroups:
    mesh: DeviceMesh  # 1-D: this rank's ep group
    outside_ep: dist.ProcessGroup | None  # the data-parallel ranks holding the same experts (None: no others)
    data_parallel_size: int


def build_expert_parallel_groups(world: DeviceMesh | None, layout: MeshLayout) -> ExpertParallelGroups | None:
    """The ep sub-mesh and the outside-ep group, from the world's mesh (a collective: every rank
    calls it); None without EP."""
    if layout.ep == 1 or world is None:
        return None
    split = world._unflatten("dp_shard", (layout.dp_shard // layout.ep, layout.ep), ("dp_shard_outside_ep", "ep"))
    outside = tuple(axis for axis in ("dp_replicate", "dp_shard_outside_ep")
                    if axis in split.mesh_dim_names and split[axis].size() > 1)
    if len(outside) == 2:
        outside_ep = split[outside]._flatten("outside_ep").get_group()
    else:
        outside_ep = split[outside[0]].get_group() if outside else None
    return ExpertParallelGroups(split["ep"], outside_ep, layout.dp_replicate * layout.dp_shard)


def reduce_expert_gradients_then_clip(model: nn.Module, groups: ExpertParallelGroups,
                                      max_norm: float) -> torch.Tensor:
    """After the step's backward passes: the expert gradients reduced over the data-parallel ranks
    (FSDP reduced the rest), then every gradient clipped by the whole model's norm, returned."""
    # imported here: its DTensor import is start-up time that a process refusing its layout need not pay
    from lmforge.trainer.expert_parallel import clip_grad_norm_with_sharded_experts, reduce_expert_gradients

    reduce_expert_gradients(model, groups.data_parallel_size, groups.outside_ep)
    return clip_grad_norm_with_sharded_experts(model, max_norm)
