"""Next-token sampling for a whole step's batch on the model's device: logit bias, then greedy
(temperature 0), temperature, top-k and nucleus (top-p), reproducible per request.

Logit bias (OpenAI's `logit_bias`): values added to chosen tokens' logits before anything else,
as OpenAI and vLLM apply it (+100 all but forces a token, -100 all but bans it). The logprobs
reported are the model's own, before bias and temperature, as vLLM's default (raw) reports them.

Reproducibility: each request has its own seeded torch.Generator (on the CPU) and draws exactly
one uniform number from it per generated token; the token is where that number falls in the
cumulative distribution of the (filtered) probabilities in vocabulary order (inverse-CDF
sampling). So a request's k-th token depends on its seed and its own logits only, not on which
other requests share the batch or in which row it sits; the rest is batched tensor work. Logits
themselves can differ in the last bits between batch compositions on some kernels; a uniform
falling exactly on such a boundary is the only way a seeded output can change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

MAX_BIAS = 100  # a logit bias's largest magnitude (OpenAI's)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None  # None: none; k: the chosen token's logprob and the top k
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, value added to its logit)

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0: off)")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError("logprobs must be >= 0")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise ValueError("seed must be in [0, 2**64)")
        if any(token < 0 or not -MAX_BIAS <= bias <= MAX_BIAS for token, bias in self.logit_bias):
            raise ValueError(f"logit_bias: token ids >= 0, values in [-{MAX_BIAS}, {MAX_BIAS}]")

    def generator(self) -> torch.Generator | None:
        if self.temperature == 0:
            return None
        generator = torch.Generator()
        if self.seed is None:
            generator.seed()
        else:
            generator.manual_seed(self.seed)
        return generator


@dataclass
class Sampled:
    tokens: list[int]
    logprobs: list[float | None] = field(default_factory=list)  # per row: the chosen token's, if asked for
    top_logprobs: list[dict[int, float] | None] = field(default_factory=list)


def sample_batch(logits: torch.Tensor, params: list[SamplingParams],
                 generators: list[torch.Generator | None]) -> Sampled:
    """One token per row of logits (rows, vocab), row i sampled by params[i] with generators[i]."""
    logits = logits.float()
    biased = _biased(logits, params)
    sampled_rows = [row for row, p in enumerate(params) if p.temperature > 0]
    if len(sampled_rows) == len(params):
        tokens = _draw(biased, params, generators)
    else:
        tokens = biased.argmax(dim=-1)
        if sampled_rows:
            tokens[sampled_rows] = _draw(biased[sampled_rows], [params[row] for row in sampled_rows],
                                         [generators[row] for row in sampled_rows])
    result = Sampled(tokens.tolist())  # the step's one device-to-host copy (with the logprobs below)
    wanted = [row for row, p in enumerate(params) if p.logprobs is not None]
    result.logprobs = [None] * len(params)
    result.top_logprobs = [None] * len(params)
    if wanted:
        logprobs = torch.log_softmax(logits[wanted], dim=-1)
        chosen = logprobs.gather(1, tokens[wanted, None]).squeeze(1).tolist()
        top = max(params[row].logprobs for row in wanted)
        values, indices = (logprobs.topk(top, dim=-1) if top else (None, None))
        for i, row in enumerate(wanted):
            result.logprobs[row] = chosen[i]
            k = params[row].logprobs
            if k:
                result.top_logprobs[row] = dict(zip(indices[i, :k].tolist(), values[i, :k].tolist(), strict=True))
    return result


def _biased(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The logits with each row's logit_bias added (one scatter-add for the batch); the logits
    themselves, untouched, when no row has a bias."""
    entries = [(row, token, bias) for row, p in enumerate(params) for token, bias in p.logit_bias]
    if not entries:
        return logits
    rows, tokens, biases = zip(*entries, strict=True)
    index = torch.tensor([rows, tokens], dtype=torch.long).to(logits.device, non_blocking=True)
    values = torch.tensor(biases, dtype=logits.dtype).to(logits.device, non_blocking=True)
    return logits.index_put((index[0], index[1]), values, accumulate=True)


def _draw(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]) -> torch.Tensor:
    device = logits.device
    temperature = torch.tensor([p.temperature for p in params], device=device)
    probs = torch.softmax(logits / temperature[:, None], dim=-1)
    if any(p.top_p < 1 or p.top_k for p in params):
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        rank = torch.arange(probs.shape[1], device=device)
        top_k = torch.tensor([p.top_k or probs.shape[1] for p in params], device=device)
        top_p = torch.tensor([p.top_p for p in params], device=device)
        # The token crossing p is kept (so is the most likely one, always).
        outside = (rank[None] >= top_k[:, None]) | (sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p[:, None])
        probs = torch.zeros_like(probs).scatter_(1, order, sorted_probs.masked_fill(outside, 0))
    # One uniform per row from the row's own generator, not torch.multinomial (one exponential per
    # vocabulary entry, and one generator for the whole batch).
    uniform = torch.tensor([float(torch.rand((), generator=g, dtype=torch.float64)) for g in generators],
                           dtype=torch.float32).to(device, non_blocking=True)
    # In place, in float32: at 16 rows of 8k a float64 copy and cumsum took 6x as long on CPU;
    # float32's rounding moves a boundary by far less than any token's own probability.
    cdf = probs.cumsum_(dim=-1)
    drawn = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True)
    return drawn.squeeze(1).clamp_(max=probs.shape[1] - 1)
