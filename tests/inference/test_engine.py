"""The engine against the correctness oracle: greedy output with the paged KV cache, chunked
prefill, preemption, prefix caching and continuous batching equals, token for token, a plain
full-recompute loop over the model."""

from __future__ import annotations

import pytest
import torch

from lmforge.inference.engine import Engine, QueueFull
from lmforge.inference.sampling import SamplingParams
from lmforge.model.config import GPTConfig
from lmforge.model.kv_cache import PagedKVCache
from lmforge.model.transformer import GPT

# Untied embeddings: a small random model with tied ones only repeats its last token, whatever
# attention computes, so greedy equality with the oracle would prove nothing.
CONFIG = GPTConfig.preset("tiny", n_layer=2, n_embd=64, n_head=4, vocab_size=101, context_length=48,
                          tie_embeddings=False)
LLAMA = CONFIG.model_copy(update={"norm": "rmsnorm", "mlp": "swiglu", "n_kv_head": 1, "qk_norm": True})
MOE = GPTConfig.model_validate({**LLAMA.model_dump(), "n_kv_head": 2, "moe": {"num_experts": 4}})


@pytest.fixture(scope="module", params=[CONFIG, LLAMA, MOE], ids=["gpt2", "llama-mqa", "moe"])
def model(request):
    torch.manual_seed(0)
    return GPT(request.param).eval()


@torch.no_grad()
def full_recompute_greedy(model, prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        logits, _ = model(torch.tensor([tokens]))
        tokens.append(int(torch.argmax(logits[0, -1])))
        if len(tokens) >= CONFIG.context_length:
            break
    return tokens[len(prompt) :]


def run_to_completion(engine: Engine, late: list[tuple[int, list[int], SamplingParams]]) -> list:
    """Step until idle, adding each late request at its step; returns the late sequences."""
    steps, late, added = 0, list(late), []
    while engine.has_work() or late:
        while late and late[0][0] <= steps:  # requests arriving while others run
            _, prompt, params = late.pop(0)
            added.append(engine.add(prompt, params))
        engine.step()
        steps += 1
    return added


def test_greedy_with_paged_cache_chunked_prefill_and_continuous_batching_equals_full_recompute(model):
    torch.manual_seed(1)
    prompts = [torch.randint(0, 101, (n,)).tolist() for n in (3, 11, 1, 7, 20, 5)]
    budgets = [12, 5, 20, 9, 8, 15]
    # Blocks of 4 tokens, 8 tokens a step: prompts are prefilled in chunks beside decodes,
    # several at once; at most 3 running, so some wait.
    engine = Engine(model, max_running=3, block_size=4, max_batched_tokens=8)
    greedy = [SamplingParams(max_tokens=b, temperature=0) for b in budgets]
    first = [engine.add(p, s) for p, s in zip(prompts[:4], greedy[:4], strict=True)]
    late = run_to_completion(engine, [(2, prompts[4], greedy[4]), (5, prompts[5], greedy[5])])
    for seq, prompt, budget in zip(first + late, prompts, budgets, strict=True):
        assert seq.finish_reason == "length"
        assert seq.output == full_recompute_greedy(model, prompt, budget), seq.id
    assert engine.running == [] and engine.blocks.num_used == 0 and engine.kv_cache_usage == 0.0


def test_running_out_of_blocks_preempts_the_newest_and_recomputes_it(model):
    """A pool of 14 blocks of 4 tokens (one 48-token context and 2 blocks): four requests of 10
    prompt and 25 new tokens fit at admission, not once they grow. The newest are preempted,
    prefilled again later (prompt and output so far), and every output still equals the oracle."""
    per_block = 4 * PagedKVCache.bytes_per_token(model.config)
    engine = Engine(model, block_size=4, max_batched_tokens=64, kv_cache_bytes=14 * per_block)
    assert engine.cache.num_blocks == 14
    torch.manual_seed(2)
    prompts = [torch.randint(0, 101, (10,)).tolist() for _ in range(4)]
    seqs = [engine.add(p, SamplingParams(max_tokens=25, temperature=0)) for p in prompts]
    peak = 0
    while engine.has_work():
        engine.step()
        peak = max(peak, len(engine.running))
        assert engine.blocks.num_used <= 14
    assert peak >= 3 and engine.stats().preemptions >= 1
    for seq, prompt in zip(seqs, prompts, strict=True):
        assert seq.output == full_recompute_greedy(model, prompt, 25)


def test_admission_is_by_free_blocks_not_slots(model):
    per_block = 4 * PagedKVCache.bytes_per_token(model.config)
    engine = Engine(model, block_size=4, kv_cache_bytes=24 * per_block)  # two full contexts' worth
    for _ in range(10):
        engine.add([1, 2, 3, 4, 5], SamplingParams(max_tokens=3, temperature=0))  # 2 blocks each
    engine.step()
    assert len(engine.running) == 10  # five times what two context-sized slots would hold
    assert engine.kv_cache_usage == 20 / 24 and engine.stats().kv_blocks_in_use == 20


def test_a_shared_prefix_is_prefilled_once(model):
    torch.manual_seed(3)
    system = torch.randint(0, 101, (17,)).tolist()
    questions = [system + torch.randint(0, 101, (3,)).tolist() for _ in range(3)]
    outputs = {}
    for caching in (True, False):
        engine = Engine(model, block_size=4, prefix_caching=caching)
        seqs = []
        for prompt in questions + [questions[0]]:  # one after the other; the last repeats the first
            seqs.append(engine.add(prompt, SamplingParams(max_tokens=4, temperature=0)))
            while engine.has_work():
                engine.step()
        stats = engine.stats()
        assert stats.prefix_cache_queries == 4 * 20
        outputs[caching] = [seq.output for seq in seqs]
        if caching:
            # The 17 shared tokens hold 4 full blocks (16 tokens), found by the 2nd, 3rd and 4th
            # request. The repeat of the first could take 5, but one token is always computed (its
            # logits give the first new token), so it takes 4 too.
            assert stats.prefix_cache_hits == 3 * 16
            assert stats.prefill_tokens == 4 * 20 - 3 * 16
        else:
            assert stats.prefix_cache_hits == 0
    assert outputs[True] == outputs[False] == [full_recompute_greedy(model, p, 4) for p in questions + questions[:1]]


def test_cached_blocks_are_evicted_least_recently_freed_first_when_the_pool_is_full(model):
    per_block = 4 * PagedKVCache.bytes_per_token(model.config)
    engine = Engine(model, block_size=4, kv_cache_bytes=12 * per_block)
    for prompt in ([1] * 17, [2] * 17, [1] * 17):  # 36 tokens computed each: 9 blocks
        seq = engine.add(prompt, SamplingParams(max_tokens=20, temperature=0))
        while engine.has_work():
            engine.step()
        assert seq.finish_reason == "length"
    # The first request left 9 full blocks cached; the second took the 3 never used, then 6 of
    # the first's, its last ones first: the third found the first's 3 first blocks.
    assert engine.stats().prefix_cache_hits == 12 and engine.blocks.num_used == 0


def test_sequences_stop_at_the_context_length_and_on_stop_tokens(model):
    engine = Engine(model, max_running=2)
    near_full = engine.add(list(range(1, 45)), SamplingParams(max_tokens=100, temperature=0))
    expected = full_recompute_greedy(model, list(range(1, 10)), 6)
    stop_at = expected[3]
    stopping = engine.add(list(range(1, 10)), SamplingParams(max_tokens=100, temperature=0,
                                                             stop_token_ids=(stop_at,)))
    while engine.has_work():
        engine.step()
    assert len(near_full.output) == CONFIG.context_length - 44 and near_full.finish_reason == "length"
    assert stopping.finish_reason == "stop" and stopping.output == expected[: expected.index(stop_at) + 1]


def test_seeded_sampling_is_reproducible_whatever_the_batch_and_top_p_top_k_narrow(model):
    def generate(seed: int, neighbours: int = 1, top_p: float = 1.0, top_k: int = 0, budget: int = 512) -> list[int]:
        engine = Engine(model, max_batched_tokens=budget, block_size=4)
        for n in range(neighbours):  # ahead in the queue: other rows, other chunking
            engine.add([9, 9, n] * (n + 1), SamplingParams(max_tokens=20, temperature=1.0, seed=99 + n))
        seq = engine.add([5, 6, 7], SamplingParams(max_tokens=20, temperature=1.5, top_p=top_p, top_k=top_k,
                                                   seed=seed))
        while engine.has_work():
            engine.step()
        return seq.output

    alone = generate(7, neighbours=0)
    assert generate(7, neighbours=1) == alone == generate(7, neighbours=5, budget=6)
    assert generate(8) != alone
    greedy = full_recompute_greedy(model, [5, 6, 7], 20)
    assert generate(3, top_p=1e-6) == greedy == generate(3, top_k=1)  # only the most likely token survives
    assert generate(7, top_k=5) != alone


def test_full_queue_and_cancellation(model):
    engine = Engine(model, max_running=1, max_waiting=2)
    running = engine.add([1, 2], SamplingParams(max_tokens=30, temperature=0))
    engine.step()
    assert engine.running == [running] and engine.kv_cache_usage > 0
    queued = [engine.add([3], SamplingParams(max_tokens=2, temperature=0)) for _ in range(2)]
    with pytest.raises(QueueFull):
        engine.add([4], SamplingParams(max_tokens=2))
    engine.cancel(running)  # the client went away: its blocks are free for the next request
    assert running.finish_reason == "cancelled" and engine.kv_cache_usage == 0.0
    engine.cancel(queued[1])
    engine.step()
    assert engine.running == [queued[0]] and queued[1] not in engine.waiting
    while engine.has_work():
        engine.step()
    assert queued[0].finish_reason == "length" and queued[1].output == []


@pytest.mark.parametrize("bad", [dict(max_tokens=0), dict(temperature=-1), dict(top_p=0), dict(top_p=1.5),
                                 dict(top_k=-1)])
def test_bad_sampling_parameters_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_prompts_that_do_not_fit_are_refused(model):
    engine = Engine(model)
    with pytest.raises(ValueError, match="context"):
        engine.add(list(range(48)), SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        engine.add([], SamplingParams())


def test_a_pool_smaller_than_one_context_is_refused(model):
    per_token = PagedKVCache.bytes_per_token(model.config)
    with pytest.raises(ValueError, match="one full context"):
        Engine(model, block_size=16, kv_cache_bytes=47 * per_token)
    assert Engine(model, block_size=16, kv_cache_bytes=48 * per_token).cache.num_blocks == 3


def test_the_cache_is_sized_by_the_key_value_heads():
    """Multi-query attention over 4 query heads: the same budget holds 4 times the blocks of multi-head's."""
    budget = 64 * 48 * PagedKVCache.bytes_per_token(CONFIG)
    engines = [Engine(GPT(config), kv_cache_bytes=budget) for config in (CONFIG, LLAMA)]
    assert engines[0].cache.bytes == engines[1].cache.bytes == budget
    assert 4 * engines[0].cache.num_blocks == engines[1].cache.num_blocks


def test_a_bfloat16_model_keeps_a_bfloat16_cache_and_generates():
    """The GPU's dtype on CPU: the cache takes the model's dtype, attention and sampling run in it
    (logits are sampled in float32), and greedy output equals the full recompute in bfloat16."""
    torch.manual_seed(4)
    model = GPT(LLAMA).eval().to(torch.bfloat16)
    engine = Engine(model, block_size=4, max_batched_tokens=8)
    greedy = engine.add(list(range(1, 12)), SamplingParams(max_tokens=10, temperature=0))
    sampled = engine.add(list(range(5, 25)), SamplingParams(max_tokens=10, temperature=0.8, top_k=20, seed=1))
    while engine.has_work():
        engine.step()
    assert engine.cache.keys[0].dtype == torch.bfloat16
    assert engine.cache.bytes == engine.cache.num_blocks * 4 * PagedKVCache.bytes_per_token(LLAMA, torch.bfloat16)
    assert len(sampled.output) == 10 and sampled.finish_reason == "length"
    assert greedy.output == full_recompute_greedy(model, list(range(1, 12)), 10)
