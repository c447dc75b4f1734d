"""The engine against the correctness oracle: greedy output with the KV cache and
continuous batching equals, token for token, a plain full-recompute loop over the model."""

from __future__ import annotations

import pytest
import torch

from lmforge.common.model import GPT, GPTConfig, KVCache
from lmforge.inference.engine import Engine, QueueFull
from lmforge.inference.sampling import SamplingParams

CONFIG = GPTConfig.preset("tiny", n_layer=2, n_embd=64, n_head=4, vocab_size=101, context_length=48)
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


def test_greedy_with_cache_and_continuous_batching_equals_full_recompute(model):
    torch.manual_seed(1)
    prompts = [torch.randint(0, 101, (n,)).tolist() for n in (3, 11, 1, 7, 20, 5)]
    budgets = [12, 5, 20, 9, 8, 15]
    engine = Engine(model, max_running=3)  # fewer slots than requests: some wait, slots are reused
    greedy = [SamplingParams(max_tokens=b, temperature=0) for b in budgets]
    first = [engine.add(p, s) for p, s in zip(prompts[:4], greedy[:4], strict=True)]
    late = run_to_completion(engine, [(2, prompts[4], greedy[4]), (5, prompts[5], greedy[5])])
    for seq, prompt, budget in zip(first + late, prompts, budgets, strict=True):
        assert seq.finish_reason == "length"
        assert seq.output == full_recompute_greedy(model, prompt, budget), seq.id
    assert engine.running == {} and sorted(engine._free_slots) == [0, 1, 2]


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


def test_seeded_sampling_is_reproducible_and_top_p_narrows(model):
    def generate(seed: int, top_p: float = 1.0) -> list[int]:
        engine = Engine(model, max_running=2)
        seq = engine.add([5, 6, 7], SamplingParams(max_tokens=20, temperature=1.5, top_p=top_p, seed=seed))
        engine.add([9, 9], SamplingParams(max_tokens=20, temperature=1.0, seed=99))  # a neighbour in the batch
        while engine.has_work():
            engine.step()
        return seq.output

    assert generate(7) == generate(7)
    assert generate(7) != generate(8)
    greedy = full_recompute_greedy(model, [5, 6, 7], 20)
    assert generate(3, top_p=1e-6) == greedy  # only the most likely token survives


def test_full_queue_and_cancellation(model):
    engine = Engine(model, max_running=1, max_waiting=2)
    running = engine.add([1, 2], SamplingParams(max_tokens=30, temperature=0))
    engine.step()
    assert running.slot == 0 and engine.kv_cache_usage == 1.0
    queued = [engine.add([3], SamplingParams(max_tokens=2, temperature=0)) for _ in range(2)]
    with pytest.raises(QueueFull):
        engine.add([4], SamplingParams(max_tokens=2))
    engine.cancel(running)  # the client went away: its slot is free for the next request
    assert running.finish_reason == "cancelled" and engine.kv_cache_usage == 0.0
    engine.cancel(queued[1])
    engine.step()
    assert queued[0].slot == 0 and queued[1] not in engine.waiting
    while engine.has_work():
        engine.step()
    assert queued[0].finish_reason == "length" and queued[1].output == []


@pytest.mark.parametrize("bad", [dict(max_tokens=0), dict(temperature=-1), dict(top_p=0), dict(top_p=1.5)])
def test_bad_sampling_parameters_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_prompts_that_do_not_fit_are_refused(model):
    engine = Engine(model)
    with pytest.raises(ValueError, match="context"):
        engine.add(list(range(48)), SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        engine.add([], SamplingParams())


def test_the_cache_is_sized_by_the_key_value_heads():
    """Multi-query attention over 4 query heads: the engine's cache is a quarter of multi-head's."""
    engines = [Engine(GPT(config), max_running=3) for config in (CONFIG, LLAMA)]
    for engine in engines:
        assert engine.cache.bytes == 3 * CONFIG.context_length * KVCache.bytes_per_token(engine.config)
    assert engines[0].cache.bytes == 4 * engines[1].cache.bytes
