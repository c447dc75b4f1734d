"""AdamW with decoupled weight decay on matrices only, and the learning-rate schedules."""

from __future__ import annotations

import math
from typing import Protocol

import torch

from lmforge.trainer.config import OptimSection


def build_optimizer(model: torch.nn.Module, config: OptimSection, fused: bool) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.eps, fused=fused)


class TokenClock(Protocol):
    """What the LR schedule reads of the run's plan (lmforge.trainer.schedule.TrainingPlan)."""

    steps: int

    def tokens_before(self, step: int) -> int: ...

    def tokens_after(self, step: int) -> int: ...


def learning_rate(step: int, plan: TokenClock, config: OptimSection) -> float:
    """Linear warmup, then cosine to min_lr, or warmup-stable-decay (linear decay at the end), placed
    in consumed tokens: under a batch-size ramp a step's LR is where its tokens are in the run, and it
    is not rescaled with the batch. Warmup ends at the tokens of the first warmup_steps steps, WSD's
    decay starts at the first step at or past (1 - decay_fraction) of the run's tokens. With one
    global batch this is the schedule over steps."""
    peak, floor = config.lr, config.lr * config.min_lr_ratio
    total, warmup_end = plan.tokens_after(plan.steps - 1), plan.tokens_before(min(config.warmup_steps, plan.steps))
    if step < config.warmup_steps:
        return peak * plan.tokens_after(step) / warmup_end
    if config.schedule == "cosine":
        span = max(1, total - warmup_end)
        progress = min(1.0, (plan.tokens_before(step) - warmup_end) / span)
        return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))
    decay_start = decay_start_step(plan, config)
    if step < decay_start:
        return peak
    start_tokens = plan.tokens_before(decay_start)
    return peak - (peak - floor) * min(1.0, (plan.tokens_after(step) - start_tokens) / max(1, total - start_tokens))


def decay_start_step(plan: TokenClock, config: OptimSection) -> int:
    """WSD's first decaying step: the first that begins at or past (1 - decay_fraction) of the run's tokens
    (at least one step decays)."""
    total = plan.tokens_after(plan.steps - 1)
    boundary = total - int(total * config.decay_fraction)
    lo, hi = 0, plan.steps - 1
    while lo < hi:  # tokens_before grows with the step
        mid = (lo + hi) // 2
        if plan.tokens_before(mid) >= boundary:
            hi = mid
        else:
            lo = mid + 1
    return lo
