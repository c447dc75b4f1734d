"""The model as the planner sees it: sizes, parameters per part and FLOPs per token, read from
lmforge.model.transformer's GPTConfig (a preset, or any shape the trainer accepts).

Parameters are counted per part because the layouts split them differently: tensor parallelism
splits the matrices, pipeline parallelism splits the layers (the embedding on the first stage,
the output head on the last), expert parallelism splits the routed experts. The sum equals
lmforge.model.transformer.parameter_counts (a test holds them together), and the FLOPs follow
lmforge.model.transformer.flops_per_token's convention (6 FLOPs per matmul parameter a token passes
through, plus attention's 12·n_head·head_dim·T per layer).
"""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.model.config import GPTConfig


@dataclass(frozen=True)
class ModelShape:
    layers: int
    dim: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_hidden: int  # the dense MLP's hidden size, or each expert's
    vocab: int
    swiglu: bool
    dropout: bool  # dropout masks are stored only when dropout > 0
    tied: bool
    experts: int  # routed experts per layer; 0 for a dense model
    top_k: int
    shared_expert: bool
    capacity_factor: float
    layer_params: int  # one block, everything in it
    layer_expert_params: int  # of which the routed experts (split by expert parallelism)
    embedding_params: int  # token (and learned position) embeddings
    head_params: int  # the output head when untied, plus the final norm

    @classmethod
    def from_config(cls, config: GPTConfig) -> ModelShape:
        d, hd = config.n_embd, config.head_dim
        moe = config.moe
        hidden = (moe.expert_hidden or config.ffn_hidden_size) if moe else config.ffn_hidden_size
        norm = d * (2 if config.norm == "layernorm" and config.bias else 1)
        attention = d * hd * (2 * config.n_head + 2 * config.kv_heads)
        if config.bias:
            attention += (config.n_head + 2 * config.kv_heads) * hd + d
        if config.qk_norm:
            attention += 2 * hd
        mlp = _mlp_params(config, hidden)
        routed = moe.num_experts * mlp if moe else 0
        if moe:
            mlp = d * moe.num_experts + routed + (_mlp_params(config, hidden) if moe.shared_expert else 0)
        positions = config.context_length * d if config.positions == "learned" else 0
        return cls(
            layers=config.n_layer,
            dim=d,
            heads=config.n_head,
            kv_heads=config.kv_heads,
            head_dim=hd,
            ffn_hidden=hidden,
            vocab=config.vocab_size,
            swiglu=config.mlp == "swiglu",
            dropout=config.dropout > 0,
            tied=config.tie_embeddings,
            experts=moe.num_experts if moe else 0,
            top_k=moe.top_k if moe else 0,
            shared_expert=bool(moe and moe.shared_expert),
            capacity_factor=moe.capacity_factor if moe else 1.0,
            layer_params=attention + 2 * norm + mlp,
            layer_expert_params=routed,
            embedding_params=config.vocab_size * d + positions,
            head_params=(0 if config.tie_embeddings else config.vocab_size * d) + norm,
        )

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.embedding_params + self.head_params

    @property
    def active_params(self) -> int:
        """Parameters a token uses: all but the E − top_k routed experts it skips in each layer."""
        if not self.is_moe:
            return self.params
        unused = self.layers * self.layer_expert_params * (self.experts - self.top_k) // self.experts
        return self.params - unused

    @property
    def layer_matmul_params(self) -> int:
        """Matmul weights one token passes through in a block: attention's projections and the
        dense MLP, or the router, the top_k experts and the shared expert."""
        attention = self.dim * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = (3 if self.swiglu else 2) * self.dim * self.ffn_hidden
        if not self.is_moe:
            return attention + mlp
        return attention + self.dim * self.experts + (self.top_k + self.shared_expert) * mlp

    @property
    def matmul_width(self) -> float:
        """A block's matmul parameters per hidden unit (12·d for a GPT block): the FLOPs each element of a
        token's hidden state meets in the block's matmuls, over 2. The element-wise work around them grows
        with d alone, so this is the size the kernel efficiency follows (timing, efficiency). Tensor
        parallelism with sequence parallelism divides both by t, leaving it unchanged."""
        return self.layer_matmul_params / self.dim

    @property
    def head_matmul_params(self) -> int:
        return self.vocab * self.dim

    def layer_flops_per_token(self, seq_len: int) -> float:
        """Forward + backward FLOPs per token in one block: 6 per matmul weight, plus QKᵀ and AV
        (2·2·T·n_head·head_dim forward, three times that with the backward)."""
        return 6 * self.layer_matmul_params + 12 * self.heads * self.head_dim * seq_len

    def head_flops_per_token(self) -> float:
        return 6 * self.head_matmul_params

    def flops_per_token(self, seq_len: int) -> float:
        """The whole model's: lmforge.model.transformer.flops_per_token for the same config."""
        return self.layers * self.layer_flops_per_token(seq_len) + self.head_flops_per_token()

    def six_n_flops_per_token(self) -> float:
        """6·N (N = the matmul parameters a token passes through): the 6·N·D convention, no attention."""
        return 6 * (self.layers * self.layer_matmul_params + self.head_matmul_params)


def _mlp_params(config: GPTConfig, hidden: int) -> int:
    matrices = 3 if config.mlp == "swiglu" else 2
    biases = ((matrices - 1) * hidden + config.n_embd) if config.bias else 0
    return matrices * config.n_embd * hidden + biases
