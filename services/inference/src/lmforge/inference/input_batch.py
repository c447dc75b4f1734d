"""The model runner's persistent batch (vLLM's InputBatch idea): the state a step's forward reads
lives in tensors allocated once on the model's device and is updated in place as sequences come
and go, instead of being rebuilt from Python lists every step.

Each sequence the runner has seen holds a row (at most `max_rows`, the engine's max_running):

  block_tables   (rows, width) int32    the row's block table; a block the scheduler appends is
                                        one entry written, a readmitted (preempted) sequence, whose
                                        table is a new list, is written again from the start
  block_logical  (width,) int32         each block's index in the tables holding it (flex attention's
                                        mask; the same in every table that shares the block)

Attention reads the tables where they are (by row id): nothing per sequence is sent again. A step
sends the rest in one host-to-device copy, from a pinned staging buffer into a device buffer,
both allocated once: the step's rows, their cached prefixes and new-token counts, the rows whose
logits are sampled, the new tokens with their positions and cache slots (the slots made a run
per block, not a loop per token), and any new block-table entries. On CPU, where the device is
the host, that one tensor is all: every torch call costs microseconds there, so the step makes as
few as it can. A row is freed when the engine finishes its sequence (ModelRunner.release); a
sequence that never comes back (preempted, then cancelled while waiting) loses its row when one
is needed and it is not in the step. Stale entries past a row's length are never read as its
own: attention masks by position.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import torch

from lmforge.inference.sequence import Sequence
from lmforge.model.attention_backends import StepRows, host_longs, table_width


@dataclass
class Row:
    index: int
    table: list[int]  # the block-table list written (a new list: the sequence was readmitted)
    written: int  # its entries written so far


@dataclass
class StepInputs:
    """One step's forward inputs on the device."""

    tokens: torch.Tensor  # (N,) the packed new tokens
    positions: torch.Tensor  # (N,)
    slot_mapping: torch.Tensor  # (N,)
    rows: StepRows
    logits_index: torch.Tensor  # (M,) the packed index of each sampled sequence's last token
    sampled: list[int]  # the scheduled indices of those M sequences, in that order
    max_position: int


class InputBatch:
    def __init__(self, max_rows: int, max_tokens: int, total_blocks: int, block_size: int, device):
        self.device, self.block_size = torch.device(device), block_size
        width = table_width(total_blocks)
        self.block_tables = torch.zeros(max_rows, width, dtype=torch.int32, device=device)
        self.block_logical = torch.zeros(width, dtype=torch.int32, device=device)
        self.num_slots = total_blocks * block_size
        self.rows: dict[Sequence, Row] = {}
        self._free = list(range(max_rows - 1, -1, -1))
        # rows, starts, counts and sampled rows, tokens, positions and slots, table updates (grown when needed)
        self._staging = self._inputs = torch.empty(0, dtype=torch.int64)
        self._staging_size = 5 * max_rows + 3 * max_tokens

    def release(self, seq: Sequence) -> None:
        row = self.rows.pop(seq, None)
        if row is not None:
            self._free.append(row.index)

    def prepare(self, scheduled: list[tuple[Sequence, int]]) -> StepInputs:
        block_size, known = self.block_size, self.rows
        rows, starts, counts, offsets, last, sampled = [], [], [], [], [], []
        tokens, positions, slots = [], [], []
        update_rows, update_columns, update_blocks = [], [], []
        for index, (seq, count) in enumerate(scheduled):
            row = known.get(seq) or self._new_row(seq, scheduled)
            table = seq.block_table
            if row.table is not table:  # readmitted after a preemption: a new list
                row.table, row.written = table, 0
            if len(table) > row.written:
                update_rows += [row.index] * (len(table) - row.written)
                update_columns += range(row.written, len(table))
                update_blocks += table[row.written:]
                row.written = len(table)
            start = seq.num_computed
            end = start + count
            rows.append(row.index)
            starts.append(start)
            counts.append(count)
            offsets.append(len(tokens))
            if count == 1:
                tokens += seq.tokens(start, end)
                positions.append(start)
                slots.append(table[start // block_size] * block_size + start % block_size)
            else:
                tokens += seq.tokens(start, end)
                positions += range(start, end)
                self._slots(slots, table, start, end)
            if end == len(seq.prompt) + len(seq.output):  # its tokens all computed: sample its next
                last.append(len(tokens) - 1)
                sampled.append(index)
        row_ids, start_t, count_t, logits_index, token_ids, position_t, slot_t, *updates = self._to_device(
            rows, starts, counts, last, tokens, positions, slots, update_rows, update_columns, update_blocks)
        if update_rows:
            self._write_tables(*updates)
        step_rows = StepRows(self.block_tables, row_ids, start_t, count_t, rows, starts, counts, offsets, block_size,
                             self.block_logical, self.num_slots)
        return StepInputs(token_ids, position_t, slot_t, step_rows, logits_index, sampled, max(positions))

    def _slots(self, slots: list[int], table: list[int], start: int, end: int) -> None:
        """Append the slots of positions start..end-1: a run per block, not a loop per token."""
        block_size, position = self.block_size, start
        while position < end:
            offset = position % block_size
            run = min(block_size - offset, end - position)
            first = table[position // block_size] * block_size + offset
            slots += range(first, first + run)
            position += run

    def _new_row(self, seq: Sequence, scheduled: list[tuple[Sequence, int]]) -> Row:
        if not self._free:  # rows of sequences gone without a release (e.g. preempted, then cancelled)
            stepping = {s for s, _ in scheduled}
            for gone in [s for s in self.rows if s not in stepping]:
                self.release(gone)
        row = self.rows[seq] = Row(self._free.pop(), seq.block_table, 0)
        return row

    def _to_device(self, *lists: list[int]) -> list[torch.Tensor]:
        """The lists as one int64 tensor on the device, split: on CUDA one copy from a pinned staging
        buffer into a device buffer (both allocated once, grown when a step needs more); on CPU the
        tensor made from the lists is the step's."""
        sizes = [len(values) for values in lists]
        flat = host_longs(chain.from_iterable(lists))
        if self.device.type != "cpu":
            if len(flat) > self._staging.numel():
                size = max(2 * len(flat), self._staging_size)
                self._staging = torch.empty(size, dtype=torch.int64, pin_memory=True)
                self._inputs = torch.empty(size, dtype=torch.int64, device=self.device)
            staged, flat = self._staging[:len(flat)].copy_(flat), self._inputs[:len(flat)]
            flat.copy_(staged, non_blocking=True)
        return list(flat.split(sizes))

    def _write_tables(self, rows: torch.Tensor, columns: torch.Tensor, blocks: torch.Tensor) -> None:
        self.block_tables[rows, columns] = blocks.to(torch.int32)
        self.block_logical[blocks] = columns.to(torch.int32)
