"""The model's weights under transformers' names and layouts, and back (install
`lmforge-model[torch]` for torch).

The tensors are the ones transformers' `save_pretrained` writes (its "original" checkpoint
format, which transformers 4.x, 5.x and vLLM all load): Llama/Qwen3 split our fused qkv into
q_proj, k_proj, v_proj (queries first, then keys, then values: CausalSelfAttention's order);
Mixtral and Qwen3-MoE store each expert as its own Linear weights (out, in), ours are batched
(E, in, out); GPT-NeoX fuses qkv head by head ([q_h, k_h, v_h] for each head h); GPT-2's Conv1D
weights are (in, out). Reading also accepts transformers 5's fused expert tensors
(`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`) and GPT-2 names without `transformer.`.
"""

from __future__ import annotations

import re

import torch

from lmforge.common.errors import ConfigError, InputError
from lmforge.model.config import GPTConfig
from lmforge.model.transformer import fuse_qkv

Tensors = dict[str, torch.Tensor]
TIED = "lm_head.weight"
SELECTION_BIAS = re.compile(r"blocks\.\d+\.mlp\.router\.selection_bias")


def to_hf_state(state: Tensors, config: GPTConfig, model_type: str) -> Tensors:
    """Our state_dict (a GPT's) → transformers' tensors for `model_type` (hf_config.hf_model_type)."""
    state = _without_selection_bias(fuse_qkv(state))
    out: Tensors = {}
    for layer in range(config.n_layer):
        _block_to_hf(out, _layer_state(state, layer), config, model_type, layer)
    names = _TOP_NAMES[model_type]
    out[names["wte"]] = state["wte.weight"]
    if config.positions == "learned":
        out[names["wpe"]] = state["wpe.weight"]
    _norm_to_hf(out, state, "ln_f", names["ln_f"], model_type)
    if not config.tie_embeddings:
        out[names["lm_head"]] = state[TIED]
    return {name: tensor.detach().contiguous().cpu() for name, tensor in out.items()}


def from_hf_state(tensors: Tensors, config: GPTConfig, model_type: str) -> Tensors:
    """transformers' tensors → our state_dict for `config` (a missing bias, where config.bias
    is set but the checkpoint has none for that layer, is zero). InputError names a missing
    tensor."""
    tensors = _canonical_names(tensors, model_type)
    state: Tensors = {}
    for layer in range(config.n_layer):
        state.update(
            {
                f"blocks.{layer}.{name}": tensor
                for name, tensor in _block_from_hf(tensors, config, model_type, layer).items()
            }
        )
    names = _TOP_NAMES[model_type]
    state["wte.weight"] = _take(tensors, names["wte"])
    if config.positions == "learned":
        state["wpe.weight"] = _take(tensors, names["wpe"])
    state.update(_norm_from_hf(tensors, "ln_f", names["ln_f"], config))
    if not config.tie_embeddings:
        state[TIED] = _take(tensors, names["lm_head"])
    return state


def biases_are_zero(state: Tensors) -> bool:
    """Every bias (Linear and LayerNorm) in our state_dict is zero: the model is the same with bias: false."""
    return all(not tensor.any() for name, tensor in state.items() if name.endswith("bias"))


def without_biases(state: Tensors) -> Tensors:
    return {name: tensor for name, tensor in state.items() if not name.endswith("bias")}


# --------------------------------------------------------------------------- names and layouts

_LLAMA_TOP = {"wte": "model.embed_tokens.weight", "ln_f": "model.norm", "lm_head": "lm_head.weight"}
_TOP_NAMES = {
    "llama": _LLAMA_TOP,
    "qwen3": _LLAMA_TOP,
    "mixtral": _LLAMA_TOP,
    "qwen3_moe": _LLAMA_TOP,
    "gpt_neox": {"wte": "gpt_neox.embed_in.weight", "ln_f": "gpt_neox.final_layer_norm", "lm_head": "embed_out.weight"},
    "gpt2": {
        "wte": "transformer.wte.weight",
        "wpe": "transformer.wpe.weight",
        "ln_f": "transformer.ln_f",
        "lm_head": "lm_head.weight",
    },
}
_PREFIX = {
    "llama": "model.layers",
    "qwen3": "model.layers",
    "mixtral": "model.layers",
    "qwen3_moe": "model.layers",
    "gpt_neox": "gpt_neox.layers",
    "gpt2": "transformer.h",
}
# Our block's module → transformers' (per model family).
_LLAMA_BLOCK = {
    "ln_1": "input_layernorm",
    "ln_2": "post_attention_layernorm",
    "attn.proj": "self_attn.o_proj",
    "attn.q_norm": "self_attn.q_norm",
    "attn.k_norm": "self_attn.k_norm",
    "mlp.gate": "mlp.gate_proj",
    "mlp.up": "mlp.up_proj",
    "mlp.proj": "mlp.down_proj",
}
_BLOCK = {
    "llama": _LLAMA_BLOCK,
    "qwen3": _LLAMA_BLOCK,
    "mixtral": _LLAMA_BLOCK,
    "qwen3_moe": _LLAMA_BLOCK,
    "gpt_neox": {
        "ln_1": "input_layernorm",
        "ln_2": "post_attention_layernorm",
        "attn.qkv": "attention.query_key_value",
        "attn.proj": "attention.dense",
        "mlp.fc": "mlp.dense_h_to_4h",
        "mlp.proj": "mlp.dense_4h_to_h",
    },
    "gpt2": {
        "ln_1": "ln_1",
        "ln_2": "ln_2",
        "attn.qkv": "attn.c_attn",
        "attn.proj": "attn.c_proj",
        "mlp.fc": "mlp.c_fc",
        "mlp.proj": "mlp.c_proj",
    },
}
# Mixtral: experts.{e}.w1 (gate), w3 (up), w2 (down) under block_sparse_moe; Qwen3-MoE: gate_proj,
# up_proj, down_proj under mlp. The router is `gate` in both.
_EXPERTS = {
    "mixtral": ("block_sparse_moe", {"gate": "w1", "up": "w3", "down": "w2"}),
    "qwen3_moe": ("mlp", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}),
}
_GPT2_CONV1D = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")  # Conv1D: weight stored (in, out)


def _layer_state(state: Tensors, layer: int) -> Tensors:
    prefix = f"blocks.{layer}."
    return {name[len(prefix) :]: tensor for name, tensor in state.items() if name.startswith(prefix)}


def _without_selection_bias(state: Tensors) -> Tensors:
    """The state without MoE selection biases, refused unless zero (then routing is plain top-k)."""
    for name, tensor in state.items():
        if SELECTION_BIAS.fullmatch(name) and tensor.any():
            raise ConfigError(
                "no exact Hugging Face transformers architecture for this model: its MoE routing "
                "uses a non-zero selection bias (balancing: bias), which Mixtral's router has not"
            )
    return {name: tensor for name, tensor in state.items() if not SELECTION_BIAS.fullmatch(name)}


def _linear_names(ours: str, hf: str, has_bias: bool) -> list[tuple[str, str]]:
    pairs = [(f"{ours}.weight", f"{hf}.weight")]
    return pairs + [(f"{ours}.bias", f"{hf}.bias")] if has_bias else pairs


def _norm_to_hf(out: Tensors, state: Tensors, ours: str, hf: str, model_type: str) -> None:
    out[f"{hf}.weight"] = state[f"{ours}.weight"]
    if model_type in ("gpt2", "gpt_neox"):  # LayerNorm with a bias, always
        out[f"{hf}.bias"] = state.get(f"{ours}.bias", torch.zeros_like(state[f"{ours}.weight"]))


def _norm_from_hf(tensors: Tensors, ours: str, hf: str, config: GPTConfig) -> Tensors:
    result = {f"{ours}.weight": _take(tensors, f"{hf}.weight")}
    if config.norm == "layernorm" and config.bias:
        result[f"{ours}.bias"] = _take_bias(tensors, f"{hf}.bias", result[f"{ours}.weight"])
    return result


def _block_to_hf(out: Tensors, block: Tensors, config: GPTConfig, model_type: str, layer: int) -> None:
    prefix, names = f"{_PREFIX[model_type]}.{layer}", _BLOCK[model_type]
    gpt_style = model_type in ("gpt2", "gpt_neox")
    for ours in ("ln_1", "ln_2"):
        _norm_to_hf(out, block, ours, f"{prefix}.{names[ours]}", model_type)
    if gpt_style:
        for ours in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"):
            hf = f"{prefix}.{names[ours]}"
            weight = block[f"{ours}.weight"]
            bias = block.get(f"{ours}.bias", torch.zeros(weight.shape[0], dtype=weight.dtype))
            if model_type == "gpt2":  # every Conv1D has a bias
                out[f"{hf}.weight"], out[f"{hf}.bias"] = weight.t(), bias
                continue
            if ours == "attn.qkv":
                weight, bias = _neox_qkv_to_hf(weight, config), _neox_qkv_to_hf(bias, config)
            out[f"{hf}.weight"] = weight
            if config.bias or ours.startswith("mlp."):  # GPT-NeoX's MLP always has biases
                out[f"{hf}.bias"] = bias
        return
    q, k, v = _split_qkv(block["attn.qkv.weight"], config)
    out.update(
        {
            f"{prefix}.self_attn.q_proj.weight": q,
            f"{prefix}.self_attn.k_proj.weight": k,
            f"{prefix}.self_attn.v_proj.weight": v,
        }
    )
    if config.bias:
        q, k, v = _split_qkv(block["attn.qkv.bias"], config)
        out.update(
            {
                f"{prefix}.self_attn.q_proj.bias": q,
                f"{prefix}.self_attn.k_proj.bias": k,
                f"{prefix}.self_attn.v_proj.bias": v,
            }
        )
    modules = ["attn.proj", *(["attn.q_norm", "attn.k_norm"] if config.qk_norm else [])]
    if config.moe is None:
        modules += ["mlp.gate", "mlp.up", "mlp.proj"]
    for ours in modules:
        for ours_name, hf_name in _linear_names(ours, f"{prefix}.{names[ours]}", config.bias and "norm" not in ours):
            out[hf_name] = block[ours_name]
    if config.moe is not None:
        _experts_to_hf(out, block, config, model_type, prefix)


def _block_from_hf(tensors: Tensors, config: GPTConfig, model_type: str, layer: int) -> Tensors:
    prefix, names = f"{_PREFIX[model_type]}.{layer}", _BLOCK[model_type]
    block: Tensors = {}
    for ours in ("ln_1", "ln_2"):
        block.update(_norm_from_hf(tensors, ours, f"{prefix}.{names[ours]}", config))
    if model_type in ("gpt2", "gpt_neox"):
        for ours in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"):
            weight = _take(tensors, f"{prefix}.{names[ours]}.weight")
            if model_type == "gpt2":
                weight = weight.t()
            elif ours == "attn.qkv":
                weight = _neox_qkv_from_hf(weight, config)
            block[f"{ours}.weight"] = weight
            if config.bias:
                bias = _take_bias(tensors, f"{prefix}.{names[ours]}.bias", weight)
                block[f"{ours}.bias"] = (
                    _neox_qkv_from_hf(bias, config) if (ours == "attn.qkv" and model_type == "gpt_neox") else bias
                )
        return block
    parts = ("q_proj", "k_proj", "v_proj")
    block["attn.qkv.weight"] = torch.cat([_take(tensors, f"{prefix}.self_attn.{p}.weight") for p in parts])
    if config.bias:
        block["attn.qkv.bias"] = torch.cat(
            [
                _take_bias(tensors, f"{prefix}.self_attn.{p}.bias", _take(tensors, f"{prefix}.self_attn.{p}.weight"))
                for p in parts
            ]
        )
    modules = ["attn.proj", *(["attn.q_norm", "attn.k_norm"] if config.qk_norm else [])]
    if config.moe is None:
        modules += ["mlp.gate", "mlp.up", "mlp.proj"]
    for ours in modules:
        weight = _take(tensors, f"{prefix}.{names[ours]}.weight")
        block[f"{ours}.weight"] = weight
        if config.bias and "norm" not in ours:
            block[f"{ours}.bias"] = _take_bias(tensors, f"{prefix}.{names[ours]}.bias", weight)
    if config.moe is not None:
        block.update(_experts_from_hf(tensors, config, model_type, prefix))
    return block


def _experts_to_hf(out: Tensors, block: Tensors, config: GPTConfig, model_type: str, prefix: str) -> None:
    module, names = _EXPERTS[model_type]
    out[f"{prefix}.{module}.gate.weight"] = block["mlp.router.weight"]
    for expert in range(config.moe.num_experts):
        for ours in ("gate", "up", "down"):  # ours (E, in, out) → Linear (out, in)
            out[f"{prefix}.{module}.experts.{expert}.{names[ours]}.weight"] = block[f"mlp.experts.{ours}"][expert].t()


def _experts_from_hf(tensors: Tensors, config: GPTConfig, model_type: str, prefix: str) -> Tensors:
    module, names = _EXPERTS[model_type]
    result = {"mlp.router.weight": _take(tensors, f"{prefix}.{module}.gate.weight")}
    fused = f"{prefix}.mlp.experts.gate_up_proj"
    if fused in tensors:  # transformers 5's own layout: gate_up (E, 2·hidden, dim), down (E, dim, hidden)
        gate, up = tensors[fused].chunk(2, dim=1)
        result.update(
            {
                "mlp.experts.gate": gate.transpose(1, 2),
                "mlp.experts.up": up.transpose(1, 2),
                "mlp.experts.down": _take(tensors, f"{prefix}.mlp.experts.down_proj").transpose(1, 2),
            }
        )
        return {name: tensor.contiguous() for name, tensor in result.items()}
    for ours in ("gate", "up", "down"):
        result[f"mlp.experts.{ours}"] = torch.stack(
            [
                _take(tensors, f"{prefix}.{module}.experts.{expert}.{names[ours]}.weight").t()
                for expert in range(config.moe.num_experts)
            ]
        ).contiguous()
    return result


def _canonical_names(tensors: Tensors, model_type: str) -> Tensors:
    """Other spellings of the same checkpoint, renamed to what _TOP_NAMES/_PREFIX expect: GPT-2
    without `transformer.`, GPT-NeoX's lm_head as transformers 5 names it in memory, Mixtral's
    transformers 5 in-memory `mlp.` for `block_sparse_moe.`."""
    renamed = dict(tensors)
    if model_type == "gpt2":
        renamed = {
            (name if name.startswith(("transformer.", "lm_head.")) else f"transformer.{name}"): tensor
            for name, tensor in renamed.items()
        }
    if model_type == "gpt_neox" and "lm_head.weight" in renamed:
        renamed["embed_out.weight"] = renamed.pop("lm_head.weight")
    if model_type == "mixtral":
        renamed = {
            name.replace(".mlp.gate.", ".block_sparse_moe.gate.").replace(".mlp.experts.", ".block_sparse_moe.experts.")
            if not name.endswith(("gate_up_proj", "down_proj"))
            else name: tensor
            for name, tensor in renamed.items()
        }
    return renamed


def _take(tensors: Tensors, name: str) -> torch.Tensor:
    if name not in tensors:
        raise InputError(f"the checkpoint has no tensor {name!r}")
    return tensors[name]


def _take_bias(tensors: Tensors, name: str, weight: torch.Tensor) -> torch.Tensor:
    """A bias the architecture may leave out (attention_bias/mlp_bias false): zero then."""
    return tensors[name] if name in tensors else torch.zeros(weight.shape[0], dtype=weight.dtype)


def _split_qkv(tensor: torch.Tensor, config: GPTConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q_size, kv_size = config.n_head * config.head_dim, config.kv_heads * config.head_dim
    return tuple(part.contiguous() for part in tensor.split([q_size, kv_size, kv_size], dim=0))


def _neox_qkv_to_hf(tensor: torch.Tensor, config: GPTConfig) -> torch.Tensor:
    """[q | k | v] (each n_head·head_dim rows) → GPT-NeoX's [q_0, k_0, v_0, q_1, k_1, v_1, …]."""
    rest = tensor.shape[1:]
    by_head = tensor.reshape(3, config.n_head, config.head_dim, *rest).transpose(0, 1)
    return by_head.reshape(3 * config.n_embd, *rest).contiguous()


def _neox_qkv_from_hf(tensor: torch.Tensor, config: GPTConfig) -> torch.Tensor:
    rest = tensor.shape[1:]
    by_kind = tensor.reshape(config.n_head, 3, config.head_dim, *rest).transpose(0, 1)
    return by_kind.reshape(3 * config.n_embd, *rest).contiguous()
