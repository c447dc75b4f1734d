"""Completions over HTTP against a real lmforge-serve: the memorized continuations, SSE
streaming that adds up to the same text, greedy output equal to the full-recompute oracle
while requests join and leave the batch, many concurrent clients, seeded sampling."""

from __future__ import annotations

import asyncio
import json

import httpx
import torch

from lmforge.inference.text import Codec
from lmforge.model.package import load_package
from tests.serving import SENTENCES


def complete(url: str, **body) -> dict:
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def stream_events(url: str, **body) -> list:
    events = []
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line:
                assert line.startswith("data: ")
                payload = line[len("data: "):]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


@torch.no_grad()
def oracle_greedy(model, codec: Codec, prompt: str, max_tokens: int) -> str:
    """Plain full-recompute greedy decoding: the whole sequence through the model per token."""
    ids = codec.encode(prompt)
    out = []
    for _ in range(max_tokens):
        logits, _ = model(torch.tensor([ids + out]))
        token = int(torch.argmax(logits[0, -1]))
        out.append(token)
        if token == codec.eos_id:
            break
    return codec.decode(out)


def test_the_model_continues_what_it_learned(server):
    url, _ = server
    models = httpx.get(f"{url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny-v1"] and models["data"][0]["max_model_len"] == 96
    for sentence in SENTENCES[:3] + SENTENCES[8:9]:
        words = sentence.split()
        prompt, rest = " ".join(words[:3]), " " + " ".join(words[3:])
        body = complete(url, model="tiny-v1", prompt=prompt, max_tokens=40, temperature=0)
        choice = body["choices"][0]
        assert choice["text"] == rest and choice["finish_reason"] == "stop"  # ended by <|endoftext|>
        usage = body["usage"]
        assert usage["prompt_tokens"] > 0
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"


def test_stop_strings_and_length(server):
    url, _ = server
    stopped = complete(url, prompt="The capital of", max_tokens=40, temperature=0, stop=[", and"])
    assert stopped["choices"][0] == {"index": 0, "text": " France is Paris", "logprobs": None, "finish_reason": "stop"}
    cut = complete(url, prompt="The capital of", max_tokens=3, temperature=0)
    assert cut["choices"][0]["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 3


def test_streaming_adds_up_to_the_same_text_and_ends_with_done(server):
    url, _ = server
    body = dict(prompt="Grüße aus", max_tokens=60, temperature=0, logprobs=2)
    whole = complete(url, **body)["choices"][0]
    events = stream_events(url, **body)
    assert events[-1] == "[DONE]"
    chunks = [e["choices"][0] for e in events[:-1]]
    assert len(chunks) > 3  # token by token, not one blob
    assert "".join(c["text"] for c in chunks) == whole["text"] == " München: das Café öffnet um acht Uhr."
    assert [c["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["finish_reason"] == "stop"
    streamed = [lp for c in chunks for lp in c["logprobs"]["token_logprobs"]]
    assert streamed == whole["logprobs"]["token_logprobs"] and all(lp <= 0 for lp in streamed)
    assert all(len(top) == 2 for c in chunks for top in c["logprobs"]["top_logprobs"] or [])


def test_greedy_equals_the_full_recompute_oracle_while_requests_join_and_leave(server, tiny_package):
    """Prompts the model never saw, so its output is arbitrary but deterministic; different
    lengths and budgets, launched staggered, so the batch changes at every few steps."""
    url, _ = server
    model, _ = load_package(tiny_package)
    codec = Codec(tiny_package / "tokenizer.json")
    jobs = [("Why", 40), ("Colorless green ideas", 7), ("A", 25), ("München und die", 18), ("The sun", 33),
            ("Zebra crossing at", 12), ("seven", 40), ("Honey and", 3)]

    async def one(client, delay, prompt, max_tokens):
        await asyncio.sleep(delay)
        response = await client.post(f"{url}/v1/completions", json=dict(prompt=prompt, max_tokens=max_tokens,
                                                                         temperature=0))
        return response.json()["choices"][0]["text"]

    async def run():
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(one(client, 0.01 * i, p, n) for i, (p, n) in enumerate(jobs)))

    served = asyncio.run(run())
    for (prompt, max_tokens), text in zip(jobs, served, strict=True):
        assert text == oracle_greedy(model, codec, prompt, max_tokens), prompt


def test_many_concurrent_clients_are_all_served(server):
    url, _ = server  # 4 running at most, 24 clients: most wait their turn in the queue

    async def run():
        async with httpx.AsyncClient(timeout=60) as client:
            prompts = [s.split()[0] for s in SENTENCES * 3][:24]
            requests = [client.post(f"{url}/v1/completions", json=dict(prompt=p, max_tokens=20, temperature=0.8,
                                                                        seed=i)) for i, p in enumerate(prompts)]
            return await asyncio.gather(*requests)

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * 24
    assert all(r.json()["usage"]["completion_tokens"] >= 1 for r in responses)


def test_seeded_sampling_is_reproducible(server):
    url, _ = server
    body = dict(prompt="Our", max_tokens=20, temperature=1.5, top_p=0.95)
    first = [complete(url, **body, seed=s)["choices"][0]["text"] for s in (1, 2, 3)]
    again = [complete(url, **body, seed=s)["choices"][0]["text"] for s in (1, 2, 3)]
    assert first == again
    assert len(set(first)) > 1
    greedy = complete(url, prompt="Our", max_tokens=20, temperature=0)["choices"][0]["text"]
    assert complete(url, **body, seed=1, top_k=1)["choices"][0]["text"] == greedy  # vLLM's top_k
    assert complete(url, **body, seed=1, top_k=-1)["choices"][0]["text"] == first[0]  # -1: off
