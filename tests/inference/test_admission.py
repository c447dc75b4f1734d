"""Admission control and client lifetimes: a full waiting queue answers 429 with Retry-After;
a client that goes away has its sequence cancelled and its KV blocks freed; API keys."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from lmforge.common.errors import ConfigError
from lmforge.inference.auth import ApiKeys
from tests.inference.metrics_text import sample_value
from tests.serving import running_server


@pytest.fixture(scope="module")
def slow_server(tiny_package, tmp_path_factory):
    """One running sequence, one waiting place, 100 ms per engine step: easy to fill, slow to finish."""
    log = tmp_path_factory.mktemp("slow") / "serve.log"
    with running_server(tiny_package, "engine.max_running=1", "engine.max_waiting=1",
                        "engine.step_delay_seconds=0.1", "retry_after_seconds=3", log_path=log) as url:
        yield url


def metric(url: str, name: str, **labels) -> float:
    return sample_value(httpx.get(f"{url}/metrics").text, name, labels)


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_a_full_queue_answers_429_with_retry_after(slow_server):
    async def run():
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"prompt": "A week", "max_tokens": 30, "temperature": 0}
            return await asyncio.gather(*(client.post(f"{slow_server}/v1/completions", json=body) for _ in range(6)))

    responses = asyncio.run(run())
    codes = sorted(r.status_code for r in responses)
    assert 200 in codes and 429 in codes and set(codes) <= {200, 429}
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.headers["retry-after"] == "3" and "busy" in refused.json()["error"]["message"]
    assert metric(slow_server, "lmforge_inference_requests_total", status="429") == codes.count(429)


def test_a_client_that_disconnects_frees_its_kv_blocks(slow_server):
    before = metric(slow_server, "lmforge_inference_finished_requests_total", finish_reason="cancelled")
    body = {"prompt": "The train", "max_tokens": 80, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{slow_server}/v1/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        assert metric(slow_server, "lmforge_inference_kv_cache_usage_ratio") > 0  # its KV blocks
        assert metric(slow_server, "lmforge_inference_requests_running") == 1
    # closed after one chunk of 80: the engine must drop the sequence long before it would end
    wait_for(lambda: metric(slow_server, "lmforge_inference_kv_cache_usage_ratio") == 0.0, timeout=1.0)
    assert metric(slow_server, "lmforge_inference_requests_running") == 0
    assert metric(slow_server, "lmforge_inference_finished_requests_total", finish_reason="cancelled") == before + 1

    with pytest.raises(httpx.ReadTimeout):  # a non-streaming client that gives up
        httpx.post(f"{slow_server}/v1/completions", json={**body, "stream": False}, timeout=0.3)
    wait_for(lambda: metric(slow_server, "lmforge_inference_kv_cache_usage_ratio") == 0.0, timeout=1.0)
    assert metric(slow_server, "lmforge_inference_finished_requests_total", finish_reason="cancelled") == before + 2
    ok = httpx.post(f"{slow_server}/v1/completions", json={"prompt": "Bees", "max_tokens": 3}, timeout=30)
    assert ok.status_code == 200


def test_api_keys_from_a_file_with_rotation(tiny_package, tmp_path):
    keys = tmp_path / "api-keys"
    keys.write_text("# mounted from a Secret\n  # an indented comment\n \t \nkey-one\n\tkey-two  \n")
    with running_server(tiny_package, f"api_keys_file={keys}") as url:
        body = {"prompt": "Bees", "max_tokens": 2}

        def status(**headers):
            return httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=30).status_code

        missing = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        assert "API key" in missing.json()["error"]["message"]
        assert status(authorization="Bearer key-three") == 401
        assert status(authorization="Basic key-one") == 401
        assert status(authorization="Bearer key-two") == 200
        assert status(authorization="Bearer # an indented comment") == 401  # comments are never keys
        assert httpx.get(f"{url}/v1/models", headers={"authorization": "Bearer key-one"}).status_code == 200
        assert httpx.get(f"{url}/v1/models").status_code == 401
        for open_path in ("/healthz", "/readyz", "/metrics"):
            assert httpx.get(f"{url}{open_path}").status_code == 200
        keys.write_text("key-rotated\n")  # the Secret changed under the running pod
        assert status(authorization="Bearer key-one") == 401
        assert status(authorization="Bearer key-rotated") == 200


def test_a_keys_file_of_comments_and_blank_lines_holds_no_keys(tmp_path):
    keys = tmp_path / "api-keys"
    keys.write_text("# keys go here\n   # indented: still a comment\n\t\n  \n")
    with pytest.raises(ConfigError, match="holds no keys"):
        ApiKeys(keys)
