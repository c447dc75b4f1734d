"""Flex attention over the paged KV cache in place (lmforge.model.attention_backends) against the
correctness oracles: the engine's greedy output with `attention="flex"` equals, token for token, a
full-recompute loop over the model and the gather backend's output, for multi-head (GPT-2),
multi-query (Llama), grouped-query MoE and bfloat16 models, through chunked prefill beside
decodes, prefix-cache hits (blocks shared between sequences) and preemption (blocks handed to
another sequence at another index). Compiled flex is shared by the whole process: each model
shape compiles once for decode rows and once for prefill rows (~6-10 s each on a CPU core)."""

from __future__ import annotations

import pytest
import torch

from lmforge.inference.engine import Engine
from lmforge.inference.sampling import SamplingParams
from lmforge.model.attention_backends import (
    FlexBackend,
    GatherBackend,
    StepRows,
    _page_indices,
    select_attention,
    table_width,
)
from lmforge.model.kv_cache import PagedKVCache
from lmforge.model.transformer import GPT
from tests.inference.test_engine import CONFIG, LLAMA, MOE, full_recompute_greedy

VARIANTS = {"gpt2": (CONFIG, torch.float32), "llama-mqa": (LLAMA, torch.float32), "moe-gqa": (MOE, torch.float32),
            "llama-mqa-bf16": (LLAMA, torch.bfloat16)}


@pytest.fixture(scope="module", params=list(VARIANTS))
def model(request):
    config, dtype = VARIANTS[request.param]
    torch.manual_seed(0)
    return GPT(config).eval().to(dtype)


def serve(model, attention: str):
    """A busy engine: three requests share a 9-token prefix (two blocks of 4, hit by the later
    ones), prompts are prefilled 8 tokens a step beside decodes, and a pool of 16 blocks makes
    the newest sequences give their blocks up (preempted) and take others when readmitted."""
    per_block = 4 * PagedKVCache.bytes_per_token(model.config, next(model.parameters()).dtype)
    engine = Engine(model, max_running=4, block_size=4, max_batched_tokens=8, kv_cache_bytes=16 * per_block,
                    attention=attention)
    generator = torch.Generator().manual_seed(1)
    system = torch.randint(0, 101, (9,), generator=generator).tolist()
    prompts = [system + torch.randint(0, 101, (n,), generator=generator).tolist() for n in (2, 5, 1)]
    prompts += [torch.randint(0, 101, (n,), generator=generator).tolist() for n in (13, 3)]
    seqs, steps = [], 0
    for prompt in prompts[:2]:
        seqs.append(engine.add(prompt, SamplingParams(max_tokens=14, temperature=0)))
    while engine.has_work() or len(seqs) < len(prompts):
        if steps in (2, 3, 5) and len(seqs) < len(prompts):  # late arrivals, while others decode
            seqs.append(engine.add(prompts[len(seqs)], SamplingParams(max_tokens=14, temperature=0)))
        engine.step()
        steps += 1
    return engine, prompts, [seq.output for seq in seqs]


def test_flex_attention_equals_full_recompute_and_gather_through_prefix_hits_and_preemption(model):
    flex, prompts, outputs = serve(model, "flex")
    assert flex.runner.attention.name == "flex"  # not a silent fallback
    stats = flex.stats()
    assert stats.prefix_cache_hits >= 2 * 8 and stats.preemptions >= 1
    assert all(len(output) == 14 for output in outputs)
    gather, _, gathered = serve(model, "gather")
    assert gather.runner.attention.name == "gather"
    assert outputs == gathered
    assert outputs == [full_recompute_greedy(model, prompt, 14) for prompt in prompts]
    assert flex.blocks.num_used == 0 and flex.runner.batch.rows == {}


def test_flex_reads_each_rows_own_blocks_in_place():
    """Straight against gather on one step: a prefill chunk over 130 tokens (two query tiles),
    decodes at block boundaries, rows whose tables hold stale blocks of other rows past their
    length, and a block shared by two rows (a prefix hit), over grouped-query heads."""
    torch.manual_seed(2)
    block_size, blocks, kv_heads, heads, dim = 4, 60, 2, 4, 16
    width = table_width(blocks)
    keys, values = torch.randn(2, blocks * block_size, kv_heads, dim).unbind()
    tables = torch.randint(0, blocks, (5, width), dtype=torch.int32)  # stale entries everywhere
    own = torch.randperm(blocks)
    layout = [(0, 130), (7, 1), (8, 1), (15, 1), (3, 6)]  # (start, count) per row
    logical = torch.zeros(width, dtype=torch.int32)
    used = 0
    for row, (start, count) in enumerate(layout):
        needed = -(-(start + count) // block_size)
        mine = own[used:used + needed]
        used += needed
        if row == 2:  # shares its first block with row 1, at the same index (as a prefix hit does)
            mine[0] = tables[1, 0]
        tables[row, :needed] = mine
        logical[mine] = torch.arange(needed, dtype=torch.int32)
    starts, counts = [s for s, _ in layout], [c for _, c in layout]
    offsets = [sum(counts[:row]) for row in range(len(layout))]
    rows = StepRows(tables, torch.arange(5), torch.tensor(starts), torch.tensor(counts), list(range(5)), starts,
                    counts, offsets, block_size, logical, blocks * block_size)
    q = torch.randn(sum(counts), heads, dim)
    with torch.no_grad():
        got = FlexBackend("cpu").plan(rows).attend(q, keys, values)
        expected = GatherBackend().plan(rows).attend(q, keys, values)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_new_batch_sizes_and_chunk_lengths_compile_nothing_new():
    """Compilations are per model shape, not per batch: once an engine has run decode and prefill
    rows, another with other batch sizes, chunk lengths (up to the 128-query tile) and pool size
    compiles nothing."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = GPT(LLAMA).eval()

    def run(max_running: int, budget: int, lengths: list[int]) -> None:
        engine = Engine(model, max_running=max_running, block_size=4, max_batched_tokens=budget, attention="flex")
        for n in lengths:
            engine.add(list(range(1, n + 1)), SamplingParams(max_tokens=5, temperature=0))
        while engine.has_work():
            engine.step()

    run(2, 8, [3, 6, 2])
    compiled = counters["frames"]["ok"]
    per_block = 4 * PagedKVCache.bytes_per_token(model.config)
    run(7, 40, [1, 4, 9, 17, 30, 2, 11, 5])
    Engine(model, block_size=4, kv_cache_bytes=40 * per_block, attention="flex")  # another pool: verified, not compiled
    assert counters["frames"]["ok"] == compiled


def test_backend_choice_on_cpu_and_flashinfers_page_list():
    """flashinfer runs on CUDA only: asked for on CPU, the engine serves with flex (and says so);
    auto is gather on CPU. The pages FlashInfer is planned with are each row's first blocks, in order."""
    assert select_attention("auto", "cpu", torch.float32) == ("gather", None)
    name, why = select_attention("flashinfer", "cpu", torch.bfloat16)
    assert name == "flex" and "CUDA" in why
    tables = torch.tensor([[5, 6, 7, 0], [9, 1, 0, 0], [2, 3, 4, 8]], dtype=torch.int32)
    indptr = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    assert _page_indices(tables, indptr, 8).tolist() == [5, 6, 7, 9, 2, 3, 4, 8]
