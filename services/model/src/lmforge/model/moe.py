"""Mixture-of-experts MLP: a router picks top-k of E experts per token (install
`lmforge-model[torch]` for torch).

One MoE layer runs in steps, each its own function, so that expert parallelism swaps only
dispatch and combine (an all_to_all each way over the (E, capacity, dim) buffer, GShard's
fixed-capacity layout) and shards dim 0 of the expert weights:

  route     router logits → softmax over all E (fp32) → top-k experts per token and their weights
  plan      each (token, choice) assignment gets a slot (expert, position); positions are given in
            token order, and an assignment past its expert's capacity is dropped
  dispatch  tokens → expert inputs (E, capacity, dim)
  experts   one grouped matmul per projection over the batched (E, ·, ·) weights
  combine   expert outputs → tokens, weighted; a dropped assignment adds nothing (the block's
            residual connection carries the token)

Capacity applies in training (`capacity_factor`); in eval mode (validation, inference, the HF
comparison) `eval_capacity_factor` applies, None by default: no token is dropped, as in
transformers' Mixtral, and a token's output never depends on the rest of its batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lmforge.model.moe_config import MoEConfig

__all__ = ["MoE", "MoEConfig", "moe_layers", "update_router_biases"]


STAT_NAMES = ("load_max_over_mean", "dropped_fraction", "balance_loss", "z_loss")


@dataclass(frozen=True)
class Routing:
    """The router's choice for N tokens."""

    logits: torch.Tensor  # (N, E) fp32
    probs: torch.Tensor  # (N, E) fp32, softmax over all experts
    experts: torch.Tensor  # (N, k) chosen expert ids, highest score first
    weights: torch.Tensor  # (N, k) fp32 combine weights


@dataclass(frozen=True)
class DispatchPlan:
    """Where each of the N·k (token, choice) assignments goes in the (E, capacity) expert buffer."""

    capacity: int
    slot: torch.Tensor  # (N, k) expert·capacity + position (0 where dropped)
    kept: torch.Tensor  # (N, k) False where the expert was full
    slot_token: torch.Tensor  # (E·capacity,) the token in each slot; N (a zero row) where empty
    load: torch.Tensor  # (E,) assignments per expert, before dropping


class Router(nn.Module):
    """Linear dim → E without bias, softmax over all E in fp32, top-k. A token's k weights are
    its chosen experts' probabilities renormalised to sum to 1 (Mixtral's choice: the same as a
    softmax over the k chosen logits); `renormalize: false` keeps the raw probabilities. With
    balancing=bias a per-expert `selection_bias` (a buffer, checkpointed) is added to the scores
    that choose the experts but not to the weights (DeepSeek-V3)."""

    def __init__(self, dim: int, config: MoEConfig):
        super().__init__()
        self.top_k, self.renormalize = config.top_k, config.renormalize
        self.weight = nn.Parameter(torch.empty(config.num_experts, dim))
        if config.balancing == "bias":
            self.register_buffer("selection_bias", torch.zeros(config.num_experts))
        else:
            self.selection_bias = None

    def forward(self, tokens: torch.Tensor) -> Routing:
        with torch.autocast(tokens.device.type, enabled=False):
            logits = F.linear(tokens.float(), self.weight.float())
        probs = logits.softmax(dim=-1)
        scores = probs if self.selection_bias is None else probs + self.selection_bias
        experts = scores.topk(self.top_k, dim=-1).indices
        weights = probs.gather(-1, experts)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return Routing(logits, probs, experts, weights)


def expert_capacity(tokens: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
    """ceil(capacity_factor · k · tokens / E), the most assignments one expert takes."""
    return max(1, math.ceil(capacity_factor * top_k * tokens / num_experts))


def plan_dispatch(experts: torch.Tensor, num_experts: int, capacity: int | None) -> DispatchPlan:
    """Slots for the assignments `experts` (N, k): an expert's positions go in token order (a
    token picks an expert at most once) and those at or past `capacity` are dropped. capacity
    None: as many as the busiest expert needs, nothing dropped."""
    tokens, k = experts.shape
    flat = experts.reshape(-1)  # assignment a = token·k + choice
    load = torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    if capacity is None:
        capacity = max(1, int(load.max()))
    by_expert = torch.argsort(flat, stable=True)  # grouped by expert, token order within
    first_of_expert = load.cumsum(0) - load
    position = torch.empty_like(flat)
    position[by_expert] = torch.arange(flat.numel(), device=flat.device) - first_of_expert[flat[by_expert]]
    kept = position < capacity
    slot = torch.where(kept, flat * capacity + position, 0)
    # Dropped assignments write to one spare slot past the end, which is cut off.
    spare = num_experts * capacity
    token_of = torch.arange(tokens, device=flat.device).repeat_interleave(k)
    slot_token = torch.full((spare + 1,), tokens, dtype=torch.long, device=flat.device)
    slot_token.scatter_(0, torch.where(kept, slot, spare), token_of)
    return DispatchPlan(capacity, slot.view(tokens, k), kept.view(tokens, k), slot_token[:spare], load)


def dispatch(tokens: torch.Tensor, plan: DispatchPlan, num_experts: int) -> torch.Tensor:
    """Tokens (N, dim) → expert inputs (E, capacity, dim); empty slots are zeros."""
    padded = torch.cat((tokens, tokens.new_zeros(1, tokens.shape[-1])))
    return padded[plan.slot_token].view(num_experts, plan.capacity, tokens.shape[-1])


def combine(expert_outputs: torch.Tensor, plan: DispatchPlan, weights: torch.Tensor) -> torch.Tensor:
    """Expert outputs (E, capacity, dim) → (N, dim): each token's kept assignments, weighted
    and summed over its k choices (a fixed order: deterministic)."""
    tokens, k = plan.slot.shape
    picked = expert_outputs.reshape(-1, expert_outputs.shape[-1])[plan.slot.view(-1)].view(tokens, k, -1)
    kept_weights = torch.where(plan.kept, weights, 0.0).to(picked.dtype)
    return torch.bmm(kept_weights.unsqueeze(1), picked).squeeze(1)


class GroupedExperts(nn.Module):
    """E expert MLPs as batched weights, (E, C, dim) → (E, C, dim): gate/up (E, dim, hidden) and
    down (E, hidden, dim) for swiglu, fc (E, dim, hidden) and proj (E, hidden, dim) for gelu
    (tanh approximation, as the dense MLP). Dim 0 of every parameter is the expert."""

    def __init__(self, num_experts: int, dim: int, hidden: int, activation: Literal["gelu", "swiglu"], bias: bool):
        super().__init__()
        if activation not in ("gelu", "swiglu"):
            raise ValueError(f"unknown activation {activation!r}; choose gelu or swiglu")
        self.activation = activation
        inputs = ("gate", "up") if activation == "swiglu" else ("fc",)
        output = "down" if activation == "swiglu" else "proj"
        self.input_names, self.output_name = inputs, output
        for name in inputs:
            self.register_parameter(name, nn.Parameter(torch.empty(num_experts, dim, hidden)))
            self.register_parameter(f"{name}_bias", nn.Parameter(torch.zeros(num_experts, hidden)) if bias else None)
        self.register_parameter(output, nn.Parameter(torch.empty(num_experts, hidden, dim)))
        self.register_parameter(f"{output}_bias", nn.Parameter(torch.zeros(num_experts, dim)) if bias else None)

    def reset_parameters(self, residual_std: float) -> None:
        for name in self.input_names:
            nn.init.normal_(getattr(self, name), mean=0.0, std=0.02)
        nn.init.normal_(getattr(self, self.output_name), mean=0.0, std=residual_std)
        for name in (*self.input_names, self.output_name):
            if getattr(self, f"{name}_bias") is not None:
                nn.init.zeros_(getattr(self, f"{name}_bias"))

    def _project(self, x: torch.Tensor, name: str) -> torch.Tensor:
        bias = getattr(self, f"{name}_bias")
        if bias is None:
            return torch.bmm(x, getattr(self, name))
        return torch.baddbmm(bias.unsqueeze(1), x, getattr(self, name))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation == "swiglu":
            hidden = F.silu(self._project(x, "gate")) * self._project(x, "up")
        else:
            hidden = F.gelu(self._project(x, "fc"), approximate="tanh")
        return self._project(hidden, self.output_name)


def balance_loss(routing: Routing, load: torch.Tensor) -> torch.Tensor:
    """Switch/GShard load balancing, E · Σ_e f_e · P_e: f_e the fraction of the N·k assignments
    routed to e (before dropping), P_e the mean router probability of e. 1 when uniform."""
    num_experts = routing.probs.shape[-1]
    fraction = load.float() / routing.experts.numel()
    return num_experts * (fraction * routing.probs.mean(dim=0)).sum()


def z_loss(routing: Routing) -> torch.Tensor:
    """Router z-loss (ST-MoE): mean over tokens of logsumexp(logits)²."""
    return torch.logsumexp(routing.logits, dim=-1).square().mean()


class MoE(nn.Module):
    """The MoE MLP: (B, T, dim) → (B, T, dim); see the module docstring for the steps.

    After each forward, `aux_loss` is the scalar to add to the training loss (coefficients
    applied: aux_loss_coef · balance + z_loss_coef · z; no balance term with balancing=bias) and
    `stats` its figures as floats: load_max_over_mean (busiest expert's assignments over the mean),
    dropped_fraction (of the N·k assignments), balance_loss and z_loss (before the coefficients;
    balance_loss is 1 for a uniform router and is reported under bias balancing too).

    With balancing=bias each training forward adds its expert loads to a pending total, which
    `update_router_biases` (after the optimizer step) turns into the bias update. Activation
    checkpointing recomputes the forward and counts every load twice; the update uses only the
    loads' signs relative to their mean, so that changes nothing.
    """

    def __init__(
        self,
        dim: int,
        hidden: int,
        config: MoEConfig,
        activation: Literal["gelu", "swiglu"],
        bias: bool,
        *,
        residual_std: float = 0.02,
    ):
        super().__init__()
        self.config = config
        hidden = config.expert_hidden or hidden
        self.router = Router(dim, config)
        self.experts = GroupedExperts(config.num_experts, dim, hidden, activation, bias)
        self.shared_expert = GroupedExperts(1, dim, hidden, activation, bias) if config.shared_expert else None
        self.residual_std = residual_std
        self.aux_loss = torch.zeros(())
        self._stats: torch.Tensor | None = None  # STAT_NAMES, detached; read as floats only when asked
        self._pending_load: torch.Tensor | None = None
        self.reset_parameters()

    def reset_parameters(self, residual_std: float | None = None) -> None:
        """Router and input projections std 0.02, output projections `residual_std` (the model's
        residual init), biases zero; the selection bias is left as it is."""
        if residual_std is not None:
            self.residual_std = residual_std
        nn.init.normal_(self.router.weight, mean=0.0, std=0.02)
        self.experts.reset_parameters(self.residual_std)
        if self.shared_expert is not None:
            self.shared_expert.reset_parameters(self.residual_std)

    def capacity(self, tokens: int) -> int | None:
        """Slots per expert for a batch of `tokens` (None: unlimited, in eval mode by default)."""
        factor = self.config.capacity_factor if self.training else self.config.eval_capacity_factor
        if factor is None:
            return None
        return expert_capacity(tokens, self.config.top_k, self.config.num_experts, factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        routing = self.router(tokens)
        plan = plan_dispatch(routing.experts, self.config.num_experts, self.capacity(tokens.shape[0]))
        expert_outputs = self.experts(dispatch(tokens, plan, self.config.num_experts))
        out = combine(expert_outputs, plan, routing.weights)
        if self.shared_expert is not None:
            out = out + self.shared_expert(tokens.unsqueeze(0)).squeeze(0)
        self._account(routing, plan)
        return out.view(x.shape)

    def _account(self, routing: Routing, plan: DispatchPlan) -> None:
        dropped = 1.0 - plan.kept.float().mean()
        self._record(balance_loss(routing, plan.load), z_loss(routing), plan.load, dropped, plan.load)

    def _record(
        self, balance: torch.Tensor, z: torch.Tensor, load: torch.Tensor, dropped: torch.Tensor, own_load: torch.Tensor
    ) -> None:
        """Sets aux_loss and the stats from the forward's figures; `own_load` (this process's
        tokens' loads, which the bias update sums over ranks) joins the pending total. Expert
        parallelism passes figures taken over every rank's tokens (lmforge.trainer.expert_parallel)."""
        aux = self.config.z_loss_coef * z
        if self.config.balancing == "aux_loss":
            aux = aux + self.config.aux_loss_coef * balance
        self.aux_loss = aux
        load = load.float()
        self._stats = torch.stack((load.max() / load.mean(), dropped, balance, z)).detach()
        if self.training and self.router.selection_bias is not None:
            own_load = own_load.float()
            self._pending_load = own_load if self._pending_load is None else self._pending_load + own_load

    @property
    def stats(self) -> dict[str, float]:
        """The last forward's figures (empty before the first)."""
        return {} if self._stats is None else dict(zip(STAT_NAMES, self._stats.tolist(), strict=True))

    def take_pending_load(self) -> torch.Tensor:
        """The expert loads of the training forwards since the last call (zeros if none), reset."""
        load, self._pending_load = self._pending_load, None
        if load is None:
            load = torch.zeros(self.config.num_experts, device=self.router.weight.device)
        return load

    @torch.no_grad()
    def update_bias(self, load: torch.Tensor) -> None:
        """DeepSeek-V3's update from one step's loads (E,): an overloaded expert's bias goes down
        by bias_update_rate, an underloaded one's up."""
        bias = self.router.selection_bias
        bias += self.config.bias_update_rate * torch.sign(load.mean() - load).to(bias)


def moe_layers(model: nn.Module) -> list[MoE]:
    """The model's MoE layers (through any DDP/FSDP/compile wrapper), in module order."""
    return [module for module in model.modules() if isinstance(module, MoE)]


def update_router_biases(model: nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """The trainer's hook after each optimizer step, for balancing=bias (a no-op otherwise):
    every bias-balanced layer's pending loads, summed over the ranks of `group` (the default
    group when torch.distributed is initialised; one all_reduce for all layers) so that every
    rank's biases stay identical, update its selection bias."""
    layers = [layer for layer in moe_layers(model) if layer.router.selection_bias is not None]
    if not layers:
        return
    loads = torch.stack([layer.take_pending_load() for layer in layers])
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(loads, group=group)
    for layer, load in zip(layers, loads, strict=True):
        layer.update_bias(load)
