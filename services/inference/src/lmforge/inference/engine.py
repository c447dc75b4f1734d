"""The engine (vLLM's split: this file knows nothing of HTTP): at every step the scheduler
picks the sequences and token counts (continuous batching, chunked prefill, paged KV blocks,
prefix caching), the model runner computes them in one forward and samples the batch, and the
engine appends the tokens and retires finished sequences. The engine core drives `step()` in a
process of its own (lmforge.inference.engine_core).

A fault in one step fails the step's requests, not the engine: a sampling that raises fails its
own sequences (the model runner finds them), a forward that raises fails the step's sequences;
each is logged with its request id, finished with reason "error" and its blocks released. A
fault the engine cannot serve on (model_runner.is_fatal), or one outside a request's step (the
scheduler's bookkeeping), is raised to the engine core."""

from __future__ import annotations

import itertools
import time
from collections import deque

import torch

from lmforge.common.logging import get_logger
from lmforge.inference.block_manager import BlockManager
from lmforge.inference.model_runner import ModelRunner, is_fatal
from lmforge.inference.sampling import SamplingParams
from lmforge.inference.scheduler import Scheduler
from lmforge.inference.sequence import Sequence, check_prompt
from lmforge.inference.stats import EngineStats
from lmforge.model.kv_cache import PagedKVCache
from lmforge.model.transformer import GPT

__all__ = ["Engine", "QueueFull", "Sequence", "kv_cache_blocks"]

log = get_logger("inference")

DEFAULT_CPU_CONTEXTS = 8  # on CPU, without kv_cache_bytes: room for this many full contexts


class QueueFull(Exception):
    """The waiting queue is at capacity (the API answers 429 with Retry-After)."""


def kv_cache_blocks(model: GPT, block_size: int, kv_cache_bytes: int | None,
                    memory_fraction: float) -> int:
    """The pool's size in blocks: `kv_cache_bytes` if set; else `memory_fraction` of the CUDA
    device's free memory (after the model is loaded), or DEFAULT_CPU_CONTEXTS full contexts on
    CPU. It must hold at least one full context."""
    config = model.config
    parameter = next(model.parameters())
    per_token = PagedKVCache.bytes_per_token(config, parameter.dtype)
    if kv_cache_bytes is None:
        if parameter.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(parameter.device)
            kv_cache_bytes = int(free * memory_fraction)
        else:
            kv_cache_bytes = DEFAULT_CPU_CONTEXTS * config.context_length * per_token
    blocks = PagedKVCache.blocks_for_bytes(config, kv_cache_bytes, block_size, parameter.dtype)
    needed = -(-config.context_length // block_size)
    if blocks < needed:
        raise ValueError(f"a KV cache of {kv_cache_bytes:,} bytes holds {blocks} blocks of {block_size} tokens; "
                         f"one full context ({config.context_length} tokens) needs {needed} "
                         f"({needed * block_size * per_token:,} bytes)")
    return blocks


class Engine:
    def __init__(self, model: GPT, *, max_running: int = 64, max_waiting: int = 64, eos_id: int | None = None,
                 step_delay_seconds: float = 0.0, kv_cache_bytes: int | None = None,
                 kv_cache_memory_fraction: float = 0.5, block_size: int = 16, max_batched_tokens: int = 512,
                 prefix_caching: bool = True, model_identity: str = "", attention: str = "auto",
                 cuda_graphs: bool = True):
        """`model_identity` names the weights (e.g. the package and its checksums): with the cache's
        dtype it salts the prefix cache's keys, which hold only for those keys and values."""
        self.model = model.eval()
        self.step_delay_seconds = step_delay_seconds  # an artificial slowdown, for alert drills
        self.config = model.config
        self.device = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        num_blocks = kv_cache_blocks(model, block_size, kv_cache_bytes, kv_cache_memory_fraction)
        self.cache = PagedKVCache(self.config, num_blocks, block_size, device=self.device, dtype=dtype)
        self.blocks = BlockManager(num_blocks, block_size, prefix_caching, salt=f"{model_identity}\0{dtype}".encode())
        self.scheduler = Scheduler(self.blocks, max_running=max_running, max_batched_tokens=max_batched_tokens)
        self.runner = ModelRunner(self.model, self.cache, max_running=max_running,
                                         max_batched_tokens=max_batched_tokens, attention=attention,
                                         cuda_graphs=cuda_graphs)
        self.max_waiting = max_waiting
        self.eos_id = eos_id
        self._ids = itertools.count()

    @property
    def waiting(self) -> deque[Sequence]:
        return self.scheduler.waiting

    @property
    def running(self) -> list[Sequence]:
        return self.scheduler.running

    # -- requests ------------------------------------------------------------------------

    def add(self, prompt: list[int], params: SamplingParams, request_id: str | None = None) -> Sequence:
        """Validate and queue a request (QueueFull when the waiting queue is at capacity)."""
        if len(self.waiting) >= self.max_waiting:
            raise QueueFull(f"{len(self.waiting)} requests are waiting")
        seq = self.new_sequence(prompt, params, request_id)
        self.enqueue(seq)
        return seq

    def new_sequence(self, prompt: list[int], params: SamplingParams, request_id: str | None = None) -> Sequence:
        check_prompt(prompt, self.config.context_length)
        return Sequence(next(self._ids), list(prompt), params, params.generator(), request_id=request_id)

    def enqueue(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def cancel(self, seq: Sequence) -> None:
        """Drop a request (its client went away): out of the queue, or its blocks freed."""
        if not seq.finished:
            self._finish(seq, "cancelled")

    @property
    def kv_cache_usage(self) -> float:
        """KV blocks in use over blocks in the pool."""
        return self.blocks.num_used / self.blocks.num_blocks

    def stats(self) -> EngineStats:
        stats = self.scheduler.stats
        stats.kv_blocks_in_use = self.blocks.num_used
        return stats

    # -- scoring (no cache; between steps) -----------------------------------------------------

    def score(self, tokens: list[int]) -> list[float]:
        """The log-probability of each token after the first given the ones before it."""
        if not 2 <= len(tokens) <= self.config.context_length:
            raise ValueError(f"scoring needs 2 to {self.config.context_length} tokens, got {len(tokens)}")
        return self.runner.prompt_logprobs(tokens, 0)[0]

    def prompt_logprobs(self, tokens: list[int], top: int) -> tuple[list[float], list[dict[int, float]]]:
        """For each token after the first: its logprob given the ones before it and, with `top`,
        the `top` most likely tokens' logprobs there (an echoed prompt's logprobs)."""
        if not 1 <= len(tokens) <= self.config.context_length:
            raise ValueError(f"a prompt needs 1 to {self.config.context_length} tokens, got {len(tokens)}")
        if len(tokens) == 1:
            return [], []
        return self.runner.prompt_logprobs(tokens, top)

    # -- one step ------------------------------------------------------------------------------

    def step(self) -> list[tuple[Sequence, int | None]]:
        """Schedule, compute, sample, retire; returns the (sequence, token) pairs produced, and
        (sequence, None) for each sequence the step failed."""
        if self.step_delay_seconds:
            time.sleep(self.step_delay_seconds)
        scheduled = self.scheduler.schedule()
        if not scheduled:
            return []
        try:
            executed = self.runner.execute(scheduled)
        except Exception as exc:
            if is_fatal(exc):
                raise
            return self._fail([(seq, exc) for seq, _ in scheduled])
        for seq, count in scheduled:
            self.scheduler.computed(seq, count)
        produced = self._fail([(scheduled[index][0], exc) for index, exc in executed.failed])
        sampled = executed.sampled
        for row, index in enumerate(executed.sampled_indices):
            seq = scheduled[index][0]
            if seq.params.logprobs is not None:
                seq.logprobs.append(sampled.logprobs[row])
                if seq.params.logprobs:
                    seq.top_logprobs.append(sampled.top_logprobs[row])
            produced.append((seq, self._append(seq, sampled.tokens[row])))
        return produced

    def _append(self, seq: Sequence, token: int) -> int:
        seq.output.append(token)
        if seq.first_token_at is None:
            seq.first_token_at = time.monotonic()
        if token in seq.params.stop_token_ids or token == self.eos_id:
            self._finish(seq, "stop")
        elif len(seq.output) >= seq.params.max_tokens or seq.num_tokens >= self.config.context_length:
            self._finish(seq, "length")
        return token

    def _fail(self, failures: list[tuple[Sequence, Exception]]) -> list[tuple[Sequence, int | None]]:
        """Finish each sequence with reason "error" (its blocks released), logged with its request
        id and the traceback; they are the step's (sequence, None) pairs."""
        for seq, exc in failures:
            log.error("sequence_failed", request_id=seq.request_id, sequence=seq.id, error=str(exc),
                      kind=type(exc).__name__, exc_info=exc)
            seq.error = exc
            self._finish(seq, "error")
        return [(seq, None) for seq, _ in failures]

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        seq.finished_at = time.monotonic()
        self.scheduler.finish(seq)
        self.runner.release(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
