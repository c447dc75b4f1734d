"""The mixture-of-experts option of a model preset (pydantic only: the model's configuration
imports it without torch; the MoE module itself is lmforge.model.moe, which re-exports it)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from lmforge.common.config import StrictModel


class MoEConfig(StrictModel):
    """The MoE option of a model preset (`model.moe`); absent means a dense MLP."""

    num_experts: int = Field(8, ge=2, description="experts per MoE layer (E)")
    top_k: int = Field(2, ge=1, description="experts each token is routed to (k)")
    capacity_factor: float = Field(
        1.25,
        gt=0,
        description="in training each expert takes at most capacity_factor·k·tokens/E tokens of a batch; "
        "the rest are dropped",
    )
    eval_capacity_factor: float | None = Field(
        None,
        gt=0,
        description="capacity_factor in eval mode (validation, inference); None: no limit, no token is dropped "
        "(as in transformers' Mixtral, so an exported model computes the same)",
    )
    renormalize: bool = Field(
        True,
        description="scale the k chosen routing weights to sum to 1 (Mixtral; Qwen-MoE's norm_topk_prob); "
        "with top_k 1 turn it off, or the router learns only from the auxiliary losses",
    )
    balancing: Literal["aux_loss", "bias"] = Field(
        "aux_loss",
        description="aux_loss: Switch/GShard load-balancing loss; "
        "bias: DeepSeek-V3's auxiliary-loss-free bias balancing",
    )
    aux_loss_coef: float = Field(0.01, ge=0, description="weight of the load-balancing loss (balancing=aux_loss)")
    z_loss_coef: float = Field(0.001, ge=0, description="weight of the router z-loss")
    bias_update_rate: float = Field(0.001, ge=0, description="per-step bias step size (balancing=bias)")
    shared_expert: bool = Field(False, description="one always-on expert beside the routed ones (DeepSeek/Qwen-MoE)")
    expert_hidden: int | None = Field(None, ge=1, description="hidden size of each expert; default the dense MLP's")

    @model_validator(mode="after")
    def _top_k_fits(self) -> MoEConfig:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must not exceed num_experts ({self.num_experts})")
        return self
