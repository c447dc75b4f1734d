"""The inference KV cache: one pool of fixed-size blocks per layer (paged attention, vLLM's
layout idea). A sequence owns a list of blocks (its block table), taken as its tokens arrive, so
memory follows the tokens in use rather than slots × context length. Install
`lmforge-model[torch]` for torch.

Behind the pool's `num_blocks` blocks each layer's tensor holds one more, the scratch block
(index `num_blocks`), which the block manager never hands out: the rows that pad a batch up to a
CUDA graph's captured size (lmforge.inference.cuda_graphs) write their keys and values there and
attend to it alone, so padding never touches a sequence's blocks. `keys`/`values` are the pool's
views (without it), `layer_keys`/`layer_values` the whole tensors attention writes to."""

from __future__ import annotations

import torch

from lmforge.model.config import GPTConfig


class PagedKVCache:
    """Keys and values of `num_blocks` blocks of `block_size` tokens: per layer one
    (num_blocks · block_size, kv_heads, head_dim) tensor each, addressed by a token's slot
    (block · block_size + offset). Only the key/value heads are held: grouped-query attention
    shrinks the cache by n_head/kv_heads against multi-head attention. Which block belongs to
    which sequence is the engine's bookkeeping (lmforge.inference.block_manager)."""

    def __init__(self, config: GPTConfig, num_blocks: int, block_size: int = 16, device=None,
                 dtype: torch.dtype = torch.float32):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a KV cache needs at least one block of one token, got {num_blocks} × {block_size}")
        shape = ((num_blocks + 1) * block_size, config.kv_heads, config.head_dim)  # + the scratch block
        self.layer_keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.layer_values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        pool = num_blocks * block_size
        self.keys = [tensor[:pool] for tensor in self.layer_keys]
        self.values = [tensor[:pool] for tensor in self.layer_values]
        self.num_blocks, self.block_size = num_blocks, block_size
        self.scratch_block = num_blocks

    @property
    def total_blocks(self) -> int:
        """The pool's blocks and the scratch block."""
        return self.num_blocks + 1

    @staticmethod
    def bytes_per_token(config: GPTConfig, dtype: torch.dtype = torch.float32) -> int:
        """Cache bytes one token takes: a key and a value per layer and key/value head."""
        return 2 * config.n_layer * config.kv_heads * config.head_dim * dtype.itemsize

    @classmethod
    def blocks_for_bytes(cls, config: GPTConfig, budget: int, block_size: int,
                         dtype: torch.dtype = torch.float32) -> int:
        """How many whole blocks a budget of `budget` bytes holds."""
        return budget // (block_size * cls.bytes_per_token(config, dtype))

    @property
    def bytes(self) -> int:
        """The pool's bytes (the one scratch block beside it is not counted)."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)
