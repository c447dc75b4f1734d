"""The model runner (vLLM's split): the only part of the engine that touches tensors. It computes
a scheduled step's new tokens in one forward over the paged KV cache, samples the whole batch on
the device, and computes teacher-forced logprobs for scoring and echoed prompts.

Three pieces, each its own module:
  input_batch    the persistent batch: the rows' block tables and the step's inputs in tensors
                 allocated once on the device, updated in place (a new block is one entry); a
                 step is one host-to-device copy and positions and slots are computed there
  attention      the backend each layer attends with (lmforge.model.attention_backends: gather,
                 flex over the cache in place, flashinfer on CUDA), chosen by the engine's
                 `attention` setting, verified against gather at start (else the next one)
  cuda_graphs    on CUDA, decode-only steps replayed from graphs captured at start, padded up to
                 a captured batch size (`cuda_graphs`); `decode_sizes` pads them on CPU as well,
                 eagerly (tests)

A request whose sampling raises fails alone: the batch is sampled again row by row, each seeded
generator from where it was, so the other rows draw exactly what they would have."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lmforge.common.logging import get_logger
from lmforge.inference.cuda_graphs import DecodeGraphs, graph_sizes
from lmforge.inference.input_batch import InputBatch
from lmforge.inference.sampling import Sampled, sample_batch
from lmforge.inference.sequence import Sequence
from lmforge.model.attention_backends import (
    FALLBACK,
    AttentionBackend,
    AttentionName,
    make_attention,
    select_attention,
    verify_attention,
)
from lmforge.model.kv_cache import PagedKVCache
from lmforge.model.paged_attention import PagedBatch
from lmforge.model.transformer import GPT

log = get_logger("inference")


def is_fatal(exc: BaseException) -> bool:
    """A fault the engine cannot serve on after it: not an Exception (the thread is being torn
    down), or a device error, which leaves the CUDA context unusable for every later call (a
    device-side assert, an illegal address). Running out of memory is not one."""
    if not isinstance(exc, Exception):
        return True
    if isinstance(exc, torch.OutOfMemoryError):
        return False
    return isinstance(exc, torch.AcceleratorError) or "CUDA error" in str(exc)


@dataclass
class Executed:
    """A step's outcome: which scheduled sequences (indices) were sampled, their samples (row i
    for sampled_indices[i]), and those whose sampling raised."""

    sampled_indices: list[int]
    sampled: Sampled
    failed: list[tuple[int, Exception]]


class ModelRunner:
    def __init__(self, model: GPT, cache: PagedKVCache, *, max_running: int = 64, max_batched_tokens: int = 512,
                 attention: AttentionName = "auto", cuda_graphs: bool = True, decode_sizes: list[int] | None = None):
        self.model, self.cache = model, cache
        self.config = model.config
        parameter = next(model.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.attention = self._attention(attention)
        self.batch = InputBatch(max_running, max_batched_tokens, cache.total_blocks, cache.block_size, self.device)
        self.graphs = self._graphs(cuda_graphs, max_running, decode_sizes)

    def _attention(self, asked: AttentionName) -> AttentionBackend:
        """The backend asked for, or the first of its fallbacks that starts and agrees with gather."""
        config = self.config
        name, why = select_attention(asked, self.device, self.dtype)
        if why is not None:
            log.warning("attention_backend_fallback", asked=asked, using=name, reason=why)
        while True:
            try:
                backend = make_attention(name, self.device, config.n_head, config.kv_heads, config.head_dim,
                                         self.dtype)
            except Exception as exc:  # noqa: BLE001 - an optional kernel library that fails to start
                problem = f"{type(exc).__name__}: {exc}"
            else:
                problem = verify_attention(backend, self.device, config.n_head, config.kv_heads, config.head_dim,
                                           self.dtype, self.cache.block_size)
            if problem is None:
                log.info("attention_backend", backend=name, asked=asked, device=self.device.type)
                return backend
            log.warning("attention_backend_fallback", asked=name, using=FALLBACK[name], reason=problem)
            name = FALLBACK[name]

    def _graphs(self, enabled: bool, max_running: int, sizes: list[int] | None) -> DecodeGraphs | None:
        if self.device.type == "cuda" and enabled:
            if self.config.moe is not None:
                log.info("cuda_graphs_skipped", reason="MoE routing reads the expert loads back to the host")
                return None
            if verify_attention(self._flex(), self.device, self.config.n_head, self.config.kv_heads,
                                self.config.head_dim, self.dtype, self.cache.block_size) is not None:
                log.warning("cuda_graphs_skipped", reason="flex attention, which the graphs use, failed its check")
                return None
            graphs = DecodeGraphs(self.model, self.cache, self.batch, sizes or graph_sizes(max_running), capture=True)
            return graphs if graphs.capture_all() else None
        if sizes:  # padding without graphs (CPU tests of the padding)
            return DecodeGraphs(self.model, self.cache, self.batch, sizes, capture=False)
        return None

    def _flex(self) -> AttentionBackend:
        return make_attention("flex", self.device, self.config.n_head, self.config.kv_heads, self.config.head_dim,
                              self.dtype)

    def release(self, seq: Sequence) -> None:
        """The sequence left the engine (finished, cancelled, failed): its row is free."""
        self.batch.release(seq)

    @torch.no_grad()
    def execute(self, scheduled: list[tuple[Sequence, int]]) -> Executed:
        """Compute the scheduled tokens; sample a next token for every sequence whose tokens are
        now all computed. A forward that raises raises; a sampling that raises fails its rows."""
        step = self.batch.prepare(scheduled)
        size = self.graphs.size_for(len(scheduled)) if self.graphs and step.rows.decode_only else None
        if size is not None:
            if step.max_position >= self.config.context_length:
                raise ValueError(f"position {step.max_position} exceeds the context length "
                                 f"{self.config.context_length}")
            logits = self.graphs.run(step, size)
        else:
            batch = PagedBatch(step.positions, step.slot_mapping, self.attention.plan(step.rows), step.max_position)
            logits = self.model.forward_paged(step.tokens, self.cache, batch, step.logits_index)
        sampling = step.sampled
        rows, sampled, failed = self._sample(logits, [scheduled[index][0] for index in sampling])
        return Executed([sampling[row] for row in rows], sampled, [(sampling[row], exc) for row, exc in failed])

    @staticmethod
    def _sample(logits: torch.Tensor, seqs: list[Sequence]) -> tuple[list[int], Sampled, list[tuple[int, Exception]]]:
        """(rows sampled, their samples, rows whose sampling raised)."""
        params, generators = [s.params for s in seqs], [s.generator for s in seqs]
        # Only a seeded generator's draws can be seen to change: the others need no snapshot.
        states = [g.get_state() if g is not None and p.seed is not None else None
                  for p, g in zip(params, generators, strict=True)]
        try:
            return list(range(len(seqs))), sample_batch(logits, params, generators), []
        except Exception as exc:
            if is_fatal(exc):
                raise
        rows, sampled, failed = [], Sampled([]), []
        for row, (p, generator, state) in enumerate(zip(params, generators, states, strict=True)):
            if state is not None:
                generator.set_state(state)
            try:
                one = sample_batch(logits[row:row + 1], [p], [generator])
            except Exception as exc:  # noqa: BLE001 - this row's request fails, the others go on
                if is_fatal(exc):
                    raise
                failed.append((row, exc))
                continue
            rows.append(row)
            sampled.tokens += one.tokens
            sampled.logprobs += one.logprobs
            sampled.top_logprobs += one.top_logprobs
        return rows, sampled, failed

    @torch.no_grad()
    def prompt_logprobs(self, tokens: list[int], top: int) -> tuple[list[float], list[dict[int, float]]]:
        """For each token after the first: its logprob given the ones before it and, with `top`,
        the `top` most likely tokens' logprobs there (teacher forcing, no cache)."""
        ids = torch.tensor([tokens], device=self.device)
        logits, _ = self.model(ids)
        logprobs = torch.log_softmax(logits[0, :-1].float(), dim=-1)
        chosen = logprobs.gather(1, ids[0, 1:, None]).squeeze(1).tolist()
        if not top:
            return chosen, []
        values, indices = torch.topk(logprobs, top, dim=-1)
        return chosen, [dict(zip(i, v, strict=True)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)]
