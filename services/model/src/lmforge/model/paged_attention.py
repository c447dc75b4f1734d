"""Attention over a paged KV cache (lmforge.model.kv_cache.PagedKVCache) for one engine step.

A step packs the new tokens of every scheduled sequence into one flat batch of N tokens: a
decoding sequence brings one, a prefilling one a chunk of its prompt. Projections and MLPs run
on the N tokens at once; only attention needs each sequence's own keys. For that the step's
sequences form groups: decodes (one query each) apart from prefill chunks (padded to the
longest chunk), so a 500-token chunk does not pad 16 single-token decodes to 500 queries, and
each kind by length rounded up to a power of two, so one long sequence does not pad the short
ones. Each group gathers its sequences' cached keys and values through their block tables into a dense
(b, kv_heads, L, head_dim) copy, a whole block at a time, and calls scaled_dot_product_attention with a mask (a query at
position p sees positions ≤ p of its own sequence).

On CPU that gather plus SDPA is the whole story. On a GPU the same code runs; with a boolean
mask SDPA picks its memory-efficient kernel (not flash attention, which takes no mask), and the
gather costs one extra read and write of the attended keys and values per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionGroup:
    query_index: torch.Tensor  # (b · t,): each query's index in the packed tokens, row by row (padding repeats one)
    blocks: torch.Tensor  # (b, L / block_size): each sequence's blocks holding its first L positions (padding 0)
    mask: torch.Tensor  # (b, 1, t, L) bool: True where the query attends
    valid: torch.Tensor | None  # (b · t,): which of the queries are not padding; None: all are
    width: int  # t


@dataclass
class PagedBatch:
    """What attention needs to know about one step's packed tokens, shared by every layer."""

    positions: torch.Tensor  # (N,): each token's position in its sequence
    slot_mapping: torch.Tensor  # (N,): the cache slot each token's key and value are written to
    groups: list[AttentionGroup]
    block_size: int


@dataclass(frozen=True)
class ScheduledChunk:
    """One sequence's part of a step: tokens start..start+count-1 are new, stored through `block_table`."""

    block_table: list[int]
    start: int  # tokens already in the cache (its computed prefix)
    count: int  # new tokens this step


def build_paged_batch(chunks: list[ScheduledChunk], block_size: int, device) -> PagedBatch:
    """The metadata of one step whose packed tokens are `chunks`' new tokens, in order."""
    positions, slots, offsets = [], [], []
    for chunk in chunks:
        offsets.append(len(positions))
        for position in range(chunk.start, chunk.start + chunk.count):
            positions.append(position)
            slots.append(chunk.block_table[position // block_size] * block_size + position % block_size)
    buckets: dict[tuple[bool, int], list[tuple[ScheduledChunk, int]]] = {}
    for chunk, offset in zip(chunks, offsets, strict=True):
        buckets.setdefault(_bucket(chunk, block_size), []).append((chunk, offset))
    groups = [_group(members, block_size, device) for _, members in sorted(buckets.items())]
    return PagedBatch(torch.tensor(positions, device=device), torch.tensor(slots, device=device), groups,
                      block_size)


def _bucket(chunk: ScheduledChunk, block_size: int) -> tuple[bool, int]:
    """Decodes and prefill chunks apart, and each by its keys' length rounded up to a power of two
    (at least a block): padding a row costs at most twice its keys, and one 2k-token sequence
    does not make every short one gather 2k positions."""
    length = chunk.start + chunk.count
    return chunk.count > 1, max(block_size, 1 << (length - 1).bit_length())


def _group(members: list[tuple[ScheduledChunk, int]], block_size: int, device) -> AttentionGroup:
    width = max(chunk.count for chunk, _ in members)
    length = max(chunk.start + chunk.count for chunk, _ in members)
    blocks = -(-length // block_size)
    table = torch.tensor([chunk.block_table[:blocks] + [0] * (blocks - min(blocks, len(chunk.block_table)))
                          for chunk, _ in members])
    key_position = torch.arange(blocks * block_size)
    if width == 1:  # decodes: one query each, no padding
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


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    batch: PagedBatch) -> torch.Tensor:
    """q (N, n_head, D), k and v (N, kv_heads, D) of the packed new tokens, after RoPE: their keys
    and values are written to the cache, then each query attends to its sequence's cached
    positions up to its own. Returns (N, n_head, D)."""
    keys.index_copy_(0, batch.slot_mapping, k.to(keys.dtype))
    values.index_copy_(0, batch.slot_mapping, v.to(values.dtype))
    out = torch.empty_like(q)
    gqa = q.shape[1] != k.shape[1]
    for group in batch.groups:
        rows = group.blocks.shape[0]
        group_keys, group_values = (_gather(cache, group.blocks, batch.block_size) for cache in (keys, values))
        queries = q.index_select(0, group.query_index).view(rows, group.width, *q.shape[1:]).transpose(1, 2)
        y = F.scaled_dot_product_attention(queries, group_keys.to(q.dtype), group_values.to(q.dtype),
                                           attn_mask=group.mask, enable_gqa=gqa)
        y = y.transpose(1, 2).reshape(rows * group.width, *q.shape[1:])
        if group.valid is None:
            out.index_copy_(0, group.query_index, y)
        else:
            out[group.query_index[group.valid]] = y[group.valid]
    return out


def _gather(cache: torch.Tensor, blocks: torch.Tensor, block_size: int) -> torch.Tensor:
    """(b, kv_heads, blocks · block_size, D): the given blocks of each row, copied whole (one
    index per block, not per token)."""
    rows, count = blocks.shape
    by_block = cache.view(-1, block_size, *cache.shape[1:])
    return by_block.index_select(0, blocks.reshape(-1)).view(rows, count * block_size, *cache.shape[1:]).transpose(1, 2)
