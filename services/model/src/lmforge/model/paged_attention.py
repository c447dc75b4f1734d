"""Attention over a paged KV cache (lmforge.model.kv_cache.PagedKVCache) for one engine step.

A step packs the new tokens of every scheduled sequence into one flat batch of N tokens: a
decoding sequence brings one, a prefilling one a chunk of its prompt. Projections and MLPs run
on the N tokens at once; only attention needs each sequence's own keys. A PagedBatch says, for
every layer of the step: each token's position and cache slot (where its key and value are
written), and the step's attention, planned once by a backend of
lmforge.model.attention_backends (gather: today's dense copy and SDPA, the reference; flex:
flex_attention over the cache in place; flashinfer: FlashInfer's paged kernels on CUDA).

The engine's model runner keeps the step's tensors in a persistent batch
(lmforge.inference.input_batch); build_paged_batch makes a PagedBatch from plain lists, for
tests and tools.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lmforge.model.attention_backends import AttentionBackend, GatherBackend, StepAttention, StepRows


@dataclass
class PagedBatch:
    """What the layers need to know about one step's packed tokens, shared by every layer."""

    positions: torch.Tensor  # (N,): each token's position in its sequence
    slot_mapping: torch.Tensor  # (N,): the cache slot each token's key and value are written to
    attention: StepAttention
    max_position: int | None = None  # the largest position, known on the host (None: read from `positions`)


@dataclass(frozen=True)
class ScheduledChunk:
    """One sequence's part of a step: tokens start..start+count-1 are new, stored through `block_table`."""

    block_table: list[int]
    start: int  # tokens already in the cache (its computed prefix)
    count: int  # new tokens this step


def build_paged_batch(chunks: list[ScheduledChunk], block_size: int, device,
                      backend: AttentionBackend | None = None) -> PagedBatch:
    """The metadata of one step whose packed tokens are `chunks`' new tokens, in order (gather
    attention unless another backend is given; flex also needs StepRows.block_logical, which the
    engine's persistent batch keeps)."""
    positions, slots, offsets = [], [], []
    for chunk in chunks:
        offsets.append(len(positions))
        for position in range(chunk.start, chunk.start + chunk.count):
            positions.append(position)
            slots.append(chunk.block_table[position // block_size] * block_size + position % block_size)
    width = max(-(-(chunk.start + chunk.count) // block_size) for chunk in chunks)
    tables = torch.tensor([chunk.block_table[:width] + [0] * (width - min(width, len(chunk.block_table)))
                           for chunk in chunks], dtype=torch.int32)
    starts, counts = [chunk.start for chunk in chunks], [chunk.count for chunk in chunks]
    row_ids = list(range(len(chunks)))
    rows = StepRows(tables.to(device), torch.tensor(row_ids, device=device), torch.tensor(starts, device=device),
                    torch.tensor(counts, device=device), row_ids, starts, counts, offsets, block_size)
    return PagedBatch(torch.tensor(positions, device=device), torch.tensor(slots, device=device),
                      (backend or GatherBackend()).plan(rows), max(positions))


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    batch: PagedBatch) -> torch.Tensor:
    """q (N, n_head, D), k and v (N, kv_heads, D) of the packed new tokens, after RoPE: their keys
    and values are written to the cache, then each query attends to its sequence's cached
    positions up to its own. Returns (N, n_head, D)."""
    keys.index_copy_(0, batch.slot_mapping, k.to(keys.dtype))
    values.index_copy_(0, batch.slot_mapping, v.to(values.dtype))
    return batch.attention.attend(q, keys, values)
