"""The inference KV cache: a slot per running sequence (install `lmforge-common[model]` for torch)."""

from __future__ import annotations

import torch

from lmforge.common.model_config import GPTConfig


class KVCache:
    """Keys and values of up to `slots` sequences, each up to the context length: one
    (slots, kv_heads, context, head_dim) tensor pair per layer. A running sequence owns a slot.
    Only the key/value heads are held: grouped-query attention shrinks the cache by
    n_head/kv_heads against multi-head attention."""

    def __init__(self, config: GPTConfig, slots: int, device=None, dtype=torch.float32):
        shape = (slots, config.kv_heads, config.context_length, config.head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.slots = slots

    @staticmethod
    def bytes_per_token(config: GPTConfig, dtype: torch.dtype = torch.float32) -> int:
        """Cache bytes one token takes: a key and a value per layer and key/value head."""
        return 2 * config.n_layer * config.kv_heads * config.head_dim * dtype.itemsize

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)
