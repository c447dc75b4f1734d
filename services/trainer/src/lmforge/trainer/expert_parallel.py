"""Expert parallelism: each MoE layer's experts sharded across the ranks of the `ep` mesh axis,
tokens sent to their experts' ranks and back with all_to_all (GShard / torchtitan).

The ep ranks of a group together compute one MoE forward over the concatenation of their
tokens (rank 0's first): capacity ceil(capacity_factor·k·N/E) of those N tokens, assignments
dropped in that global token order, the auxiliary losses and the stats over all N tokens —
exactly what lmforge.model.moe computes in one process on the concatenated batch. Each rank
routes its own tokens (the router is replicated), the ranks exchange their per-expert counts
(one all_gather), and from those counts every rank knows every assignment's global position,
which are kept and how many rows go to and come from each rank; nothing else is exchanged
before the token all_to_all.

Rank r holds experts [r·E/ep, (r+1)·E/ep): every parameter of `GroupedExperts` (dim 0 is the
expert) becomes a DTensor Shard(0) on the ep mesh, so the model's state dict holds each expert
weight at its full (E, …) shape: DCP saves and loads it under any layout, and the exporter's
one-process load of a checkpoint consolidates it (as `DTensor.full_tensor()` does in memory).

Gradients (the trainer's data-parallel reduction): an expert's gradient on its owner already
sums the contributions of every ep rank's tokens; divide it by the data-parallel world size
(ep included) and sum it over the data-parallel ranks outside ep (`reduce_expert_gradients`;
FSDP/DDP get the experts as ignored parameters, `expert_parameters`). Every other parameter (the
router included) is averaged over all data-parallel ranks, as without EP, and
`clip_grad_norm_with_sharded_experts` clips by the whole model's norm. An ep that does not divide
the experts is refused by the layout rulebook (lmforge.trainer.layout_rules).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Function
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from lmforge.model.moe import DispatchPlan as LocalPlan
from lmforge.model.moe import MoE, Routing, combine, moe_layers
from lmforge.trainer.layout_rules import expert_parallel_problems, refuse

__all__ = [
    "ExpertParallelMoE",
    "apply_expert_parallel",
    "clip_grad_norm_with_sharded_experts",
    "expert_parameters",
    "reduce_expert_gradients",
]


def apply_expert_parallel(model: nn.Module, mesh: DeviceMesh) -> None:
    """Shards every MoE layer of `model` over the 1-D `mesh` (the ep axis), in place. Apply it to
    a built model whose ranks hold identical weights, before FSDP wraps it. A model the rulebook does
    not split over the mesh's ranks (experts ep does not divide) is refused (ConfigError)."""
    layers = moe_layers(model)
    for layer in layers:
        refuse(expert_parallel_problems(mesh.size(), layer.config.num_experts, None))
    for layer in layers:
        if type(layer) is not MoE:
            raise TypeError(f"expert parallelism applies to a plain MoE layer, not {type(layer).__name__}")
        experts = layer.experts
        for name, param in list(experts.named_parameters(recurse=False)):
            shard = distribute_tensor(param.detach(), mesh, [Shard(0)])
            experts.register_parameter(name, nn.Parameter(shard, requires_grad=param.requires_grad))
        layer.__class__ = ExpertParallelMoE  # as FSDP2's fully_shard does: the layer stays an MoE
        layer.ep_mesh = mesh


def expert_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters `apply_expert_parallel` sharded: give them to FSDP as `ignored_params` and
    reduce their gradients with `reduce_expert_gradients`."""
    return [
        p for layer in moe_layers(model) if isinstance(layer, ExpertParallelMoE) for p in layer.experts.parameters()
    ]


def reduce_expert_gradients(model: nn.Module, data_parallel_size: int, outside_ep: dist.ProcessGroup | None = None):
    """After backward: each expert gradient summed over `outside_ep` (the data-parallel ranks
    that hold the same experts, None when every data-parallel rank is an ep rank) and divided
    by `data_parallel_size` (every data-parallel rank, ep's included) — the mean over the data
    parallel ranks' losses, as FSDP/DDP give every other parameter."""
    grads = [p.grad.to_local() for p in expert_parameters(model) if p.grad is not None]
    if not grads:
        return
    if outside_ep is not None and dist.get_world_size(outside_ep) > 1:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=outside_ep)
        for grad, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
            grad.copy_(part.view_as(grad))
    for grad in grads:
        grad.div_(data_parallel_size)


def clip_grad_norm_with_sharded_experts(model: nn.Module, max_norm: float) -> torch.Tensor:
    """torch's clip_grad_norm_ for a model with sharded experts (after the gradient reductions):
    the norm over every parameter of the whole model, the experts' squares summed over the ep
    group (its ranks hold different experts), the others' as torch computes them (whole, for
    FSDP's DTensors). Returns the total norm."""
    experts = expert_parameters(model)
    expert_ids = {id(p) for p in experts}
    others = [p.grad for p in model.parameters() if p.grad is not None and id(p) not in expert_ids]
    norm = torch.nn.utils.get_total_norm(others) if others else torch.zeros(())
    squares = norm.full_tensor().square() if isinstance(norm, DTensor) else norm.square()
    expert_grads = [p.grad.to_local() for p in experts if p.grad is not None]
    if expert_grads:
        expert_squares = torch.stack([g.float().square().sum() for g in expert_grads]).sum()
        dist.all_reduce(expert_squares, group=_ep_group(model))
        squares = squares + expert_squares
    total = squares.sqrt()
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)  # torch's clip_grads_with_norm_, on each local shard
    for param in model.parameters():
        if param.grad is not None:
            grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
            grad.mul_(scale.to(grad.dtype))
    return total


def _ep_group(model: nn.Module) -> dist.ProcessGroup:
    meshes = {id(layer.ep_mesh): layer.ep_mesh for layer in moe_layers(model) if isinstance(layer, ExpertParallelMoE)}
    (mesh,) = meshes.values()
    return mesh.get_group()


class ExpertParallelMoE(MoE):
    """An MoE layer after `apply_expert_parallel`: the same parameters (the experts sharded) and
    the same results as the single-process MoE over the ep group's tokens."""

    ep_mesh: DeviceMesh

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        group = self.ep_mesh.get_group()
        tokens = x.reshape(-1, x.shape[-1])
        routing = self.router(tokens)
        plan = plan_exchange(routing.experts, self.config.num_experts, self.capacity, group)
        sent = tokens[plan.local.slot_token]  # kept assignments, by expert then global position
        received = _AllToAll.apply(sent, plan.receive_splits, plan.send_splits, group)
        inputs = torch.cat((received, received.new_zeros(1, received.shape[-1])))[plan.buffer_row]
        inputs = inputs.view(plan.local_experts, plan.rows, -1)
        outputs = self._local_experts(inputs)
        returned = _AllToAll.apply(
            outputs.reshape(-1, outputs.shape[-1])[plan.received_slot], plan.send_splits, plan.receive_splits, group
        )
        returned = torch.cat((returned, returned.new_zeros(1, returned.shape[-1])))  # a row for no assignment
        out = combine(returned, plan.local, routing.weights)
        if self.shared_expert is not None:
            out = out + self.shared_expert(tokens.unsqueeze(0)).squeeze(0)
        self._account_globally(routing, plan, group)
        return out.view(x.shape)

    def _local_experts(self, inputs: torch.Tensor) -> torch.Tensor:
        """This rank's experts on their (local_experts, rows, dim) inputs. Under FSDP's mixed
        precision the tokens arrive in bf16 while the experts, which FSDP leaves alone, keep fp32
        parameters: their matmuls then run in the tokens' dtype (autocast), as FSDP's cast would
        have them, and their gradients stay fp32."""
        weight_dtype = next(self.experts.parameters()).dtype
        with torch.autocast(inputs.device.type, dtype=inputs.dtype, enabled=inputs.dtype != weight_dtype):
            return self.experts(DTensor.from_local(inputs, self.ep_mesh, [Shard(0)], run_check=False)).to_local()

    def _account_globally(self, routing: Routing, plan: ExchangePlan, group: dist.ProcessGroup) -> None:
        # Over the group's tokens: the probabilities' sum (balance loss) and logsumexp²'s (z-loss)
        # summed differentiably; the loads and kept counts follow from the exchanged counts.
        z_sum = torch.logsumexp(routing.logits, dim=-1).square().sum()
        sums = _AllReduce.apply(torch.cat((routing.probs.sum(dim=0), z_sum.view(1))), group)
        assignments = plan.global_tokens * self.config.top_k
        load = plan.counts.sum(dim=0)
        fraction = load.float() / assignments
        balance = self.config.num_experts * (fraction * (sums[:-1] / plan.global_tokens)).sum()
        dropped = 1.0 - plan.kept_counts.sum().float() / assignments
        self._record(balance, sums[-1] / plan.global_tokens, load, dropped, plan.local.load)


@dataclass(frozen=True)
class ExchangePlan:
    """Who sends which assignments where, for one forward of an ep group."""

    counts: torch.Tensor  # (ep, E) assignments of each rank's tokens per expert, before dropping
    kept_counts: torch.Tensor  # (ep, E) of those, kept
    global_tokens: int
    # This rank's assignments: slot = the row of its kept assignment in the send buffer, whose
    # rows are ordered by expert then global position (so by owning rank); slot_token = each
    # row's token; load = this rank's loads.
    local: LocalPlan
    send_splits: list[int]  # rows sent to each rank
    receive_splits: list[int]  # rows received from each rank
    local_experts: int
    rows: int  # of each local expert's input buffer: the most assignments any expert keeps
    received_slot: torch.Tensor  # (received,) each received row's place in the (local_experts·rows) buffer
    buffer_row: torch.Tensor  # (local_experts·rows,) the received row in each place; `received` where empty


def plan_exchange(experts: torch.Tensor, num_experts: int, capacity_of, group: dist.ProcessGroup) -> ExchangePlan:
    """The exchange for this rank's assignments `experts` (N, k); `capacity_of(tokens)` gives the
    capacity for the group's token count (None: no limit)."""
    ranks, rank = dist.get_world_size(group), dist.get_rank(group)
    tokens, k = experts.shape
    flat = experts.reshape(-1)  # assignment a = token·k + choice
    own_load = torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(
        0, flat, torch.ones_like(flat)
    )
    gathered = [torch.empty_like(own_load) for _ in range(ranks)]
    dist.all_gather(gathered, own_load, group=group)
    counts = torch.stack(gathered)
    global_tokens = int(counts.sum()) // k
    load = counts.sum(dim=0)
    capacity = capacity_of(global_tokens)
    if capacity is None:
        capacity = max(1, int(load.max()))
    earlier = counts.cumsum(dim=0) - counts  # assignments of lower ranks' tokens, per expert
    kept_counts = (capacity - earlier).clamp(min=0).minimum(counts)

    by_expert = torch.argsort(flat, stable=True)  # grouped by expert, token order within
    first_of_expert = own_load.cumsum(0) - own_load
    position = torch.empty_like(flat)
    position[by_expert] = torch.arange(flat.numel(), device=flat.device) - first_of_expert[flat[by_expert]]
    kept = earlier[rank][flat] + position < capacity
    send = by_expert[kept[by_expert]]
    row = torch.zeros_like(flat)
    row[send] = torch.arange(send.numel(), device=flat.device)
    slot = torch.where(kept, row, send.numel())  # dropped: the zero row after the returned rows
    local = LocalPlan(capacity, slot.view(tokens, k), kept.view(tokens, k), send // k, own_load)

    per_rank = num_experts // ranks
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    rows = max(1, int(kept_counts.sum(dim=0).max()))
    # Received rows come by source rank, then local expert, then global position.
    received = kept_counts[:, mine].reshape(-1)
    first_place = (earlier[:, mine] + torch.arange(per_rank, device=flat.device) * rows).reshape(-1)
    segment_start = received.cumsum(0) - received
    total = int(received.sum())
    within = torch.arange(total, device=flat.device) - segment_start.repeat_interleave(received)
    received_slot = first_place.repeat_interleave(received) + within
    buffer_row = torch.full((per_rank * rows,), total, dtype=torch.long, device=flat.device)
    buffer_row[received_slot] = torch.arange(total, device=flat.device)
    return ExchangePlan(
        counts=counts,
        kept_counts=kept_counts,
        global_tokens=global_tokens,
        local=local,
        send_splits=kept_counts[rank].view(ranks, per_rank).sum(dim=1).tolist(),
        receive_splits=kept_counts[:, mine].sum(dim=1).tolist(),
        local_experts=per_rank,
        rows=rows,
        received_slot=received_slot,
        buffer_row=buffer_row,
    )


class _AllToAll(Function):
    """all_to_all_single with split sizes, differentiable: the gradient goes back the same way."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, output_splits: list[int], input_splits: list[int], group):
        ctx.splits, ctx.group, ctx.input_rows = (output_splits, input_splits), group, rows.shape[0]
        out = rows.new_empty(sum(output_splits), *rows.shape[1:])
        dist.all_to_all_single(out, rows.contiguous(), output_splits, input_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        output_splits, input_splits = ctx.splits
        return _AllToAll.apply(grad.contiguous(), input_splits, output_splits, ctx.group), None, None, None


class _AllReduce(Function):
    """Sum over the group, differentiable: every rank's value is the group's, so the gradient
    is the sum of every rank's gradient."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group):
        ctx.group = group
        tensor = tensor.clone()
        dist.all_reduce(tensor, group=group)
        return tensor

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _AllReduce.apply(grad.contiguous(), ctx.group), None
