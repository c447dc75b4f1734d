"""The scheduler alone (no model, no tensors): the per-step token budget with decodes first and
prompts in chunks, first come first served admission by free blocks, preemption of the newest."""

from __future__ import annotations

from lmforge.inference.block_manager import BlockManager
from lmforge.inference.sampling import SamplingParams
from lmforge.inference.scheduler import Scheduler
from lmforge.inference.sequence import Sequence

GREEDY = SamplingParams(max_tokens=100, temperature=0)


def sequence(index: int, prompt_tokens: int) -> Sequence:
    return Sequence(index, list(range(index * 1000, index * 1000 + prompt_tokens)), GREEDY, None)


def run_step(scheduler: Scheduler) -> list[tuple[int, int]]:
    """Schedule, then do what the engine does after the forward: count the tokens computed and,
    for a sequence whose tokens are all computed, append one generated token."""
    scheduled = scheduler.schedule()
    for seq, count in scheduled:
        scheduler.computed(seq, count)
        if seq.num_computed == seq.num_tokens:
            seq.output.append(7)
    return [(seq.id, count) for seq, count in scheduled]


def test_decodes_come_first_and_a_long_prompt_is_prefilled_in_chunks_of_what_is_left():
    scheduler = Scheduler(BlockManager(64, 4), max_running=8, max_batched_tokens=10)
    for i in range(3):
        scheduler.waiting.append(sequence(i, 2))
    assert run_step(scheduler) == [(0, 2), (1, 2), (2, 2)]  # three prompts in one step
    scheduler.waiting.append(sequence(3, 25))
    assert run_step(scheduler) == [(0, 1), (1, 1), (2, 1), (3, 7)]  # decodes, then a chunk of the rest
    assert run_step(scheduler) == [(0, 1), (1, 1), (2, 1), (3, 7)]
    assert run_step(scheduler) == [(0, 1), (1, 1), (2, 1), (3, 7)]
    assert run_step(scheduler) == [(0, 1), (1, 1), (2, 1), (3, 4)]  # its last chunk: it samples now
    assert run_step(scheduler) == [(0, 1), (1, 1), (2, 1), (3, 1)]


def test_admission_waits_for_blocks_and_nobody_overtakes_the_head_of_the_queue():
    scheduler = Scheduler(BlockManager(10, 4), max_running=8, max_batched_tokens=100)
    scheduler.waiting.extend([sequence(0, 20), sequence(1, 20), sequence(2, 3)])
    assert run_step(scheduler) == [(0, 20)]  # 5 blocks + 1 spare: the second's 5 do not fit
    assert [s.id for s in scheduler.waiting] == [1, 2]  # the short one waits behind it
    scheduler.finish(scheduler.running[0])
    assert run_step(scheduler) == [(1, 20), (2, 3)]


def test_the_newest_running_sequence_is_preempted_and_requeued_first():
    blocks = BlockManager(5, 4)
    scheduler = Scheduler(blocks, max_running=8, max_batched_tokens=100)
    scheduler.waiting.extend([sequence(0, 8), sequence(1, 8)])
    assert run_step(scheduler) == [(0, 8), (1, 8)]  # 2 blocks each, one to spare
    # Both have filled their 2 blocks: the oldest takes the last free block, the newest finds
    # none and is preempted: its blocks are released, its output kept, and it waits first in line.
    assert run_step(scheduler) == [(0, 1)]
    assert scheduler.stats.preemptions == 1
    assert [s.id for s in scheduler.running] == [0] and [s.id for s in scheduler.waiting] == [1]
    preempted = scheduler.waiting[0]
    assert preempted.block_table == [] and preempted.num_computed == 0 and preempted.output == [7]
    assert blocks.num_used == 3 and blocks.num_free == 2
    scheduler.waiting.append(sequence(2, 1))
    run_step(scheduler)
    assert [s.id for s in scheduler.waiting] == [1, 2]  # its 3 blocks (9 tokens) + 1 spare do not fit
    scheduler.finish(scheduler.running[0])
    # Readmitted with its prompt and output so far (9 tokens); its 2 full blocks were still in the
    # prefix cache, so only the last token is computed again.
    hits = scheduler.stats.prefix_cache_hits
    assert run_step(scheduler) == [(1, 1), (2, 1)]
    assert scheduler.stats.prefix_cache_hits == hits + 8


def test_without_prefix_caching_a_preempted_sequence_is_prefilled_whole():
    scheduler = Scheduler(BlockManager(5, 4, prefix_caching=False), max_running=8, max_batched_tokens=100)
    scheduler.waiting.extend([sequence(0, 8), sequence(1, 8)])
    run_step(scheduler)
    run_step(scheduler)
    scheduler.finish(scheduler.running[0])
    assert run_step(scheduler) == [(1, 9)]
    assert scheduler.stats.prefix_cache_hits == 0
