"""The engine (vLLM's split: this file knows nothing of HTTP): a scheduler that admits
waiting requests into the running batch at every step (continuous batching), prefill and
batched decode over a slot-per-sequence KV cache, sampling, and retirement of finished
sequences. The API layer drives `step()` from one background thread."""

from __future__ import annotations

import heapq
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
    logprobs: list[float] = field(default_factory=list)  # of each output token, when asked for
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    arrived: float = field(default_factory=time.monotonic)  # time.monotonic() throughout
    scheduled_at: float | None = None  # admitted into the running batch: prefill starts
    first_token_at: float | None = None  # prefill done
    finished_at: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Engine:
    def __init__(self, model: GPT, *, max_running: int = 8, max_waiting: int = 64, eos_id: int | None = None,
                 step_delay_seconds: float = 0.0):
        self.model = model.eval()
        self.step_delay_seconds = step_delay_seconds  # an artificial slowdown, for alert drills
        self.config = model.config
        self.device = next(model.parameters()).device
        self.cache = KVCache(model.config, max_running, device=self.device,
                             dtype=next(model.parameters()).dtype)
        self.max_waiting = max_waiting
        self.eos_id = eos_id
        self.waiting: deque[Sequence] = deque()
        self.running: dict[int, Sequence] = {}  # slot → sequence
        self._free_slots = list(range(max_running))  # a heap: the lowest free slot is taken first
        self._ids = itertools.count()

    # -- requests ------------------------------------------------------------------------

    def add(self, prompt: list[int], params: SamplingParams) -> Sequence:
        """Validate and queue a request (QueueFull when the waiting queue is at capacity)."""
        if len(self.waiting) >= self.max_waiting:
            raise QueueFull(f"{len(self.waiting)} requests are waiting")
        seq = self.new_sequence(prompt, params)
        self.enqueue(seq)
        return seq

    def new_sequence(self, prompt: list[int], params: SamplingParams) -> Sequence:
        if not prompt:
            raise ValueError("the prompt is empty")
        if len(prompt) >= self.config.context_length:
            raise ValueError(f"the prompt has {len(prompt)} tokens; the context holds {self.config.context_length}")
        return Sequence(next(self._ids), list(prompt), params, params.generator())

    def enqueue(self, seq: Sequence) -> None:
        self.waiting.append(seq)

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

    @torch.no_grad()
    def score(self, tokens: list[int]) -> list[float]:
        """The log-probability of each token after the first given the ones before it
        (teacher forcing; no cache slot is used)."""
        if not 2 <= len(tokens) <= self.config.context_length:
            raise ValueError(f"scoring needs 2 to {self.config.context_length} tokens, got {len(tokens)}")
        ids = torch.tensor([tokens], device=self.device)
        logits, _ = self.model(ids)
        logprobs = torch.log_softmax(logits[0, :-1].float(), dim=-1)
        return logprobs.gather(1, ids[0, 1:, None]).squeeze(1).tolist()

    @torch.no_grad()
    def prompt_logprobs(self, tokens: list[int], top: int) -> tuple[list[float], list[dict[int, float]]]:
        """For each token after the first: its logprob given the ones before it and, with `top`,
        the `top` most likely tokens' logprobs there (an echoed prompt's logprobs)."""
        if not 1 <= len(tokens) <= self.config.context_length:
            raise ValueError(f"a prompt needs 1 to {self.config.context_length} tokens, got {len(tokens)}")
        if len(tokens) == 1:
            return [], []
        ids = torch.tensor([tokens], device=self.device)
        logits, _ = self.model(ids)
        logprobs = torch.log_softmax(logits[0, :-1].float(), dim=-1)
        chosen = logprobs.gather(1, ids[0, 1:, None]).squeeze(1).tolist()
        if not top:
            return chosen, []
        values, indices = torch.topk(logprobs, top, dim=-1)
        return chosen, [dict(zip(i, v, strict=True)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)]

    @torch.no_grad()
    def step(self) -> list[tuple[Sequence, int]]:
        """Admit, prefill, decode, retire; returns the (sequence, token) pairs produced."""
        if self.step_delay_seconds:
            time.sleep(self.step_delay_seconds)
        produced = []
        decoding = [self.running[slot] for slot in sorted(self.running)]
        while self.waiting and self._free_slots:
            seq = self.waiting.popleft()
            seq.scheduled_at = time.monotonic()
            seq.slot = heapq.heappop(self._free_slots)
            self.running[seq.slot] = seq
            logits = self.model.forward_cached(torch.tensor([seq.prompt], device=self.device),
                                               torch.arange(len(seq.prompt), device=self.device)[None],
                                               self.cache, torch.tensor([seq.slot], device=self.device))
            produced.append(self._emit(seq, logits[0, -1]))
        if decoding:
            last = torch.tensor([[s.output[-1]] for s in decoding], device=self.device)
            positions = torch.tensor([[len(s.prompt) + len(s.output) - 1] for s in decoding], device=self.device)
            slot_ids = [s.slot for s in decoding]
            consecutive = slot_ids == list(range(slot_ids[0], slot_ids[0] + len(slot_ids)))
            logits = self.model.forward_cached(last, positions, self.cache, torch.tensor(slot_ids, device=self.device),
                                               first_slot=slot_ids[0] if consecutive else None)
            produced += [self._emit(seq, logits[row, -1]) for row, seq in enumerate(decoding)]
        return produced

    def _emit(self, seq: Sequence, logits: torch.Tensor) -> tuple[Sequence, int]:
        token = sample(logits, seq.params, seq.generator)
        if seq.params.logprobs is not None:
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            seq.logprobs.append(float(logprobs[token]))
            if seq.params.logprobs:
                top = torch.topk(logprobs, seq.params.logprobs)
                seq.top_logprobs.append(dict(zip(top.indices.tolist(), top.values.tolist(), strict=True)))
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
            heapq.heappush(self._free_slots, seq.slot)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
