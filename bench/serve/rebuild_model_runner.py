"""The model runner before the persistent batch, kept to measure against (profile_engine.py
--runner rebuild): every step rebuilds its inputs from Python lists — the packed tokens, each
token's position and slot in a Python loop, each attention group's block table, query index and
mask as new tensors — and attends with gather (a dense copy of each group's keys and values per
layer). Its sampling is the engine's own (ModelRunner._sample)."""

from __future__ import annotations

import torch

from lmforge.inference.model_runner import Executed, ModelRunner
from lmforge.inference.sequence import Sequence
from lmforge.model.attention_backends import AttentionGroup, GatherAttention
from lmforge.model.kv_cache import PagedKVCache
from lmforge.model.paged_attention import PagedBatch, ScheduledChunk
from lmforge.model.transformer import GPT


class RebuildModelRunner:
    def __init__(self, model: GPT, cache: PagedKVCache):
        self.model, self.cache = model, cache
        self.device = next(model.parameters()).device

    def release(self, seq: Sequence) -> None:
        """Nothing is kept between steps."""

    @torch.no_grad()
    def execute(self, scheduled: list[tuple[Sequence, int]]) -> Executed:
        tokens, chunks, last_rows, sampling = [], [], [], []
        for index, (seq, count) in enumerate(scheduled):
            tokens += seq.tokens(seq.num_computed, seq.num_computed + count)
            chunks.append(ScheduledChunk(seq.block_table, seq.num_computed, count))
            if seq.num_computed + count == seq.num_tokens:
                last_rows.append(len(tokens) - 1)
                sampling.append(index)
        batch = build_paged_batch(chunks, self.cache.block_size, self.device)
        logits_index = torch.tensor(last_rows, dtype=torch.long, device=self.device)
        logits = self.model.forward_paged(torch.tensor(tokens, device=self.device), self.cache, batch, logits_index)
        rows, sampled, failed = ModelRunner._sample(logits, [scheduled[index][0] for index in sampling])
        return Executed([sampling[row] for row in rows], sampled, [(sampling[row], exc) for row, exc in failed])


def build_paged_batch(chunks: list[ScheduledChunk], block_size: int, device) -> PagedBatch:
    positions, slots, offsets = [], [], []
    for chunk in chunks:
        offsets.append(len(positions))
        for position in range(chunk.start, chunk.start + chunk.count):
            positions.append(position)
            slots.append(chunk.block_table[position // block_size] * block_size + position % block_size)
    buckets: dict[tuple[bool, int], list[tuple[ScheduledChunk, int]]] = {}
    for chunk, offset in zip(chunks, offsets, strict=True):
        length = max(block_size, 1 << (chunk.start + chunk.count - 1).bit_length())
        buckets.setdefault((chunk.count > 1, length), []).append((chunk, offset))
    groups = [_group(members, block_size, device) for _, members in sorted(buckets.items())]
    return PagedBatch(torch.tensor(positions, device=device), torch.tensor(slots, device=device),
                      GatherAttention(groups, block_size))


def _group(members: list[tuple[ScheduledChunk, int]], block_size: int, device) -> AttentionGroup:
    width = max(chunk.count for chunk, _ in members)
    length = max(chunk.start + chunk.count for chunk, _ in members)
    blocks = -(-length // block_size)
    table = torch.tensor([chunk.block_table[:blocks] + [0] * (blocks - min(blocks, len(chunk.block_table)))
                          for chunk, _ in members])
    key_position = torch.arange(blocks * block_size)
    if width == 1:
        query_index = torch.tensor([offset for _, offset in members])
        mask = key_position[None, :] <= torch.tensor([chunk.start for chunk, _ in members])[:, None]
        return AttentionGroup(query_index.to(device), table.to(device), mask[:, None, None].to(device), None, 1)
    start = torch.tensor([chunk.start for chunk, _ in members])
    count = torch.tensor([chunk.count for chunk, _ in members])
    offset = torch.tensor([offset for _, offset in members])
    column = torch.arange(width)
    valid = column[None, :] < count[:, None]
    query_index = torch.where(valid, offset[:, None] + column[None, :], offset[:, None])
    query_position = torch.where(valid, start[:, None] + column[None, :], 0)
    mask = key_position[None, None, :] <= query_position[:, :, None]
    return AttentionGroup(query_index.reshape(-1).to(device), table.to(device), mask[:, None].to(device),
                          valid.reshape(-1).to(device), width)
