"""The decoder: shapes, causality, tied weights, init, presets and their parameter counts,
the Llama-style options (GQA, SwiGLU, RMSNorm, QK-norm, RoPE scaling, untied head, MoE), and
that it learns."""

import math

import pytest
import torch

from lmforge.common.config import load_config
from lmforge.common.errors import ConfigError
from lmforge.model.config import GPTConfig
from lmforge.model.rope import apply_rope, rope_frequencies, rope_tables
from lmforge.model.transformer import GPT, flops_per_token, fuse_qkv, parameter_counts

TINY = {"vocab_size": 97, "context_length": 32, "n_layer": 2, "n_head": 2, "n_embd": 32}
LLAMA_TINY = {**TINY, "n_head": 4, "n_kv_head": 2, "norm": "rmsnorm", "mlp": "swiglu", "multiple_of": 16,
              "rope_theta": 500_000.0, "rope_scaling": {"factor": 32.0, "original_context_length": 64}}
# Each option on: the GPT-2 shape, Llama's (GQA, SwiGLU, RMSNorm, RoPE scaling), multi-query with
# QK-norm, biases with an untied head, and a mixture of experts.
VARIANTS = {
    "gpt2": TINY,
    "llama": LLAMA_TINY,
    "mqa-qk-norm": {**LLAMA_TINY, "n_kv_head": 1, "qk_norm": True},
    "bias-untied-gelu": {**TINY, "n_head": 4, "n_kv_head": 2, "bias": True, "tie_embeddings": False},
    "moe": {**LLAMA_TINY, "qk_norm": True, "moe": {"num_experts": 4, "top_k": 2}},
}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


CASES = [pytest.param(config, id=name) for name, config in VARIANTS.items()]
CASES.append(pytest.param({**TINY, "positions": "learned"}, id="learned"))


@pytest.mark.parametrize("fields", CASES)
def test_forward_shapes_and_initial_loss(fields):
    model = GPT(GPTConfig(**fields))
    idx, targets = torch.randint(0, 97, (3, 32)), torch.randint(0, 97, (3, 32))
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 32, 97)
    assert abs(loss.item() - math.log(97)) < 0.3  # near-uniform predictions at init


@pytest.mark.parametrize("fields", CASES)
def test_attention_is_causal(fields):
    model = GPT(GPTConfig(**fields)).eval()
    idx = torch.randint(0, 97, (1, 20))
    changed = idx.clone()
    changed[0, 12] = (idx[0, 12] + 1) % 97
    before, _ = model(idx)
    after, _ = model(changed)
    assert torch.allclose(before[0, :12], after[0, :12], atol=1e-6)
    assert not torch.allclose(before[0, 12:], after[0, 12:])


def test_rope_scores_depend_only_on_relative_position():
    config = GPTConfig(**TINY)
    cos, sin = rope_tables(config)
    q, k = torch.randn(1, 1, 1, config.head_dim), torch.randn(1, 1, 1, config.head_dim)

    def score(m: int, n: int) -> float:
        qm = apply_rope(q.expand(1, 1, m + 1, -1).contiguous(), cos, sin)[0, 0, m]
        kn = apply_rope(k.expand(1, 1, n + 1, -1).contiguous(), cos, sin)[0, 0, n]
        return float(qm @ kn)

    assert score(7, 3) == pytest.approx(score(14, 10), abs=1e-4)
    assert score(7, 3) != pytest.approx(score(7, 5), abs=1e-3)


def test_tied_embeddings_and_depth_scaled_init():
    config = GPTConfig(**{**TINY, "n_layer": 8, "n_embd": 256, "n_head": 4})
    model = GPT(config)
    assert model.lm_head.weight.data_ptr() == model.wte.weight.data_ptr()
    residual = model.blocks[0].attn.proj.weight.std().item()
    assert residual == pytest.approx(0.02 / math.sqrt(16), rel=0.1)
    assert model.blocks[0].attn.query.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_presets_are_overridable_and_unknown_ones_refused():
    assert GPTConfig.preset("tiny", n_layer=2).n_layer == 2  # any field overridable
    assert GPTConfig.preset("moe-debug", moe=None).moe is None
    with pytest.raises(ConfigError, match="unknown preset"):
        GPTConfig.preset("7b")


def test_moe_active_parameters_count_top_k_experts():
    total, active = parameter_counts(GPTConfig.preset("moe-8x1b"))
    assert total - active == 16 * 6 * 3 * 2048 * 8192  # 6 of 8 experts unused per token and layer
    dense = parameter_counts(GPTConfig.preset("llama-1b"))
    assert dense[0] == dense[1]


@pytest.mark.parametrize(("name", "hidden"), [
    ("tiny", 512), ("llama-debug", 768), ("llama-125m", 1536), ("llama-350m", 2560),
    ("llama-1b", 8192), ("llama-3b", 8192), ("llama-8b", 14336), ("llama-70b", 28672),
])
def test_ffn_hidden_size_follows_the_gelu_and_llama_rules(name, hidden):
    """gelu: 4d; swiglu: int(⅔·4d), times ffn_dim_multiplier, up to a multiple of multiple_of
    (the intermediate_size of each model's Hugging Face config)."""
    assert GPTConfig.preset(name).ffn_hidden_size == hidden
    assert GPTConfig.preset(name, ffn_hidden=100).ffn_hidden_size == 100


def test_gpt2_state_dict_names_and_shapes_and_a_fused_qkv_loads():
    """Checkpoints and packages of the GPT-2-style presets keep loading: the same tensors, with
    queries, keys and values each their own projection; an older fused attn.qkv loads into them."""
    model = GPT(GPTConfig(**{**TINY, "n_layer": 1}))
    d, vocab = 32, 97
    fused = fuse_qkv(model.state_dict())
    assert {k: tuple(v.shape) for k, v in fused.items()} == {
        "wte.weight": (vocab, d), "blocks.0.ln_1.weight": (d,), "blocks.0.attn.qkv.weight": (3 * d, d),
        "blocks.0.attn.proj.weight": (d, d), "blocks.0.ln_2.weight": (d,), "blocks.0.mlp.fc.weight": (4 * d, d),
        "blocks.0.mlp.proj.weight": (d, 4 * d), "ln_f.weight": (d,), "lm_head.weight": (vocab, d)}
    other = GPT(GPTConfig(**{**TINY, "n_layer": 1}))
    other.load_state_dict(fused)
    for name, tensor in model.state_dict().items():
        assert torch.equal(other.state_dict()[name], tensor), name


def test_llama_shape_modules():
    config = GPTConfig(**{**VARIANTS["mqa-qk-norm"], "n_kv_head": 2, "tie_embeddings": False})
    model = GPT(config)
    block, d, head_dim = model.blocks[0], 32, 8
    assert block.attn.query.weight.shape == (4 * head_dim, d)  # 4 query heads, 2 key and value heads
    assert block.attn.key.weight.shape == block.attn.value.weight.shape == (2 * head_dim, d)
    assert (block.attn.q_norm.weight.shape, block.attn.k_norm.weight.shape) == ((head_dim,), (head_dim,))
    assert [name for name, _ in block.mlp.named_children()] == ["gate", "up", "proj"]
    assert block.mlp.gate.weight.shape == (config.ffn_hidden_size, d)
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
    assert model.lm_head.weight.data_ptr() != model.wte.weight.data_ptr()
    assert model.num_params() == sum(p.numel() for p in model.state_dict().values())  # nothing shared


def test_llama3_rope_scaling_equals_transformers():
    """Llama 3.1's frequency scaling, bit for bit as transformers computes it."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for name in ("llama-debug", "llama-1b", "llama-8b"):
        config = GPTConfig.preset(name)
        scaling = config.rope_scaling
        hf = LlamaConfig(hidden_size=config.n_embd, num_attention_heads=config.n_head,
                         max_position_embeddings=config.context_length * 64, rope_parameters={
                             "rope_type": "llama3", "rope_theta": config.rope_theta, "factor": scaling.factor,
                             "low_freq_factor": scaling.low_freq_factor, "high_freq_factor": scaling.high_freq_factor,
                             "original_max_position_embeddings": scaling.original_context_length})
        expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, None)
        ours = rope_frequencies(config)
        assert torch.equal(ours, expected), name
        plain = rope_frequencies(config.model_copy(update={"rope_scaling": None}))
        assert (ours < plain).any() and (ours == plain).any(), name  # some bands stretched, some kept


def test_moe_aux_loss_is_added_and_its_stats_reported():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**VARIANTS["moe"]))
    idx = torch.randint(0, 97, (2, 32))
    logits, loss = model(idx, idx)
    cross_entropy = torch.nn.functional.cross_entropy(logits.view(-1, 97), idx.view(-1))
    aux = sum(block.mlp.aux_loss for block in model.blocks)
    assert aux > 0
    torch.testing.assert_close(loss, cross_entropy + aux)
    stats = model.moe_stats()
    assert set(stats) == {"load_max_over_mean", "dropped_fraction", "balance_loss", "z_loss"}
    layers = [block.mlp.stats["z_loss"] for block in model.blocks]
    assert stats["z_loss"] == pytest.approx(sum(layers) / len(layers))
    assert GPT(GPTConfig(**TINY)).moe_stats() == {}
    logits, val_loss = model.eval()(idx, idx)  # evaluation: the cross-entropy alone
    torch.testing.assert_close(val_loss, torch.nn.functional.cross_entropy(logits.view(-1, 97), idx.view(-1)))


def test_bad_shapes_are_config_errors():
    with pytest.raises(ConfigError, match="divisible"):
        load_config(GPTConfig, None, ["n_embd=100", "n_head=3"])
    with pytest.raises(ConfigError, match="even head dimension"):
        load_config(GPTConfig, None, ["n_embd=30", "n_head=2"])


def test_too_long_sequence_is_refused():
    model = GPT(GPTConfig(**TINY))
    with pytest.raises(ValueError, match="context length"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_flops_per_token_formula():
    config = GPTConfig.preset("124m")
    d, layers, vocab, seq = 768, 12, 50304, 1024
    assert flops_per_token(config) == 6 * (layers * 12 * d * d + vocab * d) + 12 * layers * d * seq


@pytest.mark.parametrize("name", ["llama-debug", "llama-1b", "llama-8b", "llama-70b", "moe-debug", "moe-8x1b"])
def test_flops_per_token_counts_the_matmul_parameters_a_token_uses(name):
    """6 × (the active parameters less the embedding lookup and the norm gains) + attention:
    GQA's smaller key/value projections, SwiGLU's three matrices, top_k experts of E."""
    config = GPTConfig.preset(name)
    _, active = parameter_counts(config)
    d, layers = config.n_embd, config.n_layer
    lookup = 0 if config.tie_embeddings else config.vocab_size * d  # a tied table is also the head
    norms = (2 * layers + 1) * d
    expected = 6 * (active - lookup - norms) + 12 * layers * d * 4096
    assert flops_per_token(config, 4096) == expected


@pytest.mark.parametrize("fields", [pytest.param(TINY, id="gpt2"), pytest.param(VARIANTS["mqa-qk-norm"], id="llama")])
def test_it_learns_a_repeating_sequence(fields):
    model = GPT(GPTConfig(**fields))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.arange(33).remainder(7).unsqueeze(0).repeat(4, 1)
    for _ in range(150):
        _, loss = model(data[:, :-1], data[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.1


@pytest.mark.parametrize("variant", ["gpt2", "bias-untied-gelu", "moe"])
def test_every_variant_round_trips_through_the_serving_package(tmp_path, variant):
    """An untied head is stored (a tied one is not stored twice); the loaded model computes the same."""
    from safetensors import safe_open

    from lmforge.model.package import load_package, write_package

    model = GPT(GPTConfig(**VARIANTS[variant])).eval()
    (tmp_path / "tokenizer.json").write_text("{}")
    package = write_package(model, tmp_path / "tokenizer.json", tmp_path / "package", step=1)
    with safe_open(package / "model.safetensors", "pt") as weights:
        assert ("lm_head.weight" in set(weights.keys())) == (variant == "bias-untied-gelu")
    loaded, _ = load_package(package)
    idx = torch.randint(0, 97, (1, 16))
    torch.testing.assert_close(loaded(idx)[0], model(idx)[0], atol=0, rtol=0)


def test_set_rope_recomputes_the_tables_in_place_for_a_stage():
    """A schedule stage's RoPE base and scaling: the model computes as one built with them."""
    from lmforge.model.config import RopeScaling
    from lmforge.model.rope import set_rope

    torch.manual_seed(0)
    config = GPTConfig(**LLAMA_TINY)
    model = GPT(config)
    tables = model.rope_cos
    scaling = RopeScaling(factor=8.0, original_context_length=16)
    staged = set_rope(model, config, 1_000_000.0, scaling)
    assert (staged.rope_theta, staged.rope_scaling) == (1_000_000.0, scaling)
    assert model.rope_cos is tables  # in place: every holder of the buffer (pipeline chunks) sees it
    torch.manual_seed(0)
    fresh = GPT(staged)
    idx = torch.randint(0, TINY["vocab_size"], (2, 16))
    assert torch.equal(model(idx)[0], fresh(idx)[0])
    assert set_rope(model, config, None, None) == config and torch.equal(model.rope_cos, GPT(config).rope_cos)
