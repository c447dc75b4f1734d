"""The model runner (vLLM's split): the only part of the engine that touches tensors. It packs a
scheduled step's new tokens into one forward over the paged KV cache, samples the whole batch on
the device, and computes teacher-forced logprobs for scoring and echoed prompts.

A request whose sampling raises fails alone: the batch is sampled again row by row, each seeded
generator from where it was, so the other rows draw exactly what they would have."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lmforge.inference.sampling import Sampled, sample_batch
from lmforge.inference.sequence import Sequence
from lmforge.model.kv_cache import PagedKVCache
from lmforge.model.paged_attention import ScheduledChunk, build_paged_batch
from lmforge.model.transformer import GPT


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
    def __init__(self, model: GPT, cache: PagedKVCache):
        self.model, self.cache = model, cache
        self.config = model.config
        self.device = next(model.parameters()).device

    @torch.no_grad()
    def execute(self, scheduled: list[tuple[Sequence, int]]) -> Executed:
        """Compute the scheduled tokens; sample a next token for every sequence whose tokens are
        now all computed. A forward that raises raises; a sampling that raises fails its rows."""
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
