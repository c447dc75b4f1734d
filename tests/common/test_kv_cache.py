"""The KV-cache forward path equals the full forward pass, for prefill and for batched
decode of sequences at different positions, for every model variant; grouped-query attention
caches only the key/value heads."""

from __future__ import annotations

import pytest
import torch

from lmforge.common.model import GPT, GPTConfig, KVCache

SHAPE = {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 97, "context_length": 32}
LLAMA = {"norm": "rmsnorm", "mlp": "swiglu", "n_kv_head": 2, "qk_norm": True, "multiple_of": 32,
         "rope_theta": 500_000.0, "rope_scaling": {"factor": 32.0, "original_context_length": 64}}
VARIANTS = {
    "rope": {},
    "learned": {"positions": "learned"},
    "gqa-swiglu-rmsnorm-qk-norm": LLAMA,
    "mqa-bias-untied": {**LLAMA, "n_kv_head": 1, "bias": True, "tie_embeddings": False},
    "moe": {**LLAMA, "moe": {"num_experts": 4, "top_k": 2}},  # eval mode: no token dropped
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_prefill_and_decode_match_the_full_forward(variant):
    torch.manual_seed(0)
    config = GPTConfig.preset("tiny", **SHAPE, **VARIANTS[variant])
    model = GPT(config).eval()
    cache = KVCache(config, slots=3)
    prompts = [torch.randint(0, 97, (n,)) for n in (5, 9, 2)]
    sequences = [p.clone() for p in prompts]
    slots = [2, 0, 1]  # slots need not follow the batch order
    for seq, slot in zip(prompts, slots, strict=True):
        logits = model.forward_cached(seq[None], torch.arange(len(seq))[None], cache, torch.tensor([slot]))
        full, _ = model(seq[None])
        torch.testing.assert_close(logits, full, atol=1e-5, rtol=1e-5)
    for _ in range(6):  # batched decode, every sequence at its own position
        new = torch.randint(0, 97, (3, 1))
        positions = torch.tensor([[len(s)] for s in sequences])
        logits = model.forward_cached(new, positions, cache, torch.tensor(slots))
        sequences = [torch.cat([s, n]) for s, n in zip(sequences, new, strict=True)]
        for row, seq in enumerate(sequences):
            full, _ = model(seq[None])
            torch.testing.assert_close(logits[row, -1], full[0, -1], atol=1e-5, rtol=1e-5)


def test_positions_past_the_context_are_refused():
    config = GPTConfig.preset("tiny", n_layer=1, n_embd=32, n_head=2, vocab_size=11, context_length=8)
    model = GPT(config).eval()
    with pytest.raises(ValueError, match="context length"):
        model.forward_cached(torch.zeros(1, 1, dtype=torch.long), torch.tensor([[8]]), KVCache(config, 1),
                             torch.tensor([0]))


def test_reading_consecutive_slots_through_a_view_equals_the_gather():
    torch.manual_seed(1)
    config = GPTConfig.preset("tiny", n_layer=2, n_embd=64, n_head=4, vocab_size=97, context_length=32)
    model = GPT(config).eval()
    caches = [KVCache(config, slots=4), KVCache(config, slots=4)]
    prompts = [torch.randint(0, 97, (n,)) for n in (4, 7, 3)]
    for cache in caches:
        for slot, prompt in zip((1, 2, 3), prompts, strict=True):
            model.forward_cached(prompt[None], torch.arange(len(prompt))[None], cache, torch.tensor([slot]))
    new = torch.randint(0, 97, (3, 1))
    positions = torch.tensor([[len(p)] for p in prompts])
    gathered = model.forward_cached(new, positions, caches[0], torch.tensor([1, 2, 3]))
    viewed = model.forward_cached(new, positions, caches[1], torch.tensor([1, 2, 3]), first_slot=1)
    torch.testing.assert_close(viewed, gathered, atol=0, rtol=0)
    for a, b in zip(caches[0].keys + caches[0].values, caches[1].keys + caches[1].values, strict=True):
        assert torch.equal(a, b)


def test_the_cache_holds_only_the_key_value_heads():
    """GQA shrinks the cache per token by n_head/kv_heads: 4 heads over 2 KV heads halve it, multi-query quarters it."""
    full = GPTConfig.preset("tiny", **SHAPE)
    per_token = KVCache.bytes_per_token(full)
    assert per_token == 2 * 2 * 4 * 16 * 4  # keys and values × layers × heads × head_dim × fp32 bytes
    for kv_heads in (2, 1):
        config = GPTConfig.preset("tiny", **SHAPE, n_kv_head=kv_heads)
        cache = KVCache(config, slots=3)
        assert KVCache.bytes_per_token(config) * 4 == per_token * kv_heads
        assert cache.bytes == 3 * 32 * KVCache.bytes_per_token(config)
        assert cache.keys[0].shape == (3, kv_heads, 32, 16)
    assert KVCache.bytes_per_token(GPTConfig.preset("llama-70b"), torch.bfloat16) == 2 * 80 * 8 * 128 * 2
