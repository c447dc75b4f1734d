"""Every kind of bad request gets a clear 4xx naming the problem, never a stack trace, and
the server keeps serving everyone else. Invalid fields are a 400, as OpenAI and vLLM answer
(the openai client's BadRequestError), and `code` is a string or null, never the status."""

from __future__ import annotations

import json

import httpx
import pytest

GOOD = {"prompt": "The sun", "max_tokens": 4, "temperature": 0}


def post(url: str, body=None, **kwargs) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json=body, timeout=30, **kwargs)


@pytest.mark.parametrize("body, status, names", [
    ({**GOOD, "prompt": "word " * 90}, 400, "prompt"),  # does not fit the 96-token context
    ({**GOOD, "max_tokens": 95}, 400, "context"),  # prompt + max_tokens > context
    ({**GOOD, "max_tokens": 0}, 400, "max_tokens"),
    ({**GOOD, "max_tokens": 5000}, 400, "max_tokens"),  # above max_tokens_limit
    ({**GOOD, "max_tokens": "many"}, 400, "max_tokens"),
    # No value changes type on the way in: a boolean is not 1, a string is not a number.
    ({**GOOD, "max_tokens": True}, 400, "max_tokens"),
    ({**GOOD, "max_tokens": "8"}, 400, "max_tokens"),
    ({**GOOD, "seed": True}, 400, "seed"),
    ({**GOOD, "logprobs": True}, 400, "logprobs"),
    ({**GOOD, "temperature": True}, 400, "temperature"),
    ({**GOOD, "top_p": True}, 400, "top_p"),
    ({**GOOD, "stream": 1}, 400, "stream"),
    ({**GOOD, "temperature": -0.5}, 400, "temperature"),
    ({**GOOD, "temperature": 9}, 400, "temperature"),
    ({**GOOD, "top_p": 0}, 400, "top_p"),
    ({**GOOD, "top_p": 1.5}, 400, "top_p"),
    ({**GOOD, "logprobs": 50}, 400, "logprobs"),
    ({**GOOD, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({**GOOD, "frequency_penaltie": 1}, 400, "frequency_penaltie"),  # unknown field
    ({**GOOD, "frequency_penalty": 1}, 400, "frequency_penalty"),  # a known field at a value not implemented
    ({**GOOD, "suffix": "and so on"}, 400, "suffix"),
    ({**GOOD, "best_of": 3}, 400, "best_of"),
    ({**GOOD, "stream_options": {"include_usage": True}}, 400, "stream_options"),  # without stream
    ({**GOOD, "prompt": [5, 99999]}, 400, "prompt: token id 99999"),
    ({**GOOD, "prompt": [[5], [-1]]}, 400, "prompt: token id -1"),
    ({**GOOD, "prompt": ["a", 5]}, 400, "prompt"),
    ({**GOOD, "prompt": []}, 400, "prompt"),
    ({**GOOD, "n": 0}, 400, "n"),
    ({**GOOD, "prompt": ""}, 400, "prompt"),
    ({"max_tokens": 3}, 400, "prompt"),  # missing
    ({**GOOD, "model": "gpt-17"}, 404, "gpt-17"),
    ([1, 2, 3], 400, "body"),
])
def test_invalid_requests_are_refused_with_a_message(server, body, status, names):
    url, _ = server
    response = post(url, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert names in error["message"] and error["code"] == ("model_not_found" if status == 404 else None)
    assert "Traceback" not in response.text


@pytest.mark.parametrize("field, literal", [("temperature", "NaN"), ("temperature", "Infinity"), ("top_p", "NaN")])
def test_a_number_that_is_not_finite_is_refused_as_such(server, field, literal):
    url, _ = server
    content = f'{{"prompt": "The sun", "max_tokens": 4, "{field}": {literal}}}'  # Python's json reads these
    response = httpx.post(f"{url}/v1/completions", content=content, headers={"content-type": "application/json"},
                          timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == f"{field}: Input should be a finite number"


@pytest.mark.parametrize("path, content, param", [
    ("completions", '{"prompt": "The \\ud800 sun", "max_tokens": 2}', "prompt"),
    ("completions", '{"prompt": ["ok", "\\udfff"], "max_tokens": 2}', "prompt"),
    ("completions", '{"prompt": "The sun", "max_tokens": 2, "echo": true, "stop": ["\\ud800"]}', "stop"),
    ("score", '{"text": "a \\ud83d b"}', "text"),
])
def test_a_lone_surrogate_is_not_text(server, path, content, param):
    url, _ = server
    response = httpx.post(f"{url}/v1/{path}", content=content, headers={"content-type": "application/json"},
                          timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"].split(".")[0] == param and "lone surrogate" in error["message"], error


def test_non_json_and_oversized_bodies(server):
    url, _ = server
    broken = httpx.post(f"{url}/v1/completions", content=b'{"prompt": "x", ', timeout=10,
                        headers={"content-type": "application/json"})
    assert broken.status_code == 400 and "JSON" in broken.json()["error"]["message"]
    huge = {**GOOD, "prompt": "x" * (2 << 20)}
    too_big = post(url, huge)
    assert too_big.status_code == 413 and "larger than" in too_big.json()["error"]["message"]

    def chunks():  # no Content-Length: the limit holds as the body streams in
        data = json.dumps(huge).encode()
        for i in range(0, len(data), 65536):
            yield data[i:i + 65536]

    streamed = httpx.post(f"{url}/v1/completions", content=chunks(), timeout=30,
                          headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    score = httpx.post(f"{url}/v1/score", json={"text": "a"}, timeout=10)
    assert score.status_code == 400 and "text" in score.json()["error"]["message"]


def test_the_server_keeps_serving_after_bad_requests(server):
    url, _ = server
    for bad in ({**GOOD, "top_p": 7}, {**GOOD, "prompt": "word " * 200}):
        assert post(url, bad).status_code == 400
    response = post(url, GOOD)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4
    assert httpx.get(f"{url}/readyz").status_code == 200
