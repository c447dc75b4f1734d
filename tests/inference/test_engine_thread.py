"""The engine thread feeds tokens to asyncio consumers, concurrently, and cancellation from
the event loop frees the sequence."""

from __future__ import annotations

import asyncio

import torch

from lmforge.inference.engine import Engine
from lmforge.inference.engine_thread import EngineThread
from lmforge.inference.sampling import SamplingParams
from lmforge.model.config import GPTConfig
from lmforge.model.transformer import GPT


def test_concurrent_streams_and_cancellation():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", n_layer=1, n_embd=32, n_head=2, vocab_size=53, context_length=64))
    thread = EngineThread(Engine(model, max_running=2))
    thread.start()

    async def collect(prompt, n):
        handle = thread.submit(prompt, SamplingParams(max_tokens=n, temperature=0))
        return [t async for t in handle.tokens()], handle.seq

    async def cancel_after(k):
        handle = thread.submit([1, 2, 3], SamplingParams(max_tokens=50, temperature=0))
        got = []
        async for token in handle.tokens():
            got.append(token)
            if len(got) == k:
                thread.cancel(handle)
                break
        return got, handle.seq

    async def main():
        return await asyncio.gather(collect([4, 5], 7), collect([6], 12), cancel_after(3), collect([7, 8, 9], 5))

    try:
        results = asyncio.run(main())
        assert thread.alive
    finally:
        thread.stop()
    for tokens, seq in results:
        if seq.finish_reason == "cancelled":
            assert tokens == seq.output[:3]
        else:
            assert tokens == seq.output and len(tokens) == seq.params.max_tokens
    assert thread.counts() == (0, 0)
