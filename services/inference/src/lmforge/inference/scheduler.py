"""The scheduler (vLLM's split: no tensors, no HTTP): which sequences run in the next engine
step, and how many of their tokens.

Every step has a token budget (`max_batched_tokens`). Running sequences come first, oldest
first: a decoding one takes one token, one still prefilling takes the next chunk of its prompt
that fits. What is left admits waiting requests in arrival order, each starting its prefill
with what fits, so a long prompt is prefilled in chunks over several steps while the others
keep decoding, and several short prompts are prefilled in one forward.

KV blocks: a request is admitted when the blocks for its whole prompt (less its cached prefix)
are free with `watermark_blocks` to spare; a decoding sequence takes a new block when it fills
one. When none is free, the newest running sequence is preempted: its blocks are released and it
goes back to the front of the queue, to be prefilled again, prompt and output so far (vLLM's
preemption by recompute; its full blocks stay in the prefix cache, so that is often cheap).
"""

from __future__ import annotations

import time
from collections import deque

from lmforge.inference.block_manager import BlockManager
from lmforge.inference.sequence import Sequence
from lmforge.inference.stats import EngineStats


class Scheduler:
    def __init__(self, blocks: BlockManager, *, max_running: int, max_batched_tokens: int,
                 watermark_blocks: int = 1):
        self.blocks = blocks
        self.max_running, self.max_batched_tokens = max_running, max_batched_tokens
        self.watermark_blocks = watermark_blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the newest is preempted first
        self.stats = EngineStats(kv_blocks_total=blocks.num_blocks, block_size=blocks.block_size)

    def schedule(self) -> list[tuple[Sequence, int]]:
        """The next step: (sequence, number of its tokens to compute), in the order to pack them."""
        budget = self.max_batched_tokens
        scheduled: list[tuple[Sequence, int]] = []
        preempted = False
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            count = min(seq.num_tokens - seq.num_computed, budget)
            while not self._grow(seq, seq.num_computed + count):
                preempted = True
                if self._preempt_newest() is seq:
                    break
            else:
                scheduled.append((seq, count))
                budget -= count
                index += 1
                continue
            break  # the sequence itself was the newest: it waits again
        while self.waiting and budget > 0 and len(self.running) < self.max_running and not preempted:
            count = self._admit(self.waiting[0], budget)
            if count is None:
                break  # first come, first served: nobody overtakes the head of the queue
            scheduled.append((self.waiting.popleft(), count))
            budget -= count
        return scheduled

    def computed(self, seq: Sequence, count: int) -> None:
        """The step computed `count` more tokens of `seq`: the blocks they filled join the prefix cache."""
        filled_before = seq.num_computed // self.blocks.block_size
        if not (count == 1 and seq.output and seq.num_computed + 1 == seq.num_tokens):  # not a decode
            self.stats.prefill_tokens += count
        seq.num_computed += count
        filled = seq.num_computed // self.blocks.block_size
        if filled > filled_before and self.blocks.prefix_caching:
            self._hash_full_blocks(seq, seq.num_computed)
            for index in range(filled_before, filled):
                self.blocks.register(seq.block_table[index], seq.block_hashes[index])

    def finish(self, seq: Sequence) -> None:
        """The sequence is done (or cancelled): out of the queue or the batch, its blocks released."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.release(seq.block_table)
        seq.block_table = []

    def _admit(self, seq: Sequence, budget: int) -> int | None:
        """Give the head of the queue its blocks and running place; the tokens it computes now, or
        None when its blocks are not free."""
        blocks = self.blocks
        tokens = seq.num_tokens
        if blocks.prefix_caching:
            self._hash_full_blocks(seq, tokens)
        # At least one token is always computed: its logits give the next token.
        hits = blocks.cached_prefix(seq.block_hashes, (tokens - 1) // blocks.block_size)
        new = blocks.blocks_for(tokens) - len(hits)
        spare = self.watermark_blocks if self.running else 0  # alone, a request may fill the pool
        if blocks.free_after_taking(hits) < new + spare:
            return None
        blocks.take(hits)
        seq.block_table = hits + blocks.allocate(new)
        seq.num_computed = len(hits) * blocks.block_size
        self.stats.prefix_cache_queries += tokens
        self.stats.prefix_cache_hits += seq.num_computed
        if seq.scheduled_at is None:
            seq.scheduled_at = time.monotonic()
        self.running.append(seq)
        return min(tokens - seq.num_computed, budget)

    def _hash_full_blocks(self, seq: Sequence, tokens: int) -> None:
        """Hashes of the full blocks among the sequence's first `tokens` tokens (only the new ones
        are read: a request waiting at the head of the queue is looked at every step)."""
        hashed = len(seq.block_hashes) * self.blocks.block_size
        if tokens - hashed >= self.blocks.block_size:
            self.blocks.chain_hashes(seq.block_hashes, seq.tokens(hashed, tokens))

    def _grow(self, seq: Sequence, tokens: int) -> bool:
        """Blocks enough for `tokens` of the sequence; False when none are free."""
        missing = self.blocks.blocks_for(tokens) - len(seq.block_table)
        if missing <= 0:
            return True
        if missing > self.blocks.num_free:
            return False
        seq.block_table += self.blocks.allocate(missing)
        return True

    def _preempt_newest(self) -> Sequence:
        seq = self.running.pop()
        self.blocks.release(seq.block_table)
        seq.block_table, seq.num_computed = [], 0
        self.waiting.appendleft(seq)
        self.stats.preemptions += 1
        return seq
