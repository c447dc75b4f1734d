"""A prompt longer than the step's token budget, alone on the engine: its first steps compute
prefill chunks only, with no row to sample (found by bench/serve/engine_bench.py's figure 4)."""

import torch

from lmforge.inference.engine import Engine
from lmforge.inference.sampling import SamplingParams
from lmforge.model.config import GPTConfig
from lmforge.model.transformer import GPT


def test_a_prompt_over_the_token_budget_is_prefilled_in_chunks_then_decoded():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny")).eval()
    prompt = list(range(1, 150))
    engine = Engine(model, max_running=2, max_batched_tokens=64, kv_cache_bytes=None)
    seq = engine.add(prompt, SamplingParams(max_tokens=3, temperature=0.0))
    steps = [engine.step() for _ in range(2)]  # 64 + 64 of 149 tokens: nothing sampled yet
    assert steps == [[], []] and not seq.output
    while engine.has_work():
        engine.step()
    expected = list(prompt)
    for _ in range(3):  # the full-recompute oracle
        logits, _ = model(torch.tensor([expected]))
        expected.append(int(logits[0, -1].argmax()))
    assert seq.output == expected[len(prompt):] and seq.finish_reason == "length"
