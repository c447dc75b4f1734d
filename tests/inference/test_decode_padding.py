"""Decode steps padded up to a CUDA graph's batch size (lmforge.inference.cuda_graphs), run on CPU
without the graph (capture and replay are CUDA-only): the padding rows write only the KV cache's
scratch block, the real rows' tokens are those of the unpadded engine and of the full-recompute
oracle, and the pool's keys and values are the same as without padding."""

from __future__ import annotations

import torch

from lmforge.inference.cuda_graphs import DecodeGraphs, graph_sizes
from lmforge.inference.engine import Engine
from lmforge.inference.model_runner import ModelRunner
from lmforge.inference.sampling import SamplingParams
from lmforge.model.transformer import GPT
from tests.inference.test_engine import LLAMA, full_recompute_greedy

BUDGETS = [12, 9, 7, 4, 10]  # sequences finish at different steps: 5, then 4, 3, ... rows decode


def serve(model, padded: bool):
    engine = Engine(model, max_running=5, block_size=4, max_batched_tokens=64, attention="flex")
    runner = engine.runner
    assert runner.graphs is None  # cuda_graphs acts on CUDA only
    padded_steps = []
    if padded:
        runner = engine.runner = ModelRunner(model, engine.cache, max_running=5, max_batched_tokens=64,
                                                    attention="flex", decode_sizes=[2, 4, 8])
        run = runner.graphs.run

        def recording(step, size):
            padded_steps.append((len(step.rows.host_counts), size))
            return run(step, size)

        runner.graphs.run = recording
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 101, (n,), generator=generator).tolist() for n in (5, 9, 3, 12, 6)]
    seqs = [engine.add(p, SamplingParams(max_tokens=b, temperature=0)) for p, b in zip(prompts, BUDGETS, strict=True)]
    while engine.has_work():
        engine.step()
    return engine, prompts, [seq.output for seq in seqs], padded_steps


def test_a_padded_decode_step_gives_the_unpadded_tokens_and_touches_only_the_scratch_block():
    torch.manual_seed(0)
    model = GPT(LLAMA).eval()
    padded, prompts, outputs, steps = serve(model, padded=True)
    plain, _, expected, _ = serve(model, padded=False)
    # 5 rows padded to 8, then 4 rows (no padding), 3 to 4, 2 (none), 1 to 2.
    assert {(5, 8), (3, 4), (1, 2)} <= set(steps) and all(size == min(s for s in (2, 4, 8) if s >= rows)
                                                          for rows, size in steps)
    assert outputs == expected == [full_recompute_greedy(model, p, b) for p, b in zip(prompts, BUDGETS, strict=True)]
    scratch = slice(padded.cache.scratch_block * 4, (padded.cache.scratch_block + 1) * 4)
    for layer in range(model.config.n_layer):
        torch.testing.assert_close(padded.cache.keys[layer], plain.cache.keys[layer], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(padded.cache.values[layer], plain.cache.values[layer], atol=1e-5, rtol=1e-5)
        assert padded.cache.layer_keys[layer][scratch].abs().sum() > 0  # the padding rows wrote there
        assert plain.cache.layer_keys[layer][scratch].abs().sum() == 0


def test_graph_sizes_double_up_to_max_running():
    assert graph_sizes(64) == [2, 4, 8, 16, 32, 64]
    assert graph_sizes(48) == [2, 4, 8, 16, 32, 48]
    assert graph_sizes(1) == graph_sizes(2) == [2]
    graphs = DecodeGraphs.__new__(DecodeGraphs)
    graphs.sizes = graph_sizes(48)
    assert [graphs.size_for(n) for n in (1, 2, 3, 17, 48, 49)] == [2, 2, 4, 32, 48, None]
