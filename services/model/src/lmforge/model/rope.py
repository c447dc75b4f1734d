"""Rotary position embeddings (rotate-half convention, as transformers' Llama), with Llama 3's
frequency scaling as an option (install `lmforge-model[torch]` for torch)."""

from __future__ import annotations

import math

import torch

from lmforge.model.config import GPTConfig, RopeScaling


def rope_frequencies(config: GPTConfig, device=None) -> torch.Tensor:
    """The inverse frequencies θ^(-2i/head_dim), i < head_dim/2, scaled when config.rope_scaling is set."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, half, device=device, dtype=torch.float32) / half))
    if config.rope_scaling is not None:
        inv_freq = llama3_scaled(inv_freq, config.rope_scaling)
    return inv_freq


def llama3_scaled(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Llama 3.1's scaling, the same arithmetic as transformers' `_compute_llama3_parameters`
    (so logits match a transformers Llama to rounding)."""
    original = scaling.original_context_length
    low_freq_wavelen = original / scaling.low_freq_factor
    high_freq_wavelen = original / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (original / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(config: GPTConfig, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (context_length, head_dim/2)."""
    inv_freq = rope_frequencies(config, device)
    angles = torch.outer(torch.arange(config.context_length, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, D) by position, rotate-half convention."""
    first, second = x.float().chunk(2, dim=-1)
    cos, sin = cos[: x.shape[-2]], sin[: x.shape[-2]]
    rotated = torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)
    return rotated.type_as(x)


def apply_rope_at(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """apply_rope for tokens at arbitrary positions: x (B, H, T, D), positions (B, T)."""
    cos, sin = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)  # (B, 1, T, D/2)
    first, second = x.float().chunk(2, dim=-1)
    rotated = torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)
    return rotated.type_as(x)


def set_rope(model: torch.nn.Module, config: GPTConfig, theta: float | None,
             scaling: RopeScaling | None) -> GPTConfig:
    """Recompute the RoPE tables of every module of `model` holding them (a GPT, its pipeline chunks) for
    base `theta` and `scaling` (None: config's own), in place; returns config with them. A training
    schedule's stage sets its RoPE so (lmforge.trainer.schedule)."""
    updates = {key: value for key, value in (("rope_theta", theta), ("rope_scaling", scaling)) if value is not None}
    config = config.model_copy(update=updates)
    if config.positions != "rope":
        return config
    tables = None
    for module in model.modules():
        cos, sin = getattr(module, "rope_cos", None), getattr(module, "rope_sin", None)
        if isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor):
            if tables is None:
                tables = rope_tables(config, cos.device)
            cos.copy_(tables[0].to(cos.dtype))
            sin.copy_(tables[1].to(sin.dtype))
    return config
