"""A fault in one request's step fails that request only: it is logged with its request id, its
client gets an error (a 500, or an error event in a stream), its KV blocks are freed, and the
engine serves the others on, their seeded outputs unchanged. A fault the engine cannot serve on
breaks the engine: logged once with its traceback, and /healthz fails so the pod is restarted.

The service tests run the engine in a thread of the test process (`engine_layout: thread`, the
same engine core and messages as its own process), so that a fault can be injected into it;
tests/inference/test_engine_process.py covers the engine's own process."""

from __future__ import annotations

import io
import json
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

from lmforge.common.logging import JsonLineFormatter
from lmforge.inference import model_runner
from lmforge.inference.config import ServeConfig
from lmforge.inference.engine import Engine
from lmforge.inference.engine_core import HEARTBEAT_SECONDS
from lmforge.inference.sampling import SamplingParams
from lmforge.inference.scheduler import Scheduler
from lmforge.inference.service import InferenceService
from lmforge.model.config import GPTConfig
from lmforge.model.transformer import GPT
from tests.serving import in_process_server

BAD_SEED = 666  # the request whose sampling raises
OTHERS = [("The quick brown", 1), ("Bees make", 2), ("The capital of", 3)]


@pytest.fixture
def logged():
    """The JSON log lines of one event written meanwhile."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLineFormatter())
    logger = logging.getLogger("lmforge")
    logger.addHandler(handler)
    yield lambda event: [line for line in map(json.loads, stream.getvalue().splitlines()) if line["event"] == event]
    logger.removeHandler(handler)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig.preset("tiny", n_layer=1, n_embd=32, n_head=2, vocab_size=53, context_length=64)).eval()


def fault_sampling_of(seed: int, monkeypatch, after_draw: bool = True) -> list[list[int | None]]:
    """Make the batch sampling raise whenever `seed`'s row is in it (after every row drew its
    number from its generator, or before); returns the seeds of each batch sampled."""
    real = model_runner.sample_batch
    batches = []

    def sample(logits, params, generators):
        batches.append([p.seed for p in params])
        drawn = real(logits, params, generators) if after_draw else None
        if any(p.seed == seed for p in params):
            raise RuntimeError("injected sampling fault")
        return drawn if drawn is not None else real(logits, params, generators)

    monkeypatch.setattr(model_runner, "sample_batch", sample)
    return batches


def run(engine: Engine, requests: list[tuple[list[int], SamplingParams, str]]) -> list:
    seqs = [engine.add(prompt, params, request_id) for prompt, params, request_id in requests]
    while engine.has_work():
        engine.step()
    return seqs


@pytest.mark.parametrize("after_draw", [True, False], ids=["after-draw", "before-draw"])
def test_a_sampling_fault_fails_its_sequence_alone_and_the_others_draw_as_without_it(model, monkeypatch, logged,
                                                                                     after_draw):
    others = [([1, 2, 3], SamplingParams(max_tokens=8, temperature=1.0, seed=1), "cmpl-a"),
              ([4, 5], SamplingParams(max_tokens=8, temperature=1.0, top_k=5, seed=2), "cmpl-b"),
              ([6], SamplingParams(max_tokens=8, temperature=0), "cmpl-c")]
    expected = [seq.output for seq in run(Engine(model), others)]
    batches = fault_sampling_of(BAD_SEED, monkeypatch, after_draw)
    engine = Engine(model)
    *good, bad = run(engine, [*others, ([7, 8], SamplingParams(max_tokens=8, temperature=1.0, seed=BAD_SEED),
                                        "cmpl-bad")])
    assert [len(seeds) for seeds in batches if BAD_SEED in seeds][0] == 4  # it failed beside the others
    assert [seq.output for seq in good] == expected and all(seq.finish_reason == "length" for seq in good)
    assert bad.finish_reason == "error" and str(bad.error) == "injected sampling fault" and bad.output == []
    assert engine.running == [] and engine.blocks.num_used == 0
    [line] = logged("sequence_failed")
    assert line["request_id"] == "cmpl-bad" and line["level"] == "error"
    assert "Traceback" in line["exception"] and "injected sampling fault" in line["exception"]


def test_a_forward_fault_fails_the_steps_sequences_and_the_engine_serves_on(model, monkeypatch, logged):
    engine = Engine(model)
    real = engine.model.forward_paged
    fault: list[BaseException] = [torch.OutOfMemoryError("injected: out of memory")]

    def forward_paged(*args, **kwargs):
        if fault:
            raise fault.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward_paged", forward_paged)
    failed = [engine.add([1, 2], SamplingParams(max_tokens=4, temperature=0), f"cmpl-{i}") for i in range(2)]
    assert engine.step() == [(seq, None) for seq in failed]
    assert all(seq.finish_reason == "error" for seq in failed) and engine.blocks.num_used == 0
    assert sorted(line["request_id"] for line in logged("sequence_failed")) == ["cmpl-0", "cmpl-1"]
    [later] = run(engine, [([1, 2], SamplingParams(max_tokens=4, temperature=0), "cmpl-later")])
    assert later.finish_reason == "length" and len(later.output) == 4

    # A device error leaves the device unusable for every later step: it is not the request's.
    fault.append(torch.AcceleratorError("CUDA error: an illegal memory access was encountered"))
    engine.add([3], SamplingParams(max_tokens=2, temperature=0))
    with pytest.raises(torch.AcceleratorError):
        engine.step()


@pytest.fixture
def service(tiny_package):
    service = InferenceService(ServeConfig(model=str(tiny_package), engine_layout="thread"))
    service.load()
    return service


def stream(url: str, prompt: str, seed: int) -> tuple[str, str | None, dict | None]:
    """(text, finish reason, error event) of a streamed completion."""
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 1.0, "seed": seed, "stream": True}
    text, finish, error = "", None, None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if "error" in event:
                error = event["error"]
                continue
            text += event["choices"][0]["text"]
            finish = event["choices"][0]["finish_reason"] or finish
    return text, finish, error


def test_a_request_whose_sampling_fails_gets_an_error_while_the_others_stream_on(service, monkeypatch, logged):
    with in_process_server(service) as url:
        expected = [stream(url, prompt, seed) for prompt, seed in OTHERS]
        assert all(text and finish in ("length", "stop") and error is None for text, finish, error in expected)
        engine = service.model.engine
        # The others wait in their first sampling until the faulty request is queued: they share its step.
        others_queued, bad_queued = threading.Semaphore(0), threading.Event()
        real_submit = engine.submit

        def submit(prompt, params, request_id=None):
            handle = real_submit(prompt, params, request_id)
            (bad_queued.set if params.seed == BAD_SEED else others_queued.release)()
            return handle

        monkeypatch.setattr(engine, "submit", submit)
        batches = fault_sampling_of(BAD_SEED, monkeypatch)
        real_sample = model_runner.sample_batch

        def gated_sample(logits, params, generators):
            bad_queued.wait(timeout=60)
            return real_sample(logits, params, generators)

        monkeypatch.setattr(model_runner, "sample_batch", gated_sample)
        with ThreadPoolExecutor(len(OTHERS) + 1) as pool:
            others = [pool.submit(stream, url, prompt, seed) for prompt, seed in OTHERS]
            assert all(others_queued.acquire(timeout=60) for _ in OTHERS)
            bad_stream = pool.submit(stream, url, "The quick brown", BAD_SEED)
            bad_whole = httpx.post(f"{url}/v1/completions", json={"prompt": "Bees make", "max_tokens": 12,
                                                                  "temperature": 1.0, "seed": BAD_SEED}, timeout=60)
            assert [future.result() for future in others] == expected
            bad_text, bad_finish, bad_error = bad_stream.result()
        assert any(BAD_SEED in seeds and len(seeds) > 1 for seeds in batches)

        assert bad_text == "" and bad_finish is None and "internal error" in bad_error["message"]
        assert bad_error["type"] == "server_error"
        assert bad_whole.status_code == 500 and bad_whole.json()["error"]["type"] == "server_error"
        failed_ids = {re.search(r"request id (\S+)\)", message).group(1)
                      for message in (bad_error["message"], bad_whole.json()["error"]["message"])}
        lines = logged("sequence_failed")
        assert {line["request_id"] for line in lines} == failed_ids and len(failed_ids) == 2
        assert all("injected sampling fault" in line["exception"] for line in lines)

        assert httpx.get(f"{url}/readyz").status_code == 200 and httpx.get(f"{url}/healthz").status_code == 200
        assert stream(url, *OTHERS[0]) == expected[0]  # and it serves later requests
        time.sleep(2 * HEARTBEAT_SECONDS)  # the engine's counters as of its next heartbeat
        assert engine.counts() == (0, 0) and engine.stats().kv_blocks_in_use == 0


def test_a_broken_engine_fails_healthz_and_is_logged_once_with_its_traceback(service, monkeypatch, logged):
    with in_process_server(service) as url:
        assert httpx.get(f"{url}/healthz").status_code == 200

        def schedule(self):
            raise RuntimeError("injected scheduler fault")

        monkeypatch.setattr(Scheduler, "schedule", schedule)
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "The", "max_tokens": 3}).status_code == 503
        health = httpx.get(f"{url}/healthz")
        assert health.status_code == 503 and "injected scheduler fault" in health.json()["reason"]
        assert httpx.get(f"{url}/readyz").status_code == 503
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "The", "max_tokens": 3}).status_code == 503
        assert httpx.get(f"{url}/healthz").status_code == 503
    [line] = logged("engine_failed")
    assert line["level"] == "error" and line["kind"] == "RuntimeError"
    assert "Traceback" in line["exception"] and "injected scheduler fault" in line["exception"]
