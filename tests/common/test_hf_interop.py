"""Hugging Face interop, both ways: each model variant written as a transformers directory
loads in transformers with no custom code and computes the same logits (fp32, within 1e-4) and
the same 32 greedy tokens as lmforge's KV-cache decoding; reading it back gives the identical
weights; transformers' own checkpoints of the supported architectures import; what no
transformers architecture computes exactly is refused with a one-line ConfigError (exit 2)."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
)

from lmforge.common.errors import ConfigError
from lmforge.model.config import GPTConfig
from lmforge.model.hf_package import write_hf_package
from lmforge.model.kv_cache import PagedKVCache
from lmforge.model.package import load_package, verify_package
from lmforge.model.paged_attention import ScheduledChunk, build_paged_batch
from lmforge.model.transformer import GPT
from tests.serving import EOT, train_tokenizer

VOCAB = 320
SMALL = {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": VOCAB, "context_length": 64}
# Llama 3 RoPE scaling that acts within the context (original length below it).
SCALED = {"multiple_of": 32, "rope_scaling": {"factor": 8.0, "original_context_length": 16}}
VARIANTS = {  # name: (preset, overrides, the transformers class it must load as)
    "llama-debug": ("llama-debug", {"vocab_size": VOCAB}, "LlamaForCausalLM"),
    "llama-mha-scaled-rope": ("llama-debug", {**SMALL, **SCALED, "n_kv_head": None}, "LlamaForCausalLM"),
    "llama-mqa-untied-bias": (
        "llama-debug",
        {**SMALL, **SCALED, "n_kv_head": 1, "tie_embeddings": False, "bias": True},
        "LlamaForCausalLM",
    ),
    "qwen3-qk-norm": ("llama-debug", {**SMALL, **SCALED, "n_kv_head": 2, "qk_norm": True}, "Qwen3ForCausalLM"),
    "moe-debug": ("moe-debug", {"vocab_size": VOCAB}, "MixtralForCausalLM"),
    "qwen3-moe": (
        "moe-debug",
        {
            **SMALL,
            **SCALED,
            "n_kv_head": 2,
            "qk_norm": True,
            "moe": {"num_experts": 4, "top_k": 2, "renormalize": False, "expert_hidden": 48},
        },
        "Qwen3MoeForCausalLM",
    ),
    "gpt-tiny": ("tiny", {"vocab_size": VOCAB}, "GPTNeoXForCausalLM"),
    "gpt-untied-bias": ("tiny", {**SMALL, "bias": True, "tie_embeddings": False}, "GPTNeoXForCausalLM"),
    "gpt2-learned-positions": ("tiny", {**SMALL, "positions": "learned"}, "GPT2LMHeadModel"),
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_tokenizer(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json", vocab_size=VOCAB)


def spread(model: GPT, seed: int) -> GPT:
    """Weights far from the init (std 0.02 gives near-uniform logits, where greedy choices are
    near-ties), biases and norm gains included."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.15 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


@pytest.fixture(scope="module")
def exported(tokenizer, tmp_path_factory):
    """Each variant once: (our model, its HF directory, transformers' model of it)."""
    root, made = tmp_path_factory.mktemp("hf"), {}

    def get(variant: str):
        if variant not in made:
            preset, overrides, _ = VARIANTS[variant]
            torch.manual_seed(0)
            model = spread(GPT(GPTConfig.preset(preset, **overrides)), seed=len(made))
            directory = write_hf_package(model, tokenizer, root / variant, step=7)
            made[variant] = model, directory, AutoModelForCausalLM.from_pretrained(directory).eval()
        return made[variant]

    return get


def tokens(count: int, seed: int, batch: int | None = None) -> torch.Tensor:
    shape = (count,) if batch is None else (batch, count)
    return torch.randint(1, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def greedy_with_kv_cache(model: GPT, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    """lmforge's decoding path: prefill into the paged KV cache, then one token at a time."""
    block = 8
    cache = PagedKVCache(model.config, num_blocks=-(-model.config.context_length // block), block_size=block)
    table = list(range(cache.num_blocks))[::-1]  # a sequence's blocks need not be in order

    def forward(new: torch.Tensor, start: int) -> torch.Tensor:
        batch = build_paged_batch([ScheduledChunk(table, start, len(new))], block, "cpu")
        return model.forward_paged(new, cache, batch, torch.tensor([len(new) - 1]))

    logits = forward(prompt, 0)
    generated = []
    for position in range(len(prompt), len(prompt) + new_tokens):
        token = logits[-1].argmax()
        generated.append(int(token))
        logits = forward(token.view(1), position)
    return generated


@pytest.mark.parametrize("variant", VARIANTS)
def test_transformers_loads_it_as_the_expected_class_with_the_same_logits(exported, variant):
    model, directory, hf = exported(variant)
    assert type(hf).__name__ == VARIANTS[variant][2]
    assert json.loads((directory / "config.json").read_text())["architectures"] == [VARIANTS[variant][2]]
    ids = tokens(48, seed=1, batch=2)
    with torch.no_grad():
        ours, theirs = model(ids)[0], hf(ids).logits
    assert ours.std() > 0.5  # logits with real spread, not a near-uniform model
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_generation_of_32_tokens_is_identical(exported, variant):
    model, _, hf = exported(variant)
    prompt = tokens(8, seed=2)
    theirs = hf.generate(prompt[None], max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
    ours = greedy_with_kv_cache(model, prompt, 32)
    assert theirs[0, len(prompt) :].tolist() == ours
    assert len(set(ours)) > 1


@pytest.mark.parametrize("variant", VARIANTS)
def test_round_trip_gives_identical_weights(exported, variant):
    model, directory, _ = exported(variant)
    back, meta = load_package(directory)
    ours, theirs = model.state_dict(), back.state_dict()
    assert set(theirs) == set(ours)
    for name, tensor in ours.items():
        assert torch.equal(theirs[name], tensor), name
    assert back.config.ffn_hidden_size == model.config.ffn_hidden_size
    assert back.config.model_dump(exclude={"ffn_hidden", "multiple_of"}) == model.config.model_dump(
        exclude={"ffn_hidden", "multiple_of"}
    )
    assert meta["format"] == "hf" and meta["step"] == 7


def test_the_tokenizer_loads_with_autotokenizer_and_encodes_as_data_prep(exported, tokenizer):
    _, directory, _ = exported("gpt-tiny")
    hf_tokenizer, ours = AutoTokenizer.from_pretrained(directory), Tokenizer.from_file(str(tokenizer))
    text = "Grüße aus München: the quick brown fox."
    assert hf_tokenizer(text).input_ids == ours.encode(text).ids  # no BOS/EOS added
    assert hf_tokenizer.decode(ours.encode(text).ids) == text
    assert hf_tokenizer.eos_token == hf_tokenizer.bos_token == EOT
    assert hf_tokenizer.eos_token_id == ours.token_to_id(EOT)
    generation = json.loads((directory / "generation_config.json").read_text())
    assert generation["eos_token_id"] == ours.token_to_id(EOT)
    assert (directory / "tokenizer.json").read_bytes() == tokenizer.read_bytes()


def test_the_package_checks_cover_the_hf_format(exported, tmp_path):
    import shutil

    _, directory, _ = exported("gpt-tiny")
    assert verify_package(directory, require_checksums=True)["files"]
    corrupt = tmp_path / "corrupt"
    shutil.copytree(directory, corrupt)
    weights = bytearray((corrupt / "model.safetensors").read_bytes())
    weights[-1] ^= 1
    (corrupt / "model.safetensors").write_bytes(bytes(weights))
    with pytest.raises(Exception, match="sha256 does not match"):
        load_package(corrupt)


def transformers_checkpoint(kind: str, tmp_path):
    """A model transformers itself builds and saves (save_pretrained: its own config.json
    spelling, e.g. transformers 5's rope_parameters; weights sharded, with an index)."""
    torch.manual_seed(0)
    shape = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 96,
        "max_position_embeddings": 64,
    }
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500_000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    if kind == "llama":
        model = LlamaForCausalLM(
            LlamaConfig(**shape, num_key_value_heads=2, rope_parameters=rope, tie_word_embeddings=False, mlp_bias=True)
        )
    elif kind == "mixtral":
        model = MixtralForCausalLM(
            MixtralConfig(
                **shape, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, rope_parameters=rope
            )
        )
    else:
        model = GPTNeoXForCausalLM(
            GPTNeoXConfig(
                **shape,
                hidden_act="gelu_pytorch_tanh",
                rotary_pct=1.0,
                use_parallel_residual=False,
                tie_word_embeddings=True,
            )
        )
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.15 * torch.randn_like(parameter))
    model.eval().save_pretrained(tmp_path / kind, max_shard_size="100KB")
    return model


@pytest.mark.parametrize("kind", ["llama", "mixtral", "gpt_neox"])
def test_a_checkpoint_transformers_saved_imports(kind, tmp_path, tokenizer):
    hf = transformers_checkpoint(kind, tmp_path)
    (tmp_path / kind / "tokenizer.json").write_bytes(tokenizer.read_bytes())
    assert (tmp_path / kind / "model.safetensors.index.json").is_file()
    model, meta = load_package(tmp_path / kind)
    assert meta["step"] is None and meta["format"] == "hf"
    ids = tokens(40, seed=3, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[0], hf(ids).logits, atol=1e-4, rtol=0)
    if kind == "llama":
        assert model.config.rope_scaling is not None and model.config.kv_heads == 2 and model.config.bias
    if kind == "gpt_neox":  # GPT-NeoX always has biases (here non-zero): they are kept
        assert model.config.bias
    if kind == "mixtral":  # transformers 5's own tensor layout (fused experts, `mlp.` names) reads the same
        hf.save_pretrained(tmp_path / "fused", save_original_format=False)
        (tmp_path / "fused" / "tokenizer.json").write_bytes(tokenizer.read_bytes())
        fused, _ = load_package(tmp_path / "fused")
        for name, tensor in model.state_dict().items():
            assert torch.equal(fused.state_dict()[name], tensor), name


REFUSED = {  # overrides on the tiny preset → what the message must name
    "rmsnorm-gelu": ({"norm": "rmsnorm"}, "norm rmsnorm with mlp gelu"),
    "gpt-gqa": ({"n_kv_head": 2}, "grouped-query"),
    "gpt-learned-swiglu": ({"positions": "learned", "mlp": "swiglu"}, "GPT-2"),
    "qk-norm-bias": ({"norm": "rmsnorm", "mlp": "swiglu", "qk_norm": True, "bias": True}, "Qwen3"),
    "shared-expert": (
        {"norm": "rmsnorm", "mlp": "swiglu", "moe": {"num_experts": 4, "shared_expert": True}},
        "shared expert",
    ),
    "eval-capacity": (
        {"norm": "rmsnorm", "mlp": "swiglu", "moe": {"num_experts": 4, "eval_capacity_factor": 1.0}},
        "eval_capacity_factor",
    ),
    "moe-no-renormalize": (
        {"norm": "rmsnorm", "mlp": "swiglu", "moe": {"num_experts": 4, "renormalize": False}},
        "renormal",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_models_without_an_exact_transformers_architecture_are_refused(case, tokenizer, tmp_path):
    overrides, reason = REFUSED[case]
    model = GPT(GPTConfig.preset("tiny", n_layer=1, n_embd=32, n_head=4, vocab_size=VOCAB, **overrides))
    with pytest.raises(ConfigError, match=reason) as refused:
        write_hf_package(model, tokenizer, tmp_path / "out", step=1)
    assert "\n" not in str(refused.value) and refused.value.exit_code == 2
    assert not (tmp_path / "out").exists()


def test_a_non_zero_moe_selection_bias_is_refused_and_a_zero_one_exports(tokenizer, tmp_path):
    config = GPTConfig.preset("moe-debug", **SMALL, multiple_of=32, moe={"num_experts": 4, "balancing": "bias"})
    model = spread(GPT(config), seed=5)
    assert write_hf_package(model, tokenizer, tmp_path / "zero-bias", step=1).is_dir()  # plain top-k: exact
    model.blocks[1].mlp.router.selection_bias[2] = 0.01
    with pytest.raises(ConfigError, match="selection bias"):
        write_hf_package(model, tokenizer, tmp_path / "bias", step=1)
