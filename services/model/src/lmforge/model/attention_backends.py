"""How one engine step's queries attend to their sequences' keys and values in the paged KV cache
(lmforge.model.kv_cache): three backends behind one interface, chosen by the engine's
`attention` setting.

A step's sequences are its rows (StepRows): each row's block table, the tokens it has cached
(start) and the new ones it brings (count), whose queries sit at `offset` onward in the step's
packed tokens. A backend plans the step once (`plan(rows)`), and every layer calls the plan's
`attend(q, keys, values)` after writing its new keys and values into the cache
(lmforge.model.paged_attention).

gather   the reference (the engine's first path, kept): rows are grouped (decodes apart from prefill
         chunks, each kind by length rounded up to a power of two) and each group COPIES its
         rows' cached keys and values, a block at a time, into a dense (rows, kv_heads, L, D)
         tensor per layer, then calls scaled_dot_product_attention with a boolean mask.
flex     torch's flex_attention over the cache IN PLACE: the layer's whole (slots, kv_heads, D)
         tensor is viewed as (1, kv_heads, slots, D), and a block mask made directly from the
         block tables (BlockMask.from_kv_blocks: row r visits its own blocks, one KV block per
         cache block, its query tiles of 128 only the blocks up to their last position) says
         which blocks each row reads; inside them a mask_mod keeps slot s of physical block p for
         row b when p is b's block (tables[b, logical[p]] == p) and its position
         logical[p]·block_size + s % block_size is at most the query's. `logical`
         (StepRows.block_logical) is a block's index in the tables holding it: the same for every
         sequence that shares it, since a prefix-cache hit keys a block by its whole prefix. The
         mask_mod alone is exact (flex's uncompiled fallback, which ignores block sparsity, gives
         the same result); the block list only skips work.
         flex_attention is compiled (torch.compile, dynamic shapes): the batch, query length and
         cache length vary freely; one compilation per (dtype, kv heads, block size, table width)
         for decode rows (one query each), one for prefill rows (up to 128 queries) and one for
         longer chunks. Three rules keep that so on CPU (torch 2.13's flex template miscompiles
         otherwise, "cur_qSplitSize0 was not declared"): every tensor and number the mask_mod
         reads has a fixed shape (the rows' tables and starts are copied into buffers of at least
         64 rows; the block size is read from a marked-static tensor's shape, not a Python int,
         which dynamic compilation turns into a symbol); the table width is a power of two of at
         least 256 (table_width); queries are copied to one layout, (rows, heads, queries, D)
         contiguous. A lone row is doubled so that a batch of one does not compile a fourth.
flashinfer  FlashInfer's paged kernels on CUDA (fp16/bf16), the cache in place as its NHD pages:
         a decode wrapper for decode-only steps, a prefill wrapper (causal, packed queries) for
         the rest, planned once per step. Where flashinfer does not import, the device is not
         CUDA or the dtype is float32, flex is used instead (logged).

`auto` on CPU is gather, measured (torch 2.13, one thread): one layer's decode attention over a
cache of 129 blocks of 16 (4 heads of 32) took, gather vs flex, 95 vs 113 µs for 1 row of 100
tokens, 222 vs 288 µs for 16 rows, but 1.9 vs 0.9 ms for 64 rows and 7.4 vs 2.4 ms for 64 rows of
250 tokens: flex's fixed cost per call (its plan and the compiled call's guards, ~50-150 µs)
loses at small batches, its in-place read wins at large ones. Through the engine
(bench/serve/profile_engine.py, the tiny model, 64 requests) attention is a small part of a
step: decode steps at 64 running took the same (7.5 vs 7.4 ms), prefill steps longer with flex
(17.9 vs 24.7 ms), and whole runs made 5-40% fewer tokens/s with flex at 1, 16 and 64 running. On CUDA
`auto` is flashinfer when it imports, else flex.

A backend is verified once when the engine starts (verify_attention): a small random step through
it and through gather must agree, else the engine falls back (flashinfer → flex → gather) with a
log line; for flex this is also the warm-up that compiles it.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
import torch.nn.functional as F

AttentionName = Literal["auto", "gather", "flex", "flashinfer"]
CPU_AUTO = "gather"  # see the module docstring: measured, not assumed
FLEX_Q_BLOCK = 128  # queries per flex block-mask row tile (a fixed size: it is baked into a compilation)
MIN_TABLE_WIDTH = 256
MIN_FLEX_ROWS = 64


def table_width(total_blocks: int) -> int:
    """The width of the block tables flex reads: at least the cache's blocks (flex's CPU kernel wants a
    block list as long as the cache), a power of two of at least 256, since the width is compiled in
    (a variable one miscompiles on CPU, torch 2.13) and pools of any size up to it share one compilation."""
    return max(MIN_TABLE_WIDTH, 1 << (total_blocks - 1).bit_length())


def host_longs(values) -> torch.Tensor:
    """An int64 CPU tensor of `values` (a list of ints): through array('q'), 3x faster than
    torch.tensor's per-element conversion (70 µs for 1,200 ints), which a step pays several times."""
    packed = array("q", values)
    return torch.frombuffer(packed, dtype=torch.int64) if packed else torch.empty(0, dtype=torch.int64)


@dataclass
class StepRows:
    """One step's sequences for attention. Tensors are on the model's device; the host lists are
    the same numbers, known without a device sync. Row r of the step is row row_ids[r] of
    block_tables (the engine's persistent batch keeps a table per running sequence)."""

    block_tables: torch.Tensor  # (T, W) int32: block tables in logical order, then anything valid
    row_ids: torch.Tensor  # (R,) int64: each step row's table
    starts: torch.Tensor  # (R,) int64: tokens the row has in the cache before this step
    counts: torch.Tensor  # (R,) int64: its new tokens this step
    host_row_ids: list[int]
    host_starts: list[int]
    host_counts: list[int]
    host_offsets: list[int]  # its first new token's index in the packed tokens
    block_size: int
    block_logical: torch.Tensor | None = None  # (W,) int32: each block's index in the tables holding it (flex)
    num_slots: int = 0  # the cache's slots, scratch block included (flex: its key/value length)

    @property
    def decode_only(self) -> bool:
        return all(count == 1 for count in self.host_counts)

    def tables(self) -> torch.Tensor:
        """(R, W): the step rows' tables, in step order (a copy)."""
        return self.block_tables.index_select(0, self.row_ids)


class StepAttention(Protocol):
    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """q (N, n_head, D) of the packed tokens; keys and values one layer's whole cache
        (slots, kv_heads, D), the step's new ones written. Returns (N, n_head, D)."""


class AttentionBackend(Protocol):
    name: str

    def plan(self, rows: StepRows) -> StepAttention: ...


# -- gather: the reference --------------------------------------------------------------------------

@dataclass
class AttentionGroup:
    query_index: torch.Tensor | None  # (b · t,): each query's packed index, row by row (padding repeats
    # one); None: the group is the step's packed tokens in order, one per row (a decode-only step)
    blocks: torch.Tensor  # (b, L / block_size): each row's blocks holding its first L positions
    mask: torch.Tensor  # (b, 1, t, L) bool: True where the query attends
    valid: torch.Tensor | None  # (b · t,): which of the queries are not padding; None: all are
    width: int  # t


@dataclass
class GatherAttention:
    groups: list[AttentionGroup]
    block_size: int

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        gqa = q.shape[1] != keys.shape[1]
        out = None
        for group in self.groups:
            rows = group.blocks.shape[0]
            group_keys, group_values = (_gather(cache, group.blocks, self.block_size) for cache in (keys, values))
            selected = q if group.query_index is None else q.index_select(0, group.query_index)
            queries = selected.reshape(rows, group.width, *q.shape[1:]).transpose(1, 2)
            y = F.scaled_dot_product_attention(queries, group_keys.to(q.dtype), group_values.to(q.dtype),
                                               attn_mask=group.mask, enable_gqa=gqa)
            y = y.transpose(1, 2).reshape(rows * group.width, *q.shape[1:])
            if group.query_index is None:
                return y
            if out is None:
                out = torch.empty_like(q)
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


class GatherBackend:
    """Plans gather attention. On CPU every torch call costs microseconds of host time, so a group
    is made with few: its rows' numbers in one tensor, positions compared with a cached arange,
    and a decode-only step whose rows share a bucket reads its queries in place (no index)."""

    name = "gather"

    def __init__(self):
        self._positions: dict[tuple[int, torch.device], torch.Tensor] = {}

    def plan(self, rows: StepRows) -> GatherAttention:
        buckets: dict[tuple[bool, int], list[int]] = {}
        for row, (start, count) in enumerate(zip(rows.host_starts, rows.host_counts, strict=True)):
            buckets.setdefault(_bucket(start, count, rows.block_size), []).append(row)
        ordered = len(buckets) == 1 and rows.decode_only
        return GatherAttention([self._group(rows, members, ordered) for _, members in sorted(buckets.items())],
                               rows.block_size)

    def _arange(self, size: int, device: torch.device) -> torch.Tensor:
        key = (size, device)
        if key not in self._positions:
            self._positions[key] = torch.arange(size, device=device)
        return self._positions[key]

    def _group(self, rows: StepRows, members: list[int], ordered: bool) -> AttentionGroup:
        device = rows.block_tables.device
        starts = [rows.host_starts[r] for r in members]
        counts = [rows.host_counts[r] for r in members]
        offsets = [rows.host_offsets[r] for r in members]
        width = max(counts)
        blocks = -(-max(s + c for s, c in zip(starts, counts, strict=True)) // rows.block_size)
        key_position = self._arange(blocks * rows.block_size, device)
        if ordered:  # the step's rows in order, one query each: nothing to send but the tables' rows
            table = rows.block_tables.index_select(0, rows.row_ids)[:, :blocks]
            mask = key_position[None, :] <= rows.starts[:, None]
            return AttentionGroup(None, table, mask[:, None, None], None, 1)
        host = host_longs([rows.host_row_ids[r] for r in members] + starts + counts + offsets)
        row_id, start, count, offset = host.to(device, non_blocking=True).view(4, len(members))
        table = rows.block_tables.index_select(0, row_id)[:, :blocks]
        if width == 1:  # decodes: one query each, no padding
            mask = key_position[None, :] <= start[:, None]
            return AttentionGroup(offset, table, mask[:, None, None], None, 1)
        column = self._arange(width, device)
        valid = column[None, :] < count[:, None]
        query_index = torch.where(valid, offset[:, None] + column[None, :], offset[:, None])
        query_position = torch.where(valid, start[:, None] + column[None, :], 0)
        mask = key_position[None, None, :] <= query_position[:, :, None]
        return AttentionGroup(query_index.reshape(-1), table, mask[:, None], valid.reshape(-1), width)


def _bucket(start: int, count: int, block_size: int) -> tuple[bool, int]:
    """Decodes and prefill chunks apart, and each by its keys' length rounded up to a power of two
    (at least a block): padding a row costs at most twice its keys, and one 2k-token sequence
    does not make every short one gather 2k positions."""
    return count > 1, max(block_size, 1 << (start + count - 1).bit_length())


# -- flex: flex_attention over the cache in place -----------------------------------------------------

_compiled_flex = None


def compiled_flex_attention():
    """flex_attention compiled once per process (every engine shares its compilations)."""
    global _compiled_flex
    if _compiled_flex is None:
        from torch.nn.attention.flex_attention import flex_attention

        # Compilations per model shape: decode, prefill, long prefill (module docstring); a process
        # serving one model needs three, tests a dozen; the default limit of 8 would fall back to eager.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)
        _compiled_flex = torch.compile(flex_attention, dynamic=True)
    return _compiled_flex


@dataclass
class FlexGroup:
    query_index: torch.Tensor | None  # (b · t,) as AttentionGroup's; None: the packed tokens, in order
    valid: torch.Tensor | None
    width: int
    rows: int  # b, before a lone row is doubled
    block_mask: object  # torch.nn.attention.flex_attention.BlockMask


@dataclass
class FlexAttention:
    groups: list[FlexGroup]
    kernel_options: dict | None

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        flex = compiled_flex_attention()
        heads, dim = q.shape[1:]
        # The cache in place: (slots, kv_heads, D) seen as (1, kv_heads, slots, D), no copy.
        key_view, value_view = keys.unsqueeze(0).transpose(1, 2), values.unsqueeze(0).transpose(1, 2)
        gqa = heads != keys.shape[1]
        out = None if len(self.groups) == 1 and self.groups[0].query_index is None else torch.empty_like(q)
        for group in self.groups:
            selected = q if group.query_index is None else q.index_select(0, group.query_index)
            queries = selected.reshape(group.rows, group.width, heads, dim).transpose(1, 2)
            if group.rows == 1:  # a batch of one would compile its own specialisation
                queries = queries.expand(2, -1, -1, -1)
            # Always the same strides (a size-1 dimension's included): other strides compile anew, or miscompile.
            queries = queries.clone(memory_format=torch.contiguous_format)
            y = flex(queries, key_view, value_view, block_mask=group.block_mask, enable_gqa=gqa,
                     kernel_options=self.kernel_options)
            y = y[:group.rows].transpose(1, 2).reshape(group.rows * group.width, heads, dim)
            if out is None:
                return y
            if group.valid is None:
                out.index_copy_(0, group.query_index, y)
            else:
                out[group.query_index[group.valid]] = y[group.valid]
        return out


class FlexBackend:
    """Plans flex attention. The mask_mod reads each row's table and start from buffers of a fixed
    shape (MIN_FLEX_ROWS rows or more) that the plan fills: a mask_mod over tensors whose first
    dimension is the (dynamic) batch miscompiles on CPU (torch 2.13), and fixed shapes keep one
    compilation for every batch size. One pair of buffers per kind of group (decodes, prefill
    chunks), as a step's two groups are attended layer after layer."""

    name = "flex"

    def __init__(self, device: torch.device | str):
        # On CUDA the Triton kernels' KV tile must divide the cache block (one KV block per cache block).
        self.cuda = torch.device(device).type == "cuda"
        self._buffers: dict[bool, tuple[torch.Tensor, torch.Tensor]] = {}

    def plan(self, rows: StepRows) -> FlexAttention:
        if rows.block_logical is None or not rows.num_slots:
            raise ValueError("flex attention needs StepRows.block_logical and num_slots")
        options = {"BLOCK_N": min(rows.block_size, 64)} if self.cuda else None
        count = len(rows.host_counts)
        if rows.decode_only:
            return FlexAttention([self._group(rows, list(range(count)), ordered=True)], options)
        decodes = [r for r in range(count) if rows.host_counts[r] == 1]
        chunks = [r for r in range(count) if rows.host_counts[r] > 1]
        return FlexAttention([self._group(rows, members) for members in (decodes, chunks) if members], options)

    def _rows_buffers(self, prefill: bool, batch: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(tables, starts) buffers of at least `batch` rows, as wide as `like`'s tables."""
        tables, starts = self._buffers.get(prefill, (None, None))
        if tables is None or tables.shape[0] < batch or tables.shape[1] != like.shape[1]:
            size = max(MIN_FLEX_ROWS, 1 << (batch - 1).bit_length())
            tables = torch.zeros(size, like.shape[1], dtype=torch.int32, device=like.device)
            starts = torch.zeros(size, dtype=torch.int32, device=like.device)
            self._buffers[prefill] = tables, starts
        return tables, starts

    def _block_offsets(self, block_size: int, device) -> torch.Tensor:
        if getattr(self, "_offsets", None) is None or self._offsets.shape[0] != block_size:
            self._offsets = torch.arange(block_size, device=device)
        return self._offsets

    def _group(self, rows: StepRows, members: list[int], ordered: bool = False) -> FlexGroup:
        from torch.nn.attention.flex_attention import BlockMask

        device, block_size = rows.block_tables.device, rows.block_size
        counts = [rows.host_counts[r] for r in members]
        width = max(counts)
        batch = max(2, len(members))  # a lone row twice: see FlexAttention.attend
        all_tables, all_starts = self._rows_buffers(width > 1, batch, rows.block_tables)
        tables, starts = all_tables[:batch], all_starts[:batch]
        if ordered and len(members) > 1:
            torch.index_select(rows.block_tables, 0, rows.row_ids, out=tables)
            starts.copy_(rows.starts)
            lengths = rows.starts + rows.counts
        else:
            pick = members if len(members) > 1 else members * 2
            host = host_longs([rows.host_row_ids[r] for r in pick] + pick)
            row_id, index = host.to(device, non_blocking=True).view(2, len(pick))
            torch.index_select(rows.block_tables, 0, row_id, out=tables)
            starts.copy_(rows.starts.index_select(0, index))
            lengths = starts + rows.counts.index_select(0, index)
        q_blocks = -(-width // FLEX_Q_BLOCK)
        # Row tile i holds queries i·Q..(i+1)·Q-1 and needs the blocks up to its last query's position.
        tile_end = starts[:, None] + FLEX_Q_BLOCK * torch.arange(1, q_blocks + 1, device=device)[None, :]
        kv_num_blocks = (torch.minimum(tile_end, lengths[:, None]) + block_size - 1) // block_size
        kv_indices = tables[:, None, None, :]
        if q_blocks > 1:
            kv_indices = kv_indices.expand(batch, 1, q_blocks, tables.shape[1]).contiguous()
        logical, offsets_in_block = rows.block_logical, self._block_offsets(block_size, device)
        for tensor in (all_tables, all_starts, logical, offsets_in_block):
            torch._dynamo.mark_static(tensor)

        def paged_causal(b, h, q_idx, kv_idx):
            size = offsets_in_block.shape[0]  # the block size, as a compile-time constant
            block = kv_idx // size
            index = logical[block]
            return (all_tables[b, index] == block) & (index * size + kv_idx % size <= all_starts[b] + q_idx)

        block_mask = BlockMask.from_kv_blocks(kv_num_blocks[:, None].to(torch.int32), kv_indices,
                                              BLOCK_SIZE=(FLEX_Q_BLOCK, block_size), mask_mod=paged_causal,
                                              seq_lengths=(width, rows.num_slots), compute_q_blocks=False)
        if ordered:
            return FlexGroup(None, None, width, len(members), block_mask)
        offsets = [rows.host_offsets[r] for r in members]
        if width == 1:
            return FlexGroup(host_longs(offsets).to(device, non_blocking=True), None, 1, len(members), block_mask)
        offset, count = host_longs(offsets + counts).to(device, non_blocking=True).view(2, len(members))
        column = torch.arange(width, device=device)
        valid = column[None, :] < count[:, None]
        query_index = torch.where(valid, offset[:, None] + column[None, :], offset[:, None])
        return FlexGroup(query_index.reshape(-1), valid.reshape(-1), width, len(members), block_mask)


# -- flashinfer: FlashInfer's paged kernels (CUDA) ------------------------------------------------------

WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended float workspace


@dataclass
class FlashInferAttention:
    wrapper: object
    block_size: int

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        pages = (keys.view(-1, self.block_size, *keys.shape[1:]), values.view(-1, self.block_size, *values.shape[1:]))
        return self.wrapper.run(q.contiguous(), pages)


class FlashInferBackend:
    """One decode and one prefill wrapper over a shared workspace; plan() once per step (FlashInfer
    copies the index pointers from the host: they are given as CPU tensors)."""

    name = "flashinfer"

    def __init__(self, device, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype):
        import flashinfer

        workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD",
                                                                    use_tensor_cores=heads // kv_heads >= 4)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        self.heads, self.kv_heads, self.head_dim, self.dtype = heads, kv_heads, head_dim, dtype

    def plan(self, rows: StepRows) -> FlashInferAttention:
        block_size = rows.block_size
        lengths = [s + c for s, c in zip(rows.host_starts, rows.host_counts, strict=True)]
        pages = [-(-length // block_size) for length in lengths]
        kv_indptr = torch.tensor([0, *_cumulative(pages)], dtype=torch.int32)
        last_page_len = torch.tensor([(length - 1) % block_size + 1 for length in lengths], dtype=torch.int32)
        indices = _page_indices(rows.tables(), kv_indptr, int(kv_indptr[-1]))
        shape = (self.heads, self.kv_heads, self.head_dim, block_size)
        if rows.decode_only:
            self.decode.plan(kv_indptr, indices, last_page_len, *shape, q_data_type=self.dtype,
                             kv_data_type=self.dtype)
            return FlashInferAttention(self.decode, block_size)
        qo_indptr = torch.tensor([0, *_cumulative(rows.host_counts)], dtype=torch.int32)
        self.prefill.plan(qo_indptr, kv_indptr, indices, last_page_len, *shape, causal=True,
                          q_data_type=self.dtype, kv_data_type=self.dtype)
        return FlashInferAttention(self.prefill, block_size)


def _cumulative(values: list[int]) -> list[int]:
    total, out = 0, []
    for value in values:
        total += value
        out.append(total)
    return out


def _page_indices(tables: torch.Tensor, indptr: torch.Tensor, total: int) -> torch.Tensor:
    """Each row's first indptr[r+1]-indptr[r] blocks, concatenated, computed on the device (the
    total is known on the host, so nothing waits for the device)."""
    device = tables.device
    bounds = indptr.to(device, non_blocking=True)
    flat = torch.arange(total, device=device, dtype=torch.int32)
    row = torch.searchsorted(bounds, flat, right=True) - 1
    return tables[row.long(), (flat - bounds[row]).long()].to(torch.int32)


# -- choosing and checking a backend ------------------------------------------------------------------

def select_attention(name: AttentionName, device: torch.device | str, dtype: torch.dtype) -> tuple[str, str | None]:
    """(the backend to use, why it differs from the one asked for, or None)."""
    cuda = torch.device(device).type == "cuda"
    if name == "auto":
        if not cuda:
            return CPU_AUTO, None
        name = "flashinfer"
    if name != "flashinfer":
        return name, None
    if not cuda:
        return "flex", "flashinfer runs on CUDA only"
    if dtype not in (torch.float16, torch.bfloat16):
        return "flex", f"flashinfer takes float16 or bfloat16, not {dtype}"
    try:
        import flashinfer  # noqa: F401
    except ImportError as exc:
        return "flex", f"flashinfer does not import: {exc}"
    return "flashinfer", None


def make_attention(name: str, device, heads: int, kv_heads: int, head_dim: int,
                   dtype: torch.dtype) -> AttentionBackend:
    if name == "gather":
        return GatherBackend()
    if name == "flex":
        return FlexBackend(device)
    if name == "flashinfer":
        return FlashInferBackend(device, heads, kv_heads, head_dim, dtype)
    raise ValueError(f"unknown attention backend {name!r}")


FALLBACK = {"flashinfer": "flex", "flex": "gather"}


def verify_attention(backend: AttentionBackend, device, heads: int, kv_heads: int, head_dim: int,
                     dtype: torch.dtype, block_size: int) -> str | None:
    """Run a small random step (a prefill chunk after a cached prefix, and decodes) through
    `backend` and through gather; None when they agree, else what went wrong."""
    if backend.name == "gather":
        return None
    generator = torch.Generator().manual_seed(0)
    blocks, width = 12, table_width(12)
    keys, values = (torch.randn(blocks * block_size, kv_heads, head_dim, generator=generator).to(device, dtype)
                    for _ in range(2))
    tables = torch.randperm(blocks, generator=generator).view(3, 4).to(torch.int32)
    table_rows = torch.zeros(3, width, dtype=torch.int32)
    table_rows[:, :4] = tables
    logical = torch.zeros(width, dtype=torch.int32)
    logical[tables.reshape(-1).long()] = torch.arange(4, dtype=torch.int32).repeat(3)
    starts, counts = [block_size + 1, 3 * block_size - 1, 2], [3, 1, 1]
    rows = StepRows(table_rows.to(device), torch.arange(3, device=device), torch.tensor(starts, device=device),
                    torch.tensor(counts, device=device), [0, 1, 2], starts, counts, [0, 3, 4], block_size,
                    logical.to(device), blocks * block_size)
    q = torch.randn(sum(counts), heads, head_dim, generator=generator).to(device, dtype)
    try:
        with torch.no_grad():  # as the engine runs it (grad mode is part of what is compiled)
            got = backend.plan(rows).attend(q, keys, values)
    except Exception as exc:  # noqa: BLE001 - any failure of an optional kernel means: use another
        return f"{type(exc).__name__}: {exc}"
    expected = GatherBackend().plan(rows).attend(q, keys, values)
    tolerance = 1e-3 if dtype == torch.float32 else 3e-2
    error = float((got.float() - expected.float()).abs().max())
    if not math.isfinite(error) or error > tolerance:
        return f"differs from gather by {error:.3g} (tolerance {tolerance})"
    return None
