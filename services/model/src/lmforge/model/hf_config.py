"""The model's configuration as a Hugging Face transformers `config.json`, and back (pydantic
only: no torch, no transformers).

Each GPTConfig maps to the one transformers architecture that computes exactly the same
function, or is refused with a one-line ConfigError naming why:

  rmsnorm + swiglu + rope                        LlamaForCausalLM  (bias: attention_bias + mlp_bias)
  … with qk_norm (RMSNorm per head, before RoPE)  Qwen3ForCausalLM  (no bias: Qwen3's MLP has none)
  … with an MoE MLP                              MixtralForCausalLM (renormalised top-k, no bias)
  … with an MoE MLP and qk_norm                  Qwen3MoeForCausalLM (norm_topk_prob = renormalize)
  layernorm + gelu(tanh) + rope, MHA             GPTNeoXForCausalLM (rotary_pct 1, sequential residual)
  layernorm + gelu(tanh) + learned positions     GPT2LMHeadModel

RoPE θ and Llama 3's frequency scaling are written the way Meta's Llama 3.1 config.json has
them (`rope_theta`, `rope_scaling` with rope_type "llama3"), which transformers 4.43+ and 5.x,
vLLM and llama.cpp's converter all read. GPT-NeoX and GPT-2 always carry biases: a model
without them is written with zero biases (the same function).
"""

from __future__ import annotations

from typing import Any

from lmforge.common.errors import ConfigError
from lmforge.model.config import GPTConfig, RopeScaling

# model_type → the transformers class AutoModelForCausalLM builds for it.
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}
# transformers' activation names that are GELU's tanh approximation (ours).
TANH_GELU = ("gelu_pytorch_tanh", "gelu_new")
# A config.json key absent means the class default; these differ between the classes.
_TIE_DEFAULT = {"gpt2": True}


def _refuse(reason: str) -> ConfigError:
    return ConfigError(f"no exact Hugging Face transformers architecture for this model: {reason}")


def hf_model_type(config: GPTConfig) -> str:
    """The transformers model_type that computes exactly what `config` does (ConfigError if none)."""
    if config.positions == "learned":
        if config.norm != "layernorm" or config.mlp != "gelu" or config.moe is not None:
            raise _refuse("learned positions map to GPT-2 only, which has LayerNorm and a dense GELU MLP")
        if config.kv_heads != config.n_head or config.qk_norm:
            raise _refuse("GPT-2 has neither grouped-query attention nor QK-norm")
        return "gpt2"
    if config.norm == "layernorm" and config.mlp == "gelu":
        if config.moe is not None:
            raise _refuse("no transformers MoE architecture has LayerNorm and GELU experts")
        if config.kv_heads != config.n_head or config.qk_norm:
            raise _refuse("LayerNorm + GELU maps to GPT-NeoX, which has neither grouped-query attention nor QK-norm")
        if config.rope_scaling is not None:
            raise _refuse("LayerNorm + GELU maps to GPT-NeoX, whose configs carry no Llama 3 RoPE scaling")
        return "gpt_neox"
    if config.norm != "rmsnorm" or config.mlp != "swiglu":
        raise _refuse(
            f"norm {config.norm} with mlp {config.mlp} (Llama-style needs rmsnorm + swiglu, GPT-style layernorm + gelu)"
        )
    if config.moe is None:
        if config.qk_norm and config.bias:
            raise _refuse("qk_norm maps to Qwen3, whose MLP has no bias; train with bias: false")
        return "qwen3" if config.qk_norm else "llama"
    moe = config.moe
    if moe.shared_expert:
        raise _refuse("a shared expert (Qwen2-MoE's is gated by a sigmoid, DeepSeek's uses sigmoid routing)")
    if moe.eval_capacity_factor is not None:
        raise _refuse("moe.eval_capacity_factor drops tokens at inference; transformers' MoE never does")
    if config.bias:
        raise _refuse("MoE with bias: Mixtral and Qwen3-MoE have no biases")
    if config.qk_norm:
        return "qwen3_moe"
    if not moe.renormalize:
        raise _refuse("moe.renormalize: false without qk_norm (Mixtral always renormalises the top-k weights)")
    return "mixtral"


def to_hf_config(config: GPTConfig, *, eos_token_id: int, dtype: str = "float32") -> dict[str, Any]:
    """config.json for transformers: the architecture `hf_model_type` picks, with this model's
    shape. The end-of-text token is both BOS and EOS (GPT-2's convention: every training
    document follows one)."""
    model_type = hf_model_type(config)
    common = {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": eos_token_id,
        "eos_token_id": eos_token_id,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": dtype,
    }
    if model_type == "gpt2":
        return {**common, **_gpt2(config)}
    if model_type == "gpt_neox":
        return {**common, **_gpt_neox(config)}
    return {**common, **_llama_like(config, model_type)}


def generation_config(eos_token_id: int) -> dict[str, Any]:
    """generation_config.json: generation stops at end-of-text (greedy unless the caller samples)."""
    return {"bos_token_id": eos_token_id, "eos_token_id": eos_token_id}


def _gpt2(config: GPTConfig) -> dict[str, Any]:
    return {
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_positions": config.context_length,
        "n_inner": config.ffn_hidden_size,
        "activation_function": "gelu_pytorch_tanh",
        "layer_norm_epsilon": config.norm_eps,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
    }


def _gpt_neox(config: GPTConfig) -> dict[str, Any]:
    return {
        "hidden_size": config.n_embd,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "intermediate_size": config.ffn_hidden_size,
        "hidden_act": "gelu_pytorch_tanh",
        "max_position_embeddings": config.context_length,
        "layer_norm_eps": config.norm_eps,
        "rotary_pct": 1.0,
        "rotary_emb_base": config.rope_theta,
        "use_parallel_residual": False,
        "attention_bias": config.bias,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
    }


def _llama_like(config: GPTConfig, model_type: str) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "hidden_size": config.n_embd,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.ffn_hidden_size,
        "hidden_act": "silu",
        "max_position_embeddings": config.context_length,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": _rope_scaling(config),
        "attention_dropout": 0.0,
    }
    if model_type == "llama":
        return {**fields, "attention_bias": config.bias, "mlp_bias": config.bias, "pretraining_tp": 1}
    if model_type == "qwen3":
        return {
            **fields,
            "attention_bias": False,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": config.n_layer,
        }
    moe = config.moe
    hidden = moe.expert_hidden or config.ffn_hidden_size
    if model_type == "mixtral":
        return {
            **fields,
            "intermediate_size": hidden,
            "num_local_experts": moe.num_experts,
            "num_experts_per_tok": moe.top_k,
            "router_aux_loss_coef": moe.aux_loss_coef,
            "output_router_logits": False,
            "router_jitter_noise": 0.0,
            "sliding_window": None,
        }
    return {
        **fields,
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": config.n_layer,
        "moe_intermediate_size": hidden,
        "num_experts": moe.num_experts,
        "num_experts_per_tok": moe.top_k,
        "norm_topk_prob": moe.renormalize,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "router_aux_loss_coef": moe.aux_loss_coef,
        "output_router_logits": False,
    }


def _rope_scaling(config: GPTConfig) -> dict[str, Any] | None:
    scaling = config.rope_scaling
    if scaling is None:
        return None
    return {
        "rope_type": "llama3",
        "factor": scaling.factor,
        "low_freq_factor": scaling.low_freq_factor,
        "high_freq_factor": scaling.high_freq_factor,
        "original_max_position_embeddings": scaling.original_context_length,
    }


# --------------------------------------------------------------------------- config.json → GPTConfig


def _unsupported(hf: dict, reason: str) -> ConfigError:
    return ConfigError(f"cannot import the {hf.get('model_type')!r} checkpoint: {reason}")


def from_hf_config(hf: dict[str, Any]) -> GPTConfig:
    """The GPTConfig of a transformers config.json of a supported architecture (ConfigError
    naming what does not map otherwise). Biases: GPT-2 and GPT-NeoX always have them, so the
    config says bias: true; the weight import turns it off when they are all zero."""
    model_type = hf.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ConfigError(
            f"cannot import a {model_type!r} checkpoint: supported model types are {', '.join(ARCHITECTURES)}"
        )
    tie = hf.get("tie_word_embeddings", _TIE_DEFAULT.get(model_type, False))
    if model_type == "gpt2":
        return _from_gpt2(hf, tie)
    if model_type == "gpt_neox":
        return _from_gpt_neox(hf, tie)
    return _from_llama_like(hf, model_type, tie)


def _from_gpt2(hf: dict, tie: bool) -> GPTConfig:
    if hf.get("activation_function", "gelu_new") not in TANH_GELU:
        raise _unsupported(hf, f"activation {hf.get('activation_function')!r} (lmforge's GELU is the tanh form)")
    if not hf.get("scale_attn_weights", True) or hf.get("scale_attn_by_inverse_layer_idx", False):
        raise _unsupported(hf, "attention scores not scaled by 1/sqrt(head_dim)")
    if hf.get("add_cross_attention", False):
        raise _unsupported(hf, "cross-attention")
    n_embd = hf.get("n_embd", 768)
    return GPTConfig(
        vocab_size=hf.get("vocab_size", 50257),
        context_length=hf.get("n_positions", 1024),
        n_layer=hf.get("n_layer", 12),
        n_head=hf.get("n_head", 12),
        n_embd=n_embd,
        ffn_hidden=hf.get("n_inner") or 4 * n_embd,
        positions="learned",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        bias=True,
        tie_embeddings=tie,
    )


def _from_gpt_neox(hf: dict, tie: bool) -> GPTConfig:
    if hf.get("hidden_act", "gelu") not in TANH_GELU:
        raise _unsupported(hf, f"activation {hf.get('hidden_act', 'gelu')!r} (lmforge's GELU is the tanh form)")
    if hf.get("use_parallel_residual", True):
        raise _unsupported(hf, "use_parallel_residual (lmforge's blocks are sequential)")
    rope = _rope_parameters(hf)
    if rope.get("partial_rotary_factor", hf.get("rotary_pct", 0.25)) != 1.0:
        raise _unsupported(hf, "rotary_pct below 1 (lmforge rotates the whole head)")
    theta, scaling = _rope_theta_and_scaling(hf, rope, default_theta=hf.get("rotary_emb_base", 10_000.0))
    if scaling is not None:
        raise _unsupported(hf, "RoPE scaling on GPT-NeoX")
    return GPTConfig(
        vocab_size=hf.get("vocab_size", 50432),
        context_length=hf.get("max_position_embeddings", 2048),
        n_layer=hf["num_hidden_layers"],
        n_head=hf["num_attention_heads"],
        n_embd=hf["hidden_size"],
        ffn_hidden=hf["intermediate_size"],
        rope_theta=theta,
        norm_eps=hf.get("layer_norm_eps", 1e-5),
        bias=True,
        tie_embeddings=tie,
    )


def _from_llama_like(hf: dict, model_type: str, tie: bool) -> GPTConfig:
    if hf.get("hidden_act", "silu") != "silu":
        raise _unsupported(hf, f"activation {hf.get('hidden_act')!r} (SwiGLU needs silu)")
    n_head, n_embd = hf["num_attention_heads"], hf["hidden_size"]
    if hf.get("head_dim") not in (None, n_embd // n_head):
        raise _unsupported(
            hf,
            f"head_dim {hf['head_dim']} is not hidden_size/num_attention_heads "
            f"({n_embd // n_head}), which lmforge requires",
        )
    if hf.get("use_sliding_window") or (
        model_type == "mixtral"
        and hf.get("sliding_window") is not None
        and hf["sliding_window"] < hf.get("max_position_embeddings", 0)
    ):
        raise _unsupported(hf, "sliding-window attention")
    if model_type in ("llama", "mixtral") and hf.get("pretraining_tp", 1) != 1:
        raise _unsupported(hf, "pretraining_tp other than 1")
    theta, scaling = _rope_theta_and_scaling(hf, _rope_parameters(hf), default_theta=hf.get("rope_theta", 10_000.0))
    kv_heads = hf.get("num_key_value_heads") or n_head
    fields: dict[str, Any] = {
        "vocab_size": hf["vocab_size"],
        "context_length": hf.get("max_position_embeddings", 2048),
        "n_layer": hf["num_hidden_layers"],
        "n_head": n_head,
        "n_kv_head": None if kv_heads == n_head else kv_heads,
        "n_embd": n_embd,
        "norm": "rmsnorm",
        "mlp": "swiglu",
        "ffn_hidden": hf["intermediate_size"],
        "rope_theta": theta,
        "rope_scaling": scaling,
        "norm_eps": hf.get("rms_norm_eps", 1e-6),
        "qk_norm": model_type in ("qwen3", "qwen3_moe"),
        "tie_embeddings": tie,
        "bias": bool(hf.get("attention_bias", False) or hf.get("mlp_bias", False)),
    }
    if model_type == "mixtral":
        fields["moe"] = {
            "num_experts": hf["num_local_experts"],
            "top_k": hf.get("num_experts_per_tok", 2),
            "renormalize": True,
            "aux_loss_coef": hf.get("router_aux_loss_coef", 0.01),
        }
    elif model_type == "qwen3_moe":
        if hf.get("mlp_only_layers") or hf.get("decoder_sparse_step", 1) != 1:
            raise _unsupported(hf, "dense layers among the MoE ones (mlp_only_layers, decoder_sparse_step)")
        fields["moe"] = {
            "num_experts": hf["num_experts"],
            "top_k": hf.get("num_experts_per_tok", 8),
            "renormalize": hf.get("norm_topk_prob", False),
            "aux_loss_coef": hf.get("router_aux_loss_coef", 0.001),
            "expert_hidden": hf.get("moe_intermediate_size", 768),
        }
    if fields.get("moe") and fields["bias"]:
        raise _unsupported(hf, "attention_bias with an MoE MLP (lmforge's bias covers the experts too)")
    return GPTConfig.model_validate(fields)


def _rope_parameters(hf: dict) -> dict[str, Any]:
    """transformers 5's `rope_parameters`, or the 4.x `rope_scaling` (either may be absent)."""
    return dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})


def _rope_theta_and_scaling(hf: dict, rope: dict, default_theta: float) -> tuple[float, RopeScaling | None]:
    theta = float(rope.get("rope_theta", default_theta))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type in (None, "default"):
        return theta, None
    if rope_type != "llama3":
        raise _unsupported(hf, f"RoPE type {rope_type!r} (lmforge has Llama 3's scaling only)")
    original = rope.get("original_max_position_embeddings", 8192)
    return theta, RopeScaling(
        factor=rope["factor"],
        low_freq_factor=rope["low_freq_factor"],
        high_freq_factor=rope["high_freq_factor"],
        original_context_length=original,
    )
