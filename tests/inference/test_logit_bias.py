"""logit_bias in the batch sampler: added to its row's logits before anything else (greedy and
sampled), the other rows exactly as without it, a seeded row the same alone or in any batch,
and the logprobs reported the model's own."""

from __future__ import annotations

import pytest
import torch

from lmforge.inference.sampling import SamplingParams, sample_batch

VOCAB = 50


def logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def sample(rows: torch.Tensor, params: list[SamplingParams]):
    return sample_batch(rows, params, [p.generator() for p in params])


def test_a_bias_moves_greedy_and_sampled_choices():
    row = logits(1)
    top = int(row.argmax())
    other = int(row.argmin())
    assert sample(row, [SamplingParams(temperature=0, logit_bias=((other, 100),))]).tokens == [other]
    banned = sample(row, [SamplingParams(temperature=0, logit_bias=((top, -100),))]).tokens
    assert banned == [int(row[0].topk(2).indices[1])]  # the next most likely
    for seed in range(20):
        assert sample(row, [SamplingParams(temperature=1.0, seed=seed, logit_bias=((other, 100),))]).tokens == [other]
        drawn = sample(row, [SamplingParams(temperature=2.0, top_p=0.9, top_k=5, seed=seed,
                                            logit_bias=((top, -100),))]).tokens
        assert drawn != [top]


def test_other_rows_and_seeded_rows_do_not_depend_on_the_batch():
    rows = logits(6, seed=1)
    plain = [SamplingParams(temperature=0), SamplingParams(temperature=1.3, seed=4),
             SamplingParams(temperature=0.8, top_k=7, seed=9, logprobs=3)]
    biased = [SamplingParams(temperature=0, logit_bias=((3, 40), (7, -100))),
              SamplingParams(temperature=1.0, seed=11, logit_bias=((int(rows[4].argmin()), 9.5),)),
              SamplingParams(temperature=0.9, top_p=0.8, seed=2, logit_bias=((1, 5), (2, 5)), logprobs=2)]
    without = sample(rows[:3], plain)
    mixed = sample(rows, plain + biased)
    assert mixed.tokens[:3] == without.tokens
    assert mixed.logprobs[2] == without.logprobs[2] and mixed.top_logprobs[2] == without.top_logprobs[2]
    for i, params in enumerate(biased):  # each biased row alone, and in another order
        alone = sample(rows[3 + i:4 + i], [params])
        assert alone.tokens == [mixed.tokens[3 + i]]
    reordered = sample(rows[[5, 0, 4, 3]], [biased[2], plain[0], biased[1], biased[0]])
    assert reordered.tokens == [mixed.tokens[5], mixed.tokens[0], mixed.tokens[4], mixed.tokens[3]]


def test_the_reported_logprobs_are_the_models_own():
    row = logits(1, seed=2)
    other = int(row.argmin())
    sampled = sample(row, [SamplingParams(temperature=0, logprobs=2, logit_bias=((other, 100),))])
    own = torch.log_softmax(row[0], dim=-1)
    assert sampled.tokens == [other] and sampled.logprobs[0] == pytest.approx(float(own[other]))
    assert set(sampled.top_logprobs[0]) == set(own.topk(2).indices.tolist())


@pytest.mark.parametrize("bias", [((3, 100.5),), ((3, -101),), ((-1, 1),)])
def test_sampling_params_refuse_a_bias_out_of_range(bias):
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=bias)
