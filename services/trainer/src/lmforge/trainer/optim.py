"""AdamW with decoupled weight decay on matrices only, and the learning-rate schedules."""

from __future__ import annotations

import math

import torch

from lmforge.trainer.config import OptimSection


def build_optimizer(model: torch.nn.Module, config: OptimSection, fused: bool) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.eps, fused=fused)


def learning_rate(step: int, total_steps: int, config: OptimSection) -> float:
    """Linear warmup, then cosine to min_lr, or warmup-stable-decay (linear decay at the end)."""
    peak, floor = config.lr, config.lr * config.min_lr_ratio
    if step < config.warmup_steps:
        return peak * (step + 1) / config.warmup_steps
    if config.schedule == "cosine":
        span = max(1, total_steps - config.warmup_steps)
        progress = min(1.0, (step - config.warmup_steps) / span)
        return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))
    decay_steps = max(1, int(total_steps * config.decay_fraction))
    decay_start = total_steps - decay_steps
    if step < decay_start:
        return peak
    return peak - (peak - floor) * min(1.0, (step - decay_start + 1) / decay_steps)
