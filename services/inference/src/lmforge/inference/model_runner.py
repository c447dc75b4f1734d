"""The model runner (vLLM's split): the only part of the engine that touches tensors. It packs a
scheduled step's new tokens into one forward over the paged KV cache, samples the whole batch on
the device, and computes teacher-forced logprobs for scoring and echoed prompts."""

from __future__ import annotations

import torch

from lmforge.common.model import GPT, PagedKVCache
from lmforge.common.paged_attention import ScheduledChunk, build_paged_batch
from lmforge.inference.sampling import Sampled, sample_batch
from lmforge.inference.sequence import Sequence


class ModelRunner:
    def __init__(self, model: GPT, cache: PagedKVCache):
        self.model, self.cache = model, cache
        self.config = model.config
        self.device = next(model.parameters()).device

    @torch.no_grad()
    def execute(self, scheduled: list[tuple[Sequence, int]]) -> tuple[list[int], Sampled]:
        """Compute the scheduled tokens; sample a next token for every sequence whose tokens are
        now all computed. Returns the indices (into `scheduled`) of those and their samples."""
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
        seqs = [scheduled[index][0] for index in sampling]
        return sampling, sample_batch(logits, [s.params for s in seqs], [s.generator for s in seqs])

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
