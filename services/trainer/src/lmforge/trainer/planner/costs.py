"""A run's totals: training FLOPs, GPU-seconds, wall-clock days and cost.

The arithmetic of the seeds' 70B design, written once: 6 × 70e9 parameters × 1.5e12 tokens ≈
6.3e23 FLOPs; at 400e12 FLOP/s × 0.45 per GPU that is ≈ 3.5e9 GPU-seconds (the seed wrote
"3.5M", a slip of three orders of magnitude), ≈ 40 days on 1,024 H100s.
"""

from __future__ import annotations

import math

SECONDS_PER_DAY = 86_400


def training_flops(params: float, tokens: float) -> float:
    """6·N·D (Kaplan et al. 2020): 2 FLOPs per parameter per token forward, 4 backward."""
    return 6 * params * tokens


def gpu_seconds(flops: float, peak_flops: float, mfu: float) -> float:
    return flops / (peak_flops * mfu)


def wall_clock_days(gpu_seconds_total: float, gpus: int) -> float:
    return gpu_seconds_total / gpus / SECONDS_PER_DAY


def cost_usd(gpu_seconds_total: float, usd_per_gpu_hour: float | None) -> float | None:
    return None if usd_per_gpu_hour is None else gpu_seconds_total / 3600 * usd_per_gpu_hour


def run_totals(
    tokens: float, tokens_per_step: int, step_seconds: float, gpus: int, usd_per_gpu_hour: float | None
) -> dict[str, float | int | None]:
    """Steps to see `tokens`, and the time and cost of that many steps of `step_seconds`."""
    steps = math.ceil(tokens / tokens_per_step)
    seconds = steps * step_seconds
    total_gpu_seconds = seconds * gpus
    return {
        "steps": steps,
        "wall_clock_seconds": seconds,
        "wall_clock_days": seconds / SECONDS_PER_DAY,
        "gpu_seconds": total_gpu_seconds,
        "gpu_hours": total_gpu_seconds / 3600,
        "cost_usd": cost_usd(total_gpu_seconds, usd_per_gpu_hour),
    }
