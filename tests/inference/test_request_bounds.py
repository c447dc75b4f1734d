"""Every numeric request field has a bound the engine can represent, checked before the request
reaches it: a value past it (2**63 as top_k once stopped the engine for good) is a 400 naming
the field, streamed or not, and the server goes on serving."""

from __future__ import annotations

import httpx
import pytest

GOOD = {"prompt": "The sun", "max_tokens": 3, "temperature": 0}
VOCAB = 320  # the tiny tokenizer's


def post(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json=body, timeout=30)


@pytest.mark.parametrize("fields, names", [
    ({"top_k": 2**63}, "top_k"),
    ({"top_k": VOCAB + 1}, f"top_k: at most the vocabulary's {VOCAB} tokens"),
    ({"seed": 2**63}, "seed"),
    ({"seed": -2**63 - 1}, "seed"),
    ({"max_tokens": 2**64}, "max_tokens"),
    ({"n": 2**63}, "n"),
    ({"best_of": 2**63}, "best_of"),
    ({"logprobs": 2**63}, "logprobs"),
    ({"temperature": 1e308}, "temperature"),
    ({"frequency_penalty": 2**63}, "frequency_penalty"),
    ({"presence_penalty": -3}, "presence_penalty"),
    ({"logit_bias": {"5": 101}}, "logit_bias.5"),
    ({"logit_bias": {"5": -1e300}}, "logit_bias.5"),
    ({"logit_bias": {str(VOCAB): 1}}, f"logit_bias: token id {VOCAB} is outside the vocabulary"),
    ({"logit_bias": {str(2**63): 1}}, "logit_bias: token id"),
    ({"logit_bias": {"9" * 30: 1}}, "logit_bias: Value error, keys are token ids"),
    ({"logit_bias": {"-1": 1}}, "keys are token ids"),
    ({"logit_bias": {"05": 1}}, "keys are token ids"),
    ({"logit_bias": {"١": 1}}, "keys are token ids"),  # a decimal digit to Python's int(), not a token id
    ({"logit_bias": {"5": True}}, "logit_bias.5"),
    ({"prompt": [5, 2**64]}, "prompt: token id 18446744073709551616 is outside the vocabulary"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_a_value_past_its_bound_is_a_400_naming_it(server, fields, names, stream):
    url, _ = server
    response = post(url, {**GOOD, **fields, "stream": stream})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert names in error["message"] and error["type"] == "invalid_request_error" and error["code"] is None


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_a_logit_bias_that_is_not_finite_is_refused(server, literal):
    url, _ = server
    content = f'{{"prompt": "The sun", "max_tokens": 3, "logit_bias": {{"5": {literal}}}}}'
    response = httpx.post(f"{url}/v1/completions", content=content, headers={"content-type": "application/json"},
                          timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "logit_bias.5", response.text


def test_the_bounds_themselves_are_served_and_the_engine_keeps_serving(server):
    url, _ = server
    greedy = post(url, GOOD).json()["choices"][0]["text"]
    assert post(url, {**GOOD, "top_k": 2**63}).status_code == 400  # the request that stopped the engine
    at_bounds = {"top_k": VOCAB, "seed": 2**63 - 1, "logit_bias": {str(VOCAB - 1): -100, "0": 100}}
    for fields in (at_bounds, {**at_bounds, "seed": -2**63, "n": 2}, {"max_tokens": 1, "logprobs": 5}):
        response = post(url, {**GOOD, **fields, "temperature": 0.7})
        assert response.status_code == 200, response.text
    sampled = {**GOOD, "temperature": 1, "seed": 5, "max_tokens": 8}
    assert post(url, {**sampled, "top_k": VOCAB}).json()["choices"][0]["text"] == post(
        url, sampled).json()["choices"][0]["text"]  # top_k of the whole vocabulary: no top-k
    assert httpx.get(f"{url}/readyz").status_code == 200
    assert post(url, GOOD).json()["choices"][0]["text"] == greedy
