"""The paged KV-cache forward path equals the full forward pass, for every model variant: one
step packing chunked prefills and decodes of sequences at different positions, whose blocks
are scattered through the pool; grouped-query attention caches only the key/value heads."""

from __future__ import annotations

import pytest
import torch

from lmforge.model.config import GPTConfig
from lmforge.model.kv_cache import PagedKVCache
from lmforge.model.paged_attention import ScheduledChunk, build_paged_batch
from lmforge.model.transformer import GPT

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
BLOCK = 4


@pytest.mark.parametrize("variant", VARIANTS)
def test_packed_chunked_prefill_and_decode_match_the_full_forward(variant):
    torch.manual_seed(0)
    config = GPTConfig.preset("tiny", **SHAPE, **VARIANTS[variant])
    model = GPT(config).eval()
    cache = PagedKVCache(config, num_blocks=24, block_size=BLOCK)
    sequences = [torch.randint(0, 97, (n,)) for n in (5, 13, 2)]
    tables = [[7, 3, 20, 1, 9, 0, 15, 22], [2, 11, 4, 19, 6, 17, 8, 21], [23, 5, 10, 13, 12, 14, 16, 18]]
    done = [0, 0, 0]  # tokens of each sequence in the cache
    # Step 1: sequence 0 whole, sequence 1's first chunk of 6; step 2: sequence 0 decodes, 1's
    # second chunk, 2's prefill; then every sequence decodes, one token a step.
    plans = [[(0, 5), (1, 6)], [(0, 1), (1, 7), (2, 2)]] + [[(0, 1), (1, 1), (2, 1)]] * 5
    for plan in plans:
        for index, count in plan:  # a decode brings one new token
            if done[index] + count > len(sequences[index]):
                sequences[index] = torch.cat([sequences[index], torch.randint(0, 97, (1,))])
        chunks = [ScheduledChunk(tables[i], done[i], count) for i, count in plan]
        new = torch.cat([sequences[i][done[i]:done[i] + count] for i, count in plan])
        logits = model.forward_paged(new, cache, build_paged_batch(chunks, BLOCK, "cpu"))
        offset = 0
        for index, count in plan:
            full, _ = model(sequences[index][None])
            torch.testing.assert_close(logits[offset:offset + count], full[0, done[index]:done[index] + count],
                                       atol=1e-5, rtol=1e-5)
            offset += count
            done[index] += count


def test_only_the_asked_logits_are_computed():
    torch.manual_seed(1)
    config = GPTConfig.preset("tiny", **SHAPE)
    model = GPT(config).eval()
    prompt = torch.randint(0, 97, (9,))
    batch = build_paged_batch([ScheduledChunk([1, 0, 2], 0, 9)], BLOCK, "cpu")
    last = model.forward_paged(prompt, PagedKVCache(config, 3, BLOCK), batch, torch.tensor([8]))
    full, _ = model(prompt[None])
    assert last.shape == (1, 97)
    torch.testing.assert_close(last[0], full[0, -1], atol=1e-5, rtol=1e-5)


def test_positions_past_the_context_are_refused():
    config = GPTConfig.preset("tiny", n_layer=1, n_embd=32, n_head=2, vocab_size=11, context_length=8)
    model = GPT(config).eval()
    batch = build_paged_batch([ScheduledChunk([0, 1, 2], 8, 1)], BLOCK, "cpu")
    with pytest.raises(ValueError, match="context length"):
        model.forward_paged(torch.zeros(1, dtype=torch.long), PagedKVCache(config, 3, BLOCK), batch)


def test_the_cache_holds_only_the_key_value_heads():
    """GQA shrinks the cache per token by n_head/kv_heads: 4 heads over 2 KV heads halve it, multi-query quarters it."""
    full = GPTConfig.preset("tiny", **SHAPE)
    per_token = PagedKVCache.bytes_per_token(full)
    assert per_token == 2 * 2 * 4 * 16 * 4  # keys and values × layers × heads × head_dim × fp32 bytes
    for kv_heads in (2, 1):
        config = GPTConfig.preset("tiny", **SHAPE, n_kv_head=kv_heads)
        cache = PagedKVCache(config, num_blocks=6, block_size=BLOCK)
        assert PagedKVCache.bytes_per_token(config) * 4 == per_token * kv_heads
        assert cache.bytes == 6 * BLOCK * PagedKVCache.bytes_per_token(config)
        assert cache.keys[0].shape == (6 * BLOCK, kv_heads, 16)
        assert PagedKVCache.blocks_for_bytes(config, cache.bytes + 1, BLOCK) == 6
    assert PagedKVCache.bytes_per_token(GPTConfig.preset("llama-70b"), torch.bfloat16) == 2 * 80 * 8 * 128 * 2
