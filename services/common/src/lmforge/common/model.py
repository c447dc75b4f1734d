"""The GPT: a decoder-only transformer in the nanoGPT spirit, shared by the trainer,
inference and canary (install `lmforge-common[model]` for torch).

Pre-norm blocks, rotary (default) or learned positions, `scaled_dot_product_attention`
(flash attention on GPU), tied input/output embeddings, residual projections initialised
with std 0.02/sqrt(2·n_layer).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from lmforge.common.config import StrictModel
from lmforge.common.errors import ConfigError

# GPT-2 / GPT-3 shapes (Radford et al. 2019; Brown et al. 2020, Table 2.1), vocab padded to 64.
PRESETS: dict[str, dict] = {
    "tiny": {"n_layer": 4, "n_head": 4, "n_embd": 128, "context_length": 256, "vocab_size": 8192},
    "124m": {"n_layer": 12, "n_head": 12, "n_embd": 768, "context_length": 1024, "vocab_size": 50304},
    "350m": {"n_layer": 24, "n_head": 16, "n_embd": 1024, "context_length": 1024, "vocab_size": 50304},
    "760m": {"n_layer": 24, "n_head": 16, "n_embd": 1536, "context_length": 1024, "vocab_size": 50304},
    "1.3b": {"n_layer": 24, "n_head": 16, "n_embd": 2048, "context_length": 1024, "vocab_size": 50304},
}


class GPTConfig(StrictModel):
    vocab_size: int = Field(8192, ge=2)
    context_length: int = Field(256, ge=1)
    n_layer: int = Field(4, ge=1)
    n_head: int = Field(4, ge=1)
    n_embd: int = Field(128, ge=1)
    mlp_ratio: int = Field(4, ge=1)
    positions: Literal["rope", "learned"] = "rope"
    rope_theta: float = Field(10_000.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    bias: bool = False
    norm_eps: float = Field(1e-5, gt=0)

    @model_validator(mode="after")
    def _shapes(self) -> GPTConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.positions == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError("rotary positions need an even head dimension")
        return self

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def preset(cls, name: str, **overrides) -> GPTConfig:
        if name not in PRESETS:
            raise ConfigError(f"model.preset: unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls.model_validate({**PRESETS[name], **overrides})


def rope_tables(config: GPTConfig, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (context_length, head_dim/2)."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, half, device=device, dtype=torch.float32) / half))
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


class KVCache:
    """Keys and values of up to `slots` sequences, each up to the context length: one
    (slots, heads, context, head_dim) tensor pair per layer. A running sequence owns a slot."""

    def __init__(self, config: GPTConfig, slots: int, device=None, dtype=torch.float32):
        shape = (slots, config.n_head, config.context_length, config.head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.slots = slots

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        batch, time, channels = x.shape
        heads = self.config.n_head
        q, k, v = self.qkv(x).split(channels, dim=2)
        q, k, v = (t.view(batch, time, heads, channels // heads).transpose(1, 2) for t in (q, k, v))
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        dropout = self.config.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
        return self.proj(y.transpose(1, 2).contiguous().view(batch, time, channels))

    def forward_cached(self, x: torch.Tensor, rope, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                       positions: torch.Tensor, first_slot: int | None = None) -> torch.Tensor:
        """New tokens x (B, T, C) at `positions` (B, T) of the sequences in cache `slots` (B,):
        their keys and values are written into the cache, then they attend to every cached
        position up to their own. `first_slot` says the slots are first_slot..first_slot+B-1,
        so the cache is read through a view instead of a gathering copy."""
        batch, time, channels = x.shape
        heads = self.config.n_head
        q, k, v = self.qkv(x).split(channels, dim=2)
        q, k, v = (t.view(batch, time, heads, channels // heads).transpose(1, 2) for t in (q, k, v))
        if rope is not None:
            q, k = apply_rope_at(q, *rope, positions), apply_rope_at(k, *rope, positions)
        rows = slots[:, None]
        keys[rows, :, positions] = k.transpose(1, 2).to(keys.dtype)  # (B, T, H, D) at (slot, :, position)
        values[rows, :, positions] = v.transpose(1, 2).to(values.dtype)
        span = int(positions.max()) + 1
        mask = torch.arange(span, device=x.device)[None, None, None, :] <= positions[:, None, :, None]
        rows_read = slice(first_slot, first_slot + batch) if first_slot is not None else slots
        y = F.scaled_dot_product_attention(q, keys[rows_read, :, :span].to(q.dtype),
                                           values[rows_read, :, :span].to(q.dtype), attn_mask=mask)
        return self.proj(y.transpose(1, 2).contiguous().view(batch, time, channels))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        hidden = config.mlp_ratio * config.n_embd
        self.fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.proj = nn.Linear(hidden, config.n_embd, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)
        self.mlp = MLP(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, rope) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.ln_1(x), rope))
        return x + self.dropout(self.mlp(self.ln_2(x)))

    def forward_cached(self, x: torch.Tensor, rope, keys, values, slots, positions, first_slot=None) -> torch.Tensor:
        x = x + self.attn.forward_cached(self.ln_1(x), rope, keys, values, slots, positions, first_slot)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.context_length, config.n_embd) if config.positions == "learned" else None
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied embeddings
        if config.positions == "rope":
            cos, sin = rope_tables(config)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = residual_std if name.endswith(("attn.proj", "mlp.proj")) else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits (B, T, vocab); with targets also the mean cross-entropy loss."""
        time = idx.shape[1]
        if time > self.config.context_length:
            raise ValueError(f"sequence of {time} tokens exceeds the context length {self.config.context_length}")
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(time, device=idx.device))
        x = self.drop(x)
        rope = (self.rope_cos, self.rope_sin) if self.wpe is None else None
        for block in self.blocks:
            x = block(x, rope)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    @torch.no_grad()
    def forward_cached(self, idx: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                       slots: torch.Tensor, first_slot: int | None = None) -> torch.Tensor:
        """Inference with a KV cache: logits (B, T, vocab) for new tokens idx (B, T) at
        `positions` (B, T) of the sequences held in cache `slots` (B,). Prefill passes a
        prompt (positions 0..T-1); decode passes one token per sequence. Pass `first_slot`
        when the slots are consecutive (first_slot, first_slot+1, …): the cache is then read
        without copying."""
        if int(positions.max()) >= self.config.context_length:
            raise ValueError(f"position {int(positions.max())} exceeds the context length "
                             f"{self.config.context_length}")
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(positions)
        rope = (self.rope_cos, self.rope_sin) if self.wpe is None else None
        for layer, block in enumerate(self.blocks):
            x = block.forward_cached(x, rope, cache.keys[layer], cache.values[layer], slots, positions, first_slot)
        return self.lm_head(self.ln_f(x))

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters counted once (the tied head is the embedding)."""
        total = sum(p.numel() for p in self.parameters())
        if non_embedding:
            total -= self.wte.weight.numel() + (self.wpe.weight.numel() if self.wpe is not None else 0)
        return total


def flops_per_token(config: GPTConfig, seq_len: int | None = None) -> float:
    """Training FLOPs per token, PaLM appendix B / nanoGPT: 6·N + 12·L·d·T, where N counts
    the matmul parameters (blocks and the output head; embeddings lookups are free) and the
    second term is attention's QKᵀ and AV over a context of T tokens."""
    seq_len = seq_len or config.context_length
    d, layers = config.n_embd, config.n_layer
    per_block = 4 * d * d + 2 * config.mlp_ratio * d * d  # qkv + proj, fc + proj
    matmul_params = layers * per_block + config.vocab_size * d
    return 6 * matmul_params + 12 * layers * d * seq_len
