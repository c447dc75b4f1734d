"""The engine (vLLM's split: this file knows nothing of HTTP): a scheduler that admits
waiting requests into the running batch at every step (continuous batching), prefill and
batched decode over a slot-per-sequence KV cache, sampling, and retirement of finished
sequences. The API layer drives `step()` from one background thread."""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from lmforge.common.model import GPT, KVCache
from lmforge.inference.sampling import SamplingParams, sample


class QueueFull(Exception):
    """The waiting queue is at capacity (the API answers 429 with Retry-After)."""


@dataclass(eq=False)
class Sequence:
    id: int
    prompt: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    output: list[int] = field(default_factory=list)
    slot: int | None = None
    finish_reason: str | None = None  # "length", "stop", "cancelled"
    arrived: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    finished_at: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Engine:
    def __init__(self, model: GPT, *, max_running: int = 8, max_waiting: int = 64, eos_id: int | None = None):
        self.model = model.eval()
        self.config = model.config
        self.device = next(model.parameters()).device
        self.cache = KVCache(model.config, max_running, device=self.device,
                             dtype=next(model.parameters()).dtype)
        self.max_waiting = max_waiting
        self.eos_id = eos_id
        self.waiting: deque[Sequence] = deque()
        self.running: dict[int, Sequence] = {}  # slot → sequence
        self._free_slots = list(range(max_running))
        self._ids = itertools.count()

    # -- requests ------------------------------------------------------------------------

    def add(self, prompt: list[int], params: SamplingParams) -> Sequence:
        if not prompt:
            raise ValueError("the prompt is empty")
        if len(prompt) >= self.config.context_length:
            raise ValueError(f"the prompt has {len(prompt)} tokens; the context holds {self.config.context_length}")
        if len(self.waiting) >= self.max_waiting:
            raise QueueFull(f"{len(self.waiting)} requests are waiting")
        seq = Sequence(next(self._ids), list(prompt), params, params.generator())
        self.waiting.append(seq)
        return seq

    def cancel(self, seq: Sequence) -> None:
        """Drop a request (its client went away): out of the queue, or its slot freed."""
        if seq.finished:
            return
        if seq in self.waiting:
            self.waiting.remove(seq)
        self._finish(seq, "cancelled")

    @property
    def kv_cache_usage(self) -> float:
        return len(self.running) / self.cache.slots

    # -- one scheduling step ---------------------------------------------------------------

    def step(self) -> list[tuple[Sequence, int]]:
        """Admit, prefill, decode, retire; returns the (sequence, token) pairs produced."""
        produced = []
        decoding = list(self.running.values())
        while self.waiting and self._free_slots:
            seq = self.waiting.popleft()
            seq.slot = self._free_slots.pop(0)
            self.running[seq.slot] = seq
            logits = self.model.forward_cached(torch.tensor([seq.prompt], device=self.device),
                                               torch.arange(len(seq.prompt), device=self.device)[None],
                                               self.cache, torch.tensor([seq.slot], device=self.device))
            produced.append(self._emit(seq, logits[0, -1]))
        if decoding:
            last = torch.tensor([[s.output[-1]] for s in decoding], device=self.device)
            positions = torch.tensor([[len(s.prompt) + len(s.output) - 1] for s in decoding], device=self.device)
            slots = torch.tensor([s.slot for s in decoding], device=self.device)
            logits = self.model.forward_cached(last, positions, self.cache, slots)
            produced += [self._emit(seq, logits[row, -1]) for row, seq in enumerate(decoding)]
        return produced

    def _emit(self, seq: Sequence, logits: torch.Tensor) -> tuple[Sequence, int]:
        token = sample(logits, seq.params, seq.generator)
        seq.output.append(token)
        if seq.first_token_at is None:
            seq.first_token_at = time.monotonic()
        if token in seq.params.stop_token_ids or token == self.eos_id:
            self._finish(seq, "stop")
        elif len(seq.output) >= seq.params.max_tokens or \
                len(seq.prompt) + len(seq.output) >= self.config.context_length:
            self._finish(seq, "length")
        return seq, token

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        seq.finished_at = time.monotonic()
        if seq.slot is not None and self.running.get(seq.slot) is seq:
            del self.running[seq.slot]
            self._free_slots.append(seq.slot)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
