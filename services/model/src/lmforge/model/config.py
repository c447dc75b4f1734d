"""The decoder's configuration and its presets (pydantic only; the modules are in
lmforge.model.transformer, which re-exports these names).

One decoder covers the GPT-2 shape (LayerNorm, GELU MLP, full multi-head attention) and the
Llama shape (RMSNorm, SwiGLU MLP, grouped-query attention, RoPE θ 500,000 with Llama 3's
frequency scaling), with QK-norm, biases, untied embeddings and a mixture-of-experts MLP as
options.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from lmforge.common.config import StrictModel
from lmforge.common.errors import ConfigError
from lmforge.model.moe_config import MoEConfig


class RopeScaling(StrictModel):
    """Llama 3.1's RoPE frequency scaling (transformers' rope_type "llama3"): wavelengths longer
    than original_context_length/low_freq_factor are stretched by `factor`, shorter than
    original_context_length/high_freq_factor are kept, and the band between is interpolated."""

    factor: float = Field(8.0, gt=0)
    low_freq_factor: float = Field(1.0, gt=0)
    high_freq_factor: float = Field(4.0, gt=0)
    original_context_length: int = Field(8192, ge=1)

    @model_validator(mode="after")
    def _band(self) -> RopeScaling:
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError("rope_scaling.high_freq_factor must exceed low_freq_factor")
        return self


class GPTConfig(StrictModel):
    vocab_size: int = Field(8192, ge=2)
    context_length: int = Field(256, ge=1)
    n_layer: int = Field(4, ge=1)
    n_head: int = Field(4, ge=1)
    n_embd: int = Field(128, ge=1)
    n_kv_head: int | None = Field(None, ge=1, description="key/value heads (grouped-query attention; 1 = "
                                  "multi-query); default n_head")
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    mlp: Literal["gelu", "swiglu"] = "gelu"
    mlp_ratio: int = Field(4, ge=1)
    ffn_hidden: int | None = Field(None, ge=1, description="MLP hidden size; default from mlp_ratio (swiglu: "
                                   "Llama's rule, see ffn_hidden_size)")
    multiple_of: int = Field(256, ge=1, description="swiglu: the hidden size is rounded up to a multiple of this")
    ffn_dim_multiplier: float | None = Field(None, gt=0, description="swiglu: Llama's hidden-size multiplier")
    positions: Literal["rope", "learned"] = "rope"
    rope_theta: float = Field(10_000.0, gt=0)
    rope_scaling: RopeScaling | None = None
    qk_norm: bool = Field(False, description="RMSNorm over each head's queries and keys, before RoPE")
    dropout: float = Field(0.0, ge=0, lt=1)
    bias: bool = False
    norm_eps: float = Field(1e-5, gt=0)
    tie_embeddings: bool = Field(True, description="the output head shares the token embedding's weight")
    moe: MoEConfig | None = Field(None, description="a mixture-of-experts MLP in every block; absent: dense")

    @model_validator(mode="after")
    def _shapes(self) -> GPTConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.positions == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError("rotary positions need an even head dimension")
        if self.n_head % self.kv_heads:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.kv_heads})")
        if self.rope_scaling is not None and self.positions != "rope":
            raise ValueError("rope_scaling needs positions: rope")
        return self

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def ffn_hidden_size(self) -> int:
        """The dense MLP's hidden size: ffn_hidden if set; gelu: mlp_ratio·n_embd; swiglu: Llama's
        rule, ⅔ of mlp_ratio·n_embd (three matrices instead of two at about the same parameters),
        times ffn_dim_multiplier, rounded up to a multiple of multiple_of."""
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        hidden = self.mlp_ratio * self.n_embd
        if self.mlp == "gelu":
            return hidden
        hidden = int(2 * hidden / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    @classmethod
    def preset(cls, name: str, **overrides) -> GPTConfig:
        if name not in PRESETS:
            raise ConfigError(f"model.preset: unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls.model_validate({**PRESETS[name], **overrides})


# GPT-2 / GPT-3 shapes (Radford et al. 2019; Brown et al. 2020, Table 2.1), vocab padded to 64.
_GPT2_PRESETS: dict[str, dict] = {
    "tiny": {"n_layer": 4, "n_head": 4, "n_embd": 128, "context_length": 256, "vocab_size": 8192},
    "124m": {"n_layer": 12, "n_head": 12, "n_embd": 768, "context_length": 1024, "vocab_size": 50304},
    "350m": {"n_layer": 24, "n_head": 16, "n_embd": 1024, "context_length": 1024, "vocab_size": 50304},
    "760m": {"n_layer": 24, "n_head": 16, "n_embd": 1536, "context_length": 1024, "vocab_size": 50304},
    "1.3b": {"n_layer": 24, "n_head": 16, "n_embd": 2048, "context_length": 1024, "vocab_size": 50304},
}

_LLAMA = {"norm": "rmsnorm", "mlp": "swiglu", "rope_theta": 500_000.0}
# RoPE scaling as Llama 3.1 (8B, 70B) and Llama 3.2 (1B, 3B) ship it in their HF configs.
_LLAMA_3_1_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_context_length": 8192}
_LLAMA_3_2_ROPE = {**_LLAMA_3_1_ROPE, "factor": 32.0}

# Llama-style shapes. 125m/350m: MobileLLM-125M/350M (Liu et al. 2024; deep and thin, GQA, tied,
# 32,000-token vocabulary). 1b/3b: Llama 3.2 1B/3B. 8b/70b: the Llama 3 paper's Table 3 (Llama 3.1
# configs): FFN sizes from Meta's ffn_dim_multiplier/multiple_of. debug: CPU-test size, the 1B's choices.
_LLAMA_PRESETS: dict[str, dict] = {
    "llama-debug": {**_LLAMA, "n_layer": 4, "n_head": 8, "n_kv_head": 2, "n_embd": 256, "context_length": 256,
                    "vocab_size": 8192, "rope_scaling": _LLAMA_3_2_ROPE},
    "llama-125m": {**_LLAMA, "n_layer": 30, "n_head": 9, "n_kv_head": 3, "n_embd": 576, "context_length": 2048,
                   "vocab_size": 32000},
    "llama-350m": {**_LLAMA, "n_layer": 32, "n_head": 15, "n_kv_head": 5, "n_embd": 960, "context_length": 2048,
                   "vocab_size": 32000},
    "llama-1b": {**_LLAMA, "n_layer": 16, "n_head": 32, "n_kv_head": 8, "n_embd": 2048, "ffn_dim_multiplier": 1.5,
                 "context_length": 8192, "vocab_size": 128256, "rope_scaling": _LLAMA_3_2_ROPE},
    "llama-3b": {**_LLAMA, "n_layer": 28, "n_head": 24, "n_kv_head": 8, "n_embd": 3072, "ffn_dim_multiplier": 1.0,
                 "context_length": 8192, "vocab_size": 128256, "rope_scaling": _LLAMA_3_2_ROPE},
    "llama-8b": {**_LLAMA, "n_layer": 32, "n_head": 32, "n_kv_head": 8, "n_embd": 4096, "ffn_dim_multiplier": 1.3,
                 "multiple_of": 1024, "context_length": 8192, "vocab_size": 128256, "tie_embeddings": False,
                 "rope_scaling": _LLAMA_3_1_ROPE},
    "llama-70b": {**_LLAMA, "n_layer": 80, "n_head": 64, "n_kv_head": 8, "n_embd": 8192, "ffn_dim_multiplier": 1.3,
                  "multiple_of": 4096, "context_length": 8192, "vocab_size": 128256, "tie_embeddings": False,
                  "rope_scaling": _LLAMA_3_1_ROPE},
}

_MOE_PRESETS: dict[str, dict] = {
    "moe-debug": {**_LLAMA_PRESETS["llama-debug"], "moe": {"num_experts": 4, "top_k": 2}},
    "moe-8x1b": {**_LLAMA_PRESETS["llama-1b"], "moe": {"num_experts": 8, "top_k": 2}},
}

PRESETS: dict[str, dict] = {**_GPT2_PRESETS, **_LLAMA_PRESETS, **_MOE_PRESETS}
