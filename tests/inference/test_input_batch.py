"""The model runner's persistent batch (lmforge.inference.input_batch): the device block tables
follow the scheduler's through appended blocks, preemption (a new table, written again), prefix
hits and cancellation; rows are freed when sequences leave; and a step's packed tokens,
positions and slots are those the list-built reference (build_paged_batch) computes."""

from __future__ import annotations

import torch

from lmforge.inference.engine import Engine
from lmforge.inference.sampling import SamplingParams
from lmforge.model.kv_cache import PagedKVCache
from lmforge.model.paged_attention import ScheduledChunk, build_paged_batch
from lmforge.model.transformer import GPT
from tests.inference.test_engine import LLAMA


def assert_tables_match(engine: Engine) -> None:
    batch = engine.runner.batch
    for seq in engine.running:
        row = batch.rows.get(seq)
        if row is None or row.table is not seq.block_table:
            continue  # not stepped since it was (re)admitted: written when it is
        table = seq.block_table
        assert batch.block_tables[row.index, :len(table)].tolist() == table
        assert batch.block_logical[table].tolist() == list(range(len(table)))


def test_tables_follow_growth_preemption_prefix_hits_and_cancellation():
    torch.manual_seed(0)
    model = GPT(LLAMA).eval()
    per_block = 4 * PagedKVCache.bytes_per_token(model.config)
    engine = Engine(model, max_running=4, block_size=4, max_batched_tokens=16, kv_cache_bytes=14 * per_block)
    shared = list(range(1, 10))
    seqs = [engine.add(shared + [20 + i], SamplingParams(max_tokens=24, temperature=0)) for i in range(4)]
    batch = engine.runner.batch
    steps, cancelled = 0, None
    while engine.has_work():
        engine.step()
        steps += 1
        assert_tables_match(engine)
        assert len(batch.rows) <= 4 and len(batch.rows) + len(batch._free) == 4
        assert all(seq not in batch.rows for seq in seqs if seq.finished)  # released as they finish
        if steps == 6:
            cancelled = engine.running[-1]
            engine.cancel(cancelled)
            assert cancelled not in batch.rows
    stats = engine.stats()
    assert stats.preemptions >= 1 and stats.prefix_cache_hits >= 8
    assert batch.rows == {} and sorted(batch._free) == [0, 1, 2, 3]
    for seq in seqs:
        if seq is not cancelled:
            assert seq.finish_reason == "length"


def test_a_steps_inputs_equal_the_list_built_reference():
    torch.manual_seed(1)
    model = GPT(LLAMA).eval()
    engine = Engine(model, max_running=4, block_size=4, max_batched_tokens=12)
    for n in (9, 2, 14):
        engine.add(torch.randint(0, 101, (n,)).tolist(), SamplingParams(max_tokens=5, temperature=0))
    batch = engine.runner.batch
    checked = 0
    while engine.has_work():
        scheduled = engine.scheduler.schedule()
        step = batch.prepare(scheduled)
        reference = build_paged_batch([ScheduledChunk(seq.block_table, seq.num_computed, count)
                                       for seq, count in scheduled], 4, "cpu")
        tokens = [t for seq, count in scheduled for t in seq.tokens(seq.num_computed, seq.num_computed + count)]
        assert step.tokens.tolist() == tokens
        assert step.positions.tolist() == reference.positions.tolist()
        assert step.slot_mapping.tolist() == reference.slot_mapping.tolist()
        assert step.max_position == reference.max_position
        assert step.rows.host_counts == [count for _, count in scheduled]
        checked += any(count > 1 for _, count in scheduled) and any(count == 1 for _, count in scheduled)
        executed = engine.runner.execute(scheduled)  # then finish the step as Engine.step does
        for seq, count in scheduled:
            engine.scheduler.computed(seq, count)
        for row, index in enumerate(executed.sampled_indices):
            engine._append(scheduled[index][0], executed.sampled.tokens[row])
    assert checked  # some step mixed prefill chunks with decodes
