"""Each model preset's shape and size, as `lmforge-train presets` prints them (install
`lmforge-model[torch]` for torch; parameters are counted on the meta device)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from lmforge.model.config import PRESETS, GPTConfig
from lmforge.model.kv_cache import PagedKVCache
from lmforge.model.transformer import parameter_counts


@dataclass(frozen=True)
class PresetSize:
    preset: str
    layers: int
    width: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    experts: str  # "E×top-k", or "" for a dense MLP
    vocab: int
    context: int
    parameters: int
    active_parameters: int  # per token: an MoE's top_k experts, not all E
    kv_cache_bytes_per_token: int  # bf16


def preset_size(name: str) -> PresetSize:
    config = GPTConfig.preset(name)
    total, active = parameter_counts(config)
    experts = f"{config.moe.num_experts}×top-{config.moe.top_k}" if config.moe else ""
    return PresetSize(name, config.n_layer, config.n_embd, config.n_head, config.kv_heads, config.ffn_hidden_size,
                      experts, config.vocab_size, config.context_length, total, active,
                      PagedKVCache.bytes_per_token(config, torch.bfloat16))


def preset_sizes() -> list[PresetSize]:
    return [preset_size(name) for name in PRESETS]


def format_preset_sizes(sizes: list[PresetSize]) -> str:
    """A fixed-width table, one preset a line."""
    header = ("preset", "layers", "width", "heads", "kv", "ffn", "experts", "vocab", "context", "parameters",
              "active", "KV B/token")
    rows = [(s.preset, s.layers, s.width, s.heads, s.kv_heads, s.ffn_hidden, s.experts or "-", s.vocab, s.context,
             f"{s.parameters:,}", f"{s.active_parameters:,}", f"{s.kv_cache_bytes_per_token:,}") for s in sizes]
    cells = [tuple(map(str, row)) for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in cells]
    return "\n".join(lines)


def preset_sizes_json(sizes: list[PresetSize]) -> list[dict]:
    return [asdict(s) for s in sizes]
