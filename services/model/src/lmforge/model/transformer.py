"""The decoder-only transformer shared by the trainer, inference and canary, in the nanoGPT
spirit (install `lmforge-model[torch]` for torch).

Pre-norm blocks (LayerNorm or RMSNorm), rotary (default) or learned positions, grouped-query
`scaled_dot_product_attention` (flash attention on GPU) with optional QK-norm, a GELU or SwiGLU
MLP or a mixture of experts (lmforge.model.moe), tied or untied embeddings, residual
projections initialised with std 0.02/sqrt(2·n_layer). The configuration and presets are in
lmforge.model.config, RoPE in lmforge.model.rope, the inference cache in
lmforge.model.kv_cache (paged; attention over it in lmforge.model.paged_attention); all are importable from here.
With `documents` a packed sequence attends within each document (lmforge.model.document_mask).

The model holds no parallelism (torchtitan's split): the trainer wraps it. Each MLP projection
is its own Linear, so tensor parallelism can shard attn.query/key/value, mlp.gate and mlp.up by
column and mlp.proj and attn.proj by row (lmforge.trainer.tensor_parallel); the attention takes its
head counts from the shapes. A fused attn.qkv (GPT-2's layout, older checkpoints) loads.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.model.config import GPTConfig
from lmforge.model.document_mask import document_attention, query_documents
from lmforge.model.kv_cache import PagedKVCache
from lmforge.model.moe import MoE, moe_layers
from lmforge.model.paged_attention import PagedBatch, paged_attention
from lmforge.model.rope import apply_rope, apply_rope_at, rope_tables


class RMSNorm(nn.Module):
    """x / rms(x) · weight, computed in fp32 and cast back before the weight (as transformers' Llama)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).type_as(x) * self.weight

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def build_norm(config: GPTConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm(config.n_embd, config.norm_eps)
    return nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.heads, self.kv_heads, self.head_dim = config.n_head, config.kv_heads, config.head_dim
        # Queries, keys and values each their own projection, so tensor parallelism shards each by
        # heads; a state_dict with the fused `qkv` ([q; k; v] rows, GPT-2's layout) still loads.
        self.query = nn.Linear(config.n_embd, self.heads * self.head_dim, bias=config.bias)
        self.key = nn.Linear(config.n_embd, self.kv_heads * self.head_dim, bias=config.bias)
        self.value = nn.Linear(config.n_embd, self.kv_heads * self.head_dim, bias=config.bias)
        self._register_load_state_dict_pre_hook(self._split_fused_qkv)
        self.proj = nn.Linear(self.heads * self.head_dim, config.n_embd, bias=config.bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.norm_eps)
        # attention_fn(q, k, v, positions, dropout_p, documents=None) -> (B, n_head, T, D), called
        # after RoPE in place of causal SDPA when set: the hook by which the trainer's context
        # parallelism (lmforge.trainer.context_parallel) attends local queries to every rank's keys;
        # `documents` (B, T_full) are the whole sequence's document ids under document masking.
        self.attention_fn = None

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (B, n_head, T, D), keys and values (B, kv_heads, T, D), before RoPE."""
        batch, time, _ = x.shape
        # Head counts from the shapes: under tensor parallelism each rank holds some of the heads.
        q = self.query(x).view(batch, time, -1, self.head_dim)
        k = self.key(x).view(batch, time, -1, self.head_dim)
        v = self.value(x).view(batch, time, -1, self.head_dim)
        if self.config.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _output(self, y: torch.Tensor) -> torch.Tensor:
        batch, _, time, _ = y.shape
        return self.proj(y.transpose(1, 2).contiguous().view(batch, time, -1))

    def _split_fused_qkv(self, state_dict, prefix, *_) -> None:
        for kind in ("weight", "bias"):
            fused = state_dict.pop(f"{prefix}qkv.{kind}", None)
            if fused is not None:
                parts = split_qkv(fused, self.config)
                state_dict.update({f"{prefix}{name}.{kind}": part for name, part in parts.items()})

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                positions: torch.Tensor | None = None, documents: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = self._project(x)
        if rope is not None and positions is not None:
            q, k = apply_rope_at(q, *rope, positions), apply_rope_at(k, *rope, positions)
        elif rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        dropout = self.config.dropout if self.training else 0.0
        if self.attention_fn is not None:
            return self._output(self.attention_fn(q, k, v, positions, dropout, documents=documents))
        if documents is not None:  # causal within each document (lmforge.model.document_mask)
            y = document_attention(q, k, v, positions, query_documents(documents, positions), documents, dropout)
            return self._output(y)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout,
                                           enable_gqa=self.kv_heads != self.heads)
        return self._output(y)

    def forward_paged(self, x: torch.Tensor, rope, keys: torch.Tensor, values: torch.Tensor,
                      batch: PagedBatch) -> torch.Tensor:
        """The packed new tokens x (1, N, C) of one engine step (lmforge.model.paged_attention):
        their keys and values go into the paged cache, then each attends to its own sequence."""
        q, k, v = self._project(x)  # (1, heads, N, D)
        if rope is not None:  # the tokens' own rows of the tables (GPT.forward_paged)
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        y = paged_attention(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), keys, values, batch)
        return self.proj(y.reshape(1, y.shape[0], -1))


class MLP(nn.Module):
    """GPT-2's: proj(gelu(fc(x)))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        hidden = config.ffn_hidden_size
        self.fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.proj = nn.Linear(hidden, config.n_embd, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class SwiGLU(nn.Module):
    """Llama's: proj(silu(gate(x)) · up(x)) (Shazeer 2020)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        hidden = config.ffn_hidden_size
        self.gate = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.up = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.proj = nn.Linear(hidden, config.n_embd, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.silu(self.gate(x)) * self.up(x))


def build_mlp(config: GPTConfig) -> nn.Module:
    if config.moe is not None:
        hidden = config.moe.expert_hidden or config.ffn_hidden_size
        return MoE(config.n_embd, hidden, config.moe, activation=config.mlp, bias=config.bias,
                   residual_std=residual_init_std(config))
    return SwiGLU(config) if config.mlp == "swiglu" else MLP(config)


QKV = ("query", "key", "value")


def split_qkv(fused: torch.Tensor, config: GPTConfig) -> dict[str, torch.Tensor]:
    """A fused [q; k; v] weight or bias (GPT-2's c_attn layout) as the query, key and value projections'."""
    q_size, kv_size = config.n_head * config.head_dim, config.kv_heads * config.head_dim
    return dict(zip(QKV, (part.contiguous() for part in fused.split([q_size, kv_size, kv_size])), strict=True))


def fuse_qkv(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state_dict with each layer's attn.query/key/value as one `attn.qkv` ([q; k; v] rows)."""
    out = {}
    for name, tensor in state.items():
        head, _, tail = name.rpartition(".attn.")
        part, _, kind = tail.partition(".")
        if not head or part not in QKV:
            out[name] = tensor
        elif part == "query":
            out[f"{head}.attn.qkv.{kind}"] = torch.cat([state[f"{head}.attn.{p}.{kind}"] for p in QKV])
    return out


def residual_init_std(config: GPTConfig) -> float:
    """The init std of the projections that write into the residual stream (GPT-2's scaling)."""
    return 0.02 / math.sqrt(2 * config.n_layer)


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = build_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = build_norm(config)
        self.mlp = build_mlp(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, rope, positions: torch.Tensor | None = None,
                documents: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.ln_1(x), rope, positions, documents))
        return x + self.dropout(self.mlp(self.ln_2(x)))

    def forward_paged(self, x: torch.Tensor, rope, keys, values, batch: PagedBatch) -> torch.Tensor:
        x = x + self.attn.forward_paged(self.ln_1(x), rope, keys, values, batch)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.context_length, config.n_embd) if config.positions == "learned" else None
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = build_norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        if config.positions == "rope":
            cos, sin = rope_tables(config)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, 0.02) weights, residual projections (each `proj`) scaled by 1/sqrt(2·n_layer),
        zero biases, unit norms; an MoE layer initialises its router and batched experts alike."""
        std, residual_std = 0.02, residual_init_std(self.config)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=residual_std if name.endswith(".proj") else std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, (nn.LayerNorm, RMSNorm)):
                module.reset_parameters()
            elif isinstance(module, MoE):
                module.reset_parameters(residual_std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                documents: torch.Tensor | None = None):
        """Logits (B, T, vocab); with targets also the mean cross-entropy loss (in training
        plus the MoE layers' auxiliary losses). `positions` (B, T): the tokens' positions in
        their sequence when idx is not 0..T-1 (a context-parallel shard); default 0..T-1.
        `documents` (B, T_full): the document ids of the whole sequence (lmforge.model.document_mask's
        document_ids; the whole one also when idx is a shard): a token then attends only to earlier
        tokens of its own document. Positions stay the sequence's; None: causal attention over all."""
        time = idx.shape[1]
        if time > self.config.context_length:
            raise ValueError(f"sequence of {time} tokens exceeds the context length {self.config.context_length}")
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(time, device=idx.device) if positions is None else positions)
        x = self.drop(x)
        rope = (self.rope_cos, self.rope_sin) if self.wpe is None else None
        for block in self.blocks:
            x = block(x, rope, positions, documents)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        if self.training:  # a validation loss stays the pure cross-entropy
            for moe in self._moe_layers():
                loss = loss + moe.aux_loss
        return logits, loss

    @torch.no_grad()
    def forward_paged(self, tokens: torch.Tensor, cache: PagedKVCache, batch: PagedBatch,
                      logits_index: torch.Tensor | None = None) -> torch.Tensor:
        """Inference over a paged KV cache: the packed new tokens (N,) of one engine step, at
        `batch.positions` of their sequences (lmforge.model.paged_attention). Returns the
        logits (M, vocab) of the tokens at `logits_index` (default: all N): a prefill chunk
        needs only its last token's."""
        # From the host when the batch knows it: reading the device would wait for it (and cannot be captured).
        top = batch.max_position if batch.max_position is not None else int(batch.positions.max())
        if top >= self.config.context_length:
            raise ValueError(f"position {top} exceeds the context length {self.config.context_length}")
        x = self.wte(tokens)[None]
        if self.wpe is not None:
            x = x + self.wpe(batch.positions)[None]
        # RoPE's cos and sin at the tokens' positions, looked up once for every layer.
        rope = (self.rope_cos[batch.positions], self.rope_sin[batch.positions]) if self.wpe is None else None
        for layer, block in enumerate(self.blocks):
            x = block.forward_paged(x, rope, cache.layer_keys[layer], cache.layer_values[layer], batch)
        x = x[0] if logits_index is None else x[0, logits_index]
        return self.lm_head(self.ln_f(x))

    def _moe_layers(self) -> list[MoE]:
        return moe_layers(self) if self.config.moe is not None else []

    def moe_stats(self) -> dict[str, float]:
        """The MoE layers' statistics of their last forward (load max/mean, dropped fraction,
        aux losses), averaged over layers; {} for a dense model."""
        layers = [moe.stats for moe in self._moe_layers() if getattr(moe, "stats", None)]
        if not layers:
            return {}
        return {key: sum(stats[key] for stats in layers) / len(layers) for key in layers[0]}

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters counted once (a tied head is the embedding)."""
        total = sum(p.numel() for p in self.parameters())
        if non_embedding:
            total -= self.wte.weight.numel() + (self.wpe.weight.numel() if self.wpe is not None else 0)
        return total


def parameter_counts(config: GPTConfig) -> tuple[int, int]:
    """(total, active per token) parameters of the model `config` describes, counted on
    torch's meta device (no memory is allocated, so llama-70b counts in a second). Active
    leaves out the routed experts a token does not use (E − top_k of them per MoE layer)."""
    with torch.device("meta"):
        total = GPT(config).num_params()
    if config.moe is None:
        return total, total
    hidden = config.moe.expert_hidden or config.ffn_hidden_size
    unused = config.n_layer * (config.moe.num_experts - config.moe.top_k) * _expert_params(config, hidden)
    return total, total - unused


def _expert_params(config: GPTConfig, hidden: int) -> int:
    """Weights and biases of one MLP (or expert) with this hidden size."""
    matrices = 3 if config.mlp == "swiglu" else 2
    biases = ((matrices - 1) * hidden + config.n_embd) if config.bias else 0
    return matrices * config.n_embd * hidden + biases


def _active_mlp_matmul_params(config: GPTConfig) -> int:
    matrices = 3 if config.mlp == "swiglu" else 2
    if config.moe is None:
        return matrices * config.n_embd * config.ffn_hidden_size
    hidden = config.moe.expert_hidden or config.ffn_hidden_size
    experts = config.moe.top_k + (1 if config.moe.shared_expert else 0)
    return experts * matrices * config.n_embd * hidden + config.n_embd * config.moe.num_experts  # + the router


def flops_per_token(config: GPTConfig, seq_len: int | None = None) -> float:
    """Training FLOPs per token, PaLM appendix B / nanoGPT: 6·N + 12·L·d·T, where N counts
    the matmul parameters a token passes through (blocks and the output head; embedding
    lookups are free; grouped-query attention's smaller key/value projections; an MoE layer's
    router and top_k experts, not all E) and the second term is attention's QKᵀ and AV over a
    context of T tokens (per query head, so GQA does not change it)."""
    seq_len = seq_len or config.context_length
    d, layers = config.n_embd, config.n_layer
    attention = d * config.head_dim * (2 * config.n_head + 2 * config.kv_heads)  # qkv + proj
    matmul_params = layers * (attention + _active_mlp_matmul_params(config)) + config.vocab_size * d
    return 6 * matmul_params + 12 * layers * config.n_head * config.head_dim * seq_len
