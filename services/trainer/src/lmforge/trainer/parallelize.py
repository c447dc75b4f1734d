"""Process group, device and the model wrapper for each parallelism mode.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK (on Kubernetes from the PET_* variables the
training operator injects); nothing here reads the operator's node-level WORLD_SIZE/RANK.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from lmforge.trainer.config import Float8Section, ParallelSection
from lmforge.trainer.context_parallel import apply_context_parallel
from lmforge.trainer.expert_parallel_layout import ExpertParallelGroups, build_expert_parallel_groups
from lmforge.trainer.float8 import apply_float8
from lmforge.trainer.layout_rules import MESH_ORDER, MeshLayout
from lmforge.trainer.mesh_layout import trainer_layout
from lmforge.trainer.tensor_parallel import apply_tensor_parallel


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    mesh: DeviceMesh | None  # the named axes above 1 (MESH_ORDER), and the data-parallel wrapper's
    layout: MeshLayout = MeshLayout()  # the parallel section's degrees at this world size
    experts: ExpertParallelGroups | None = None  # ep > 1: the ep groups over the data-parallel ranks

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks: each reads its own batches (the tp and pp ranks of one group read the same)."""
        return self.layout.dp_replicate * self.layout.dp_shard

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel index: its coordinate on dp_replicate × dp_shard (MESH_ORDER; pp, the
        outermost axis, drops out of the modulo, so the stages of one pipeline read the same batches)."""
        inner = self.layout.cp * self.layout.tp
        return (self.rank // inner) % self.dp_size

    @property
    def cp_group(self) -> dist.ProcessGroup | None:
        """The context-parallel ranks that share this rank's batch (each holds a shard of its sequences)."""
        return self.mesh["cp"].get_group() if self.layout.cp > 1 else None


def init_distributed(device_choice: str, parallel: ParallelSection, *, micro_batch: int = 1,
                     grad_accum: int = 1) -> Dist:
    """This rank's process group, device and mesh; micro_batch and grad_accum (data.batch_size, grad_accum)
    complete the layout's micro-batching."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # a bad layout fails before any process group work
    layout = trainer_layout(parallel, world_size, micro_batch=micro_batch, grad_accum=grad_accum)
    use_cuda = device_choice == "cuda" or (device_choice == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if layout.world_size == 1 and layout.mode not in ("ddp", "fsdp", "hsdp"):
        return Dist(0, 1, 0, device, None, layout)
    if not dist.is_initialized():
        # FSDP or DDP on one device (make bench-gpu's runs, bench/train_memory.py --ranks 1) still needs a
        # process group: a one-rank one, in-process.
        store = _attempt_store(rank, world_size) if world_size > 1 else dist.HashStore()
        # On GPU the timeout is also the NCCL watchdog's: a hung peer ends the job instead of stalling it.
        dist.init_process_group("nccl" if use_cuda else "gloo", store=store,
                                rank=rank, world_size=world_size, timeout=timedelta(seconds=parallel.timeout_seconds))
    mesh = build_mesh(layout, device)
    return Dist(rank, world_size, local_rank, device, mesh, layout, build_expert_parallel_groups(mesh, layout))


def build_mesh(layout: MeshLayout, device: torch.device) -> DeviceMesh | None:
    """One DeviceMesh over the world with the named axes in MESH_ORDER (tp innermost, so a tp
    group is consecutive ranks: inside a node): those above 1, and the axes the FSDP/HSDP wrapper
    shards and replicates over even at 1. None for DDP alone (it needs no mesh)."""
    wrapper_axes = {"fsdp": ("dp_shard",), "hsdp": ("dp_replicate", "dp_shard")}.get(layout.mode, ())
    names = tuple(axis for axis in MESH_ORDER if getattr(layout, axis) > 1 or axis in wrapper_axes)
    if not names or names == ("dp_replicate",):
        return None
    return init_device_mesh(device.type, tuple(getattr(layout, axis) for axis in names), mesh_dim_names=names)


def _attempt_store(rank: int, world_size: int) -> dist.Store:
    """The rendezvous store, namespaced by torchrun's restart count: the agent's store
    outlives a failed attempt, and without a fresh namespace the restarted ranks read the
    dead ranks' addresses (gloo then fails with 'connection refused')."""
    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500"))
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0 and not agent_store,
                          timeout=timedelta(minutes=5))
    return dist.PrefixStore(f"lmforge/attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def parallelize(model: torch.nn.Module, parallel: ParallelSection, ctx: Dist,
                float8: Float8Section | None = None) -> torch.nn.Module:
    """Float8 Linear layers, context parallelism, tensor + sequence parallelism, expert parallelism,
    activation checkpointing, the data-parallel wrapper, compile (torchtitan's order)."""
    if float8 is not None and float8.enabled:
        apply_float8(model, float8, ctx.layout.mode)
    if ctx.layout.cp > 1:
        apply_context_parallel(model, ctx.cp_group)
    if ctx.layout.tp > 1:
        apply_tensor_parallel(model, ctx.mesh["tp"])
    if ctx.experts is not None:
        from lmforge.trainer.expert_parallel import apply_expert_parallel  # (DTensor: imported where used)

        apply_expert_parallel(model, ctx.experts.mesh)
    if parallel.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for name, block in list(model.blocks.named_children()):  # a GPT's list or a pipeline chunk's dict
            model.blocks.register_module(name, checkpoint_wrapper(block))
    if ctx.layout.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
    elif ctx.layout.mode in ("fsdp", "hsdp"):
        model = _fully_shard(model, parallel, ctx)
    if parallel.compile:
        model = torch.compile(model)
    return model


def _fully_shard(model: torch.nn.Module, parallel: ParallelSection, ctx: Dist) -> torch.nn.Module:
    """torchtitan's grouping: each block, then the root (embedding, final norm and the
    tied head share one group, as tied weights must)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = None
    if parallel.mixed_precision and ctx.device.type == "cuda":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    dp_axes = ("dp_replicate", "dp_shard") if ctx.layout.mode == "hsdp" else ("dp_shard",)
    if ctx.layout.cp > 1:  # torchtitan's dp_shard_cp: the reduce-scatter's mean over it is also the cp ranks'
        ctx.mesh["dp_shard", "cp"]._flatten("dp_shard_cp")  # (train.forward_backward scales by cp: a sum)
        dp_axes = (*dp_axes[:-1], "dp_shard_cp")
    # With tp the FSDP mesh is a sub-mesh of the world's: FSDP2 then shards the tp DTensors (2-D).
    kwargs = {"mesh": ctx.mesh[dp_axes], "reshard_after_forward": parallel.reshard_after_forward}
    if policy is not None:
        kwargs["mp_policy"] = policy
    if ctx.experts is not None:  # sharded over ep instead; their gradients are reduced by the trainer's step
        from lmforge.trainer.expert_parallel import expert_parameters

        kwargs["ignored_params"] = set(expert_parameters(model))
    for block in model.blocks.children():
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


def all_reduce_mean(value: torch.Tensor, ctx: Dist) -> torch.Tensor:
    if ctx.world_size > 1:
        value = value.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= ctx.world_size
    return value


def autocast_context(parallel: ParallelSection, ctx: Dist):
    """bf16 compute on GPU for none/DDP (FSDP gets it from its MixedPrecisionPolicy instead);
    parameters and gradient reduction stay fp32."""
    from contextlib import nullcontext

    if parallel.mixed_precision and ctx.device.type == "cuda" and ctx.layout.mode in ("none", "ddp"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()
