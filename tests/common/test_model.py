"""The GPT definition: shapes, causality, tied weights, init, presets, and that it learns."""

import math

import pytest
import torch

from lmforge.common.config import load_config
from lmforge.common.errors import ConfigError
from lmforge.common.model import GPT, PRESETS, GPTConfig, apply_rope, flops_per_token, rope_tables

TINY = {"vocab_size": 97, "context_length": 32, "n_layer": 2, "n_head": 2, "n_embd": 32}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_forward_shapes_and_initial_loss(positions):
    model = GPT(GPTConfig(**TINY, positions=positions))
    idx, targets = torch.randint(0, 97, (3, 32)), torch.randint(0, 97, (3, 32))
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 32, 97)
    assert abs(loss.item() - math.log(97)) < 0.3  # near-uniform predictions at init


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_attention_is_causal(positions):
    model = GPT(GPTConfig(**TINY, positions=positions)).eval()
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
    assert model.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_presets_have_the_sizes_their_names_say():
    expected = {"124m": 124e6, "350m": 354e6, "760m": 757e6, "1.3b": 1.31e9}
    for name, size in expected.items():
        with torch.device("meta"):
            model = GPT(GPTConfig.preset(name))
        assert model.num_params() == pytest.approx(size, rel=0.02), name
    assert GPTConfig.preset("tiny", n_layer=2).n_layer == 2  # any field overridable
    with pytest.raises(ConfigError, match="unknown preset"):
        GPTConfig.preset("7b")
    assert set(PRESETS) == {"tiny", "124m", "350m", "760m", "1.3b"}


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


def test_it_learns_a_repeating_sequence():
    model = GPT(GPTConfig(**TINY))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.arange(33).remainder(7).unsqueeze(0).repeat(4, 1)
    for _ in range(150):
        _, loss = model(data[:, :-1], data[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.1
