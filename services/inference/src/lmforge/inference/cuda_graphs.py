"""Decode-only steps replayed from CUDA graphs: a decode step's launches (a few per layer, each a
few microseconds of host time) outnumber its arithmetic at small batches, so on CUDA the model
runner captures one graph per batch size in `sizes` (2, 4, 8, ... up to max_running) at start and
replays the smallest that fits, padding the batch up to it.

A graph reads and writes fixed addresses, so a step's inputs are copied into static buffers: the
tokens, positions and cache slots, the rows' block tables and cached-prefix lengths. Rows past
the step's are padding: token 0 at position 0, writing its key and value to the KV cache's
scratch block (lmforge.model.kv_cache, never handed to a sequence) and attending to that slot
alone; their logits are dropped (the step's `logits_index` picks the real rows). What is captured
is the model's paged forward with flex attention planned from those buffers (every input a tensor,
so a replay re-plans nothing): whatever backend serves the other steps, the graphs use flex.
Prefill and mixed steps, and decode batches larger than the largest size, run eagerly.

The padding runs on CPU too (`capture=False`: the same buffers and forward, run eagerly), so that
tests can check a padded step against an unpadded one; capture and replay are CUDA-only. MoE
models are not captured (their routing reads the expert loads back to the host). Capture is
timed and logged (`cuda_graphs_captured`: sizes, seconds); a capture that fails, or whose replay
differs from the eager forward on the same inputs, turns graphs off with a log line.
"""

from __future__ import annotations

import time

import torch

from lmforge.common.logging import get_logger
from lmforge.inference.input_batch import InputBatch, StepInputs
from lmforge.model.attention_backends import FlexBackend, StepRows
from lmforge.model.kv_cache import PagedKVCache
from lmforge.model.paged_attention import PagedBatch
from lmforge.model.transformer import GPT

log = get_logger("inference")

WARMUP_RUNS = 2  # eager runs before a capture: compile flex, settle the allocator


def graph_sizes(max_running: int) -> list[int]:
    """2, 4, 8, ... below max_running, then max_running itself (at least 2: flex pads a lone row anyway)."""
    top = max(2, max_running)
    sizes = [size for size in (1 << k for k in range(1, top.bit_length() + 1)) if size < top]
    return [*sizes, top]


class DecodeGraphs:
    def __init__(self, model: GPT, cache: PagedKVCache, batch: InputBatch, sizes: list[int], capture: bool):
        self.model, self.cache, self.batch = model, cache, batch
        self.sizes = sorted(sizes)
        self.capture = capture
        self.attention = FlexBackend(batch.device)
        largest, device = self.sizes[-1], batch.device
        self.tokens = torch.zeros(largest, dtype=torch.long, device=device)
        self.positions = torch.zeros(largest, dtype=torch.long, device=device)
        self.slots = torch.zeros(largest, dtype=torch.long, device=device)
        self.tables = torch.zeros(largest, batch.block_tables.shape[1], dtype=torch.int32, device=device)
        self.starts = torch.zeros(largest, dtype=torch.long, device=device)
        self.ones = torch.ones(largest, dtype=torch.long, device=device)
        self.row_ids = torch.arange(largest, device=device)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, torch.Tensor] = {}

    def size_for(self, rows: int) -> int | None:
        """The smallest size holding `rows` rows (None: more than the largest)."""
        return next((size for size in self.sizes if size >= rows), None)

    def run(self, step: StepInputs, size: int) -> torch.Tensor:
        """The logits (M, vocab) of a decode-only step's sampled rows, from `size` padded rows."""
        self._load(step, size)
        if size in self._graphs:
            self._graphs[size].replay()
            logits = self._logits[size]
        else:
            logits = self._forward(size)
        return logits.index_select(0, step.logits_index)

    def _load(self, step: StepInputs, size: int) -> None:
        rows = len(step.rows.host_counts)
        scratch = self.cache.scratch_block
        self.tokens[:rows].copy_(step.tokens)
        self.positions[:rows].copy_(step.positions)
        self.slots[:rows].copy_(step.slot_mapping)
        torch.index_select(step.rows.block_tables, 0, step.rows.row_ids, out=self.tables[:rows])
        self.starts[:rows].copy_(step.rows.starts)
        self._pad(rows, size, scratch)

    def _pad(self, rows: int, size: int, scratch: int) -> None:
        """Rows rows..size-1: token 0 at position 0 of the scratch block (block_logical[scratch] stays 0)."""
        if rows == size:
            return
        self.tokens[rows:size].zero_()
        self.positions[rows:size].zero_()
        self.slots[rows:size].fill_(scratch * self.cache.block_size)
        self.tables[rows:size, 0] = scratch
        self.starts[rows:size].zero_()

    def _forward(self, size: int) -> torch.Tensor:
        """The paged forward over the first `size` static rows, every row's logits (captured as is)."""
        ids = list(range(size))
        rows = StepRows(self.tables, self.row_ids[:size], self.starts[:size], self.ones[:size], ids, [0] * size,
                        [1] * size, ids, self.cache.block_size, self.batch.block_logical, self.batch.num_slots)
        batch = PagedBatch(self.positions[:size], self.slots[:size], self.attention.plan(rows), max_position=0)
        return self.model.forward_paged(self.tokens[:size], self.cache, batch)

    def capture_all(self) -> bool:
        """Capture every size, largest first (they share one memory pool); on any failure, none (False)."""
        started = time.monotonic()
        pool = torch.cuda.graph_pool_handle()
        try:
            for size in reversed(self.sizes):
                self._pad(0, size, self.cache.scratch_block)
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(WARMUP_RUNS):
                        expected = self._forward(size)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._logits[size] = self._forward(size)
                graph.replay()
                torch.cuda.synchronize()
                if not torch.allclose(self._logits[size].float(), expected.float(), atol=1e-2, rtol=1e-2):
                    raise RuntimeError(f"the replay of size {size} differs from the eager forward")
                self._graphs[size] = graph
        except Exception as exc:  # noqa: BLE001 - graphs are an optimisation: serve eagerly instead
            self._graphs.clear()
            self._logits.clear()
            log.warning("cuda_graphs_failed", error=f"{type(exc).__name__}: {exc}",
                        seconds=round(time.monotonic() - started, 2))
            return False
        log.info("cuda_graphs_captured", sizes=self.sizes, seconds=round(time.monotonic() - started, 2))
        return True

    @property
    def captured(self) -> list[int]:
        return sorted(self._graphs)
