"""One large prompt must not stall the server: a prompt with more characters than the context
could hold is refused before it is tokenized, and one that passes that check is tokenized off the
event loop while /healthz and the other clients are answered as usual."""

from __future__ import annotations

import random
import statistics
import threading
import time

import httpx
import pytest
from tokenizers import Tokenizer

from tests.serving import SENTENCES, running_server

EOT = "<|endoftext|>"
LONG_CONTEXT = 65536
HEALTHZ_BOUND_SECONDS = 0.1


def longest_entry(package) -> int:
    """The most characters a token of the package's tokenizer can stand for (its longest entry)."""
    return max(map(len, Tokenizer.from_file(str(package / "tokenizer.json")).get_vocab()))


def prose(chars: int, seed: int = 0) -> str:
    """Exactly `chars` characters of the corpus's words in a random order (about 1.7 per token)."""
    words, rng, parts, size = " ".join(SENTENCES).split(), random.Random(seed), [], 0
    while size <= chars:
        parts.append(rng.choice(words))
        size += len(parts[-1]) + 1
    text = " ".join(parts)[:chars]
    assert len(text) == chars
    return text


@pytest.fixture(scope="module")
def long_server(long_context_package):
    with running_server(long_context_package, "engine.max_running=1") as url:
        yield url


# -- the character bound --------------------------------------------------------------------------


def test_a_prompt_with_more_characters_than_the_context_holds_is_refused_untokenized(server, tiny_package):
    url, _ = server
    per_token = longest_entry(tiny_package)  # 13: "<|endoftext|>"
    room = 96 - 4  # the context less max_tokens
    too_long = httpx.post(f"{url}/v1/completions", json={"prompt": prose(room * per_token + 1), "max_tokens": 4},
                          timeout=30)
    assert too_long.status_code == 400, too_long.text
    message = too_long.json()["error"]["message"]
    assert message.startswith("prompt: 1197 characters") and "96 tokens" in message
    score = httpx.post(f"{url}/v1/score", json={"text": prose(96 * per_token + 1)}, timeout=30)
    assert score.status_code == 400 and score.json()["error"]["message"].startswith("text: 1249 characters")


def test_the_bound_never_refuses_a_prompt_that_fits(server, tiny_package):
    """The densest prompt there is (every token the longest entry) at exactly the bound is served."""
    url, _ = server
    per_token = longest_entry(tiny_package)
    assert per_token == len(EOT)
    densest = EOT * (96 - 4)
    response = httpx.post(f"{url}/v1/completions", json={"prompt": densest, "max_tokens": 4, "temperature": 0},
                          timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["usage"] == {"prompt_tokens": 92, "completion_tokens": 4, "total_tokens": 96}
    score = httpx.post(f"{url}/v1/score", json={"text": EOT * 96}, timeout=30)
    assert score.status_code == 200 and len(score.json()["token_ids"]) == 96
    over = httpx.post(f"{url}/v1/completions", json={"prompt": densest + "x", "max_tokens": 4}, timeout=30)
    assert over.status_code == 400 and "characters" in over.json()["error"]["message"]


# -- a maximal prompt in flight -------------------------------------------------------------------


def short_completion(url: str, result: dict, big: dict) -> threading.Thread:
    """Another client's short completion, on a thread; notes whether it ended before `big` did."""
    def send():
        result["response"] = httpx.post(f"{url}/v1/completions", timeout=60,
                                        json={"prompt": "Bees make", "max_tokens": 6, "temperature": 0})
        result["before_big"] = "response" not in big

    return threading.Thread(target=send)


def poll_healthz(client: httpx.Client, busy: threading.Thread, short: threading.Thread) -> list[float]:
    """/healthz back to back while `busy` runs (and for at least half a second), `short` started
    100 ms in: the latency of each poll."""
    latencies, started = [], time.monotonic()
    busy.start()
    while busy.is_alive() or time.monotonic() - started < 0.5:
        if short.ident is None and time.monotonic() - started > 0.1:
            short.start()
        before = time.monotonic()
        assert client.get("/healthz").status_code == 200
        latencies.append(time.monotonic() - before)
    if short.ident is None:  # the first poll outlasted everything: the server was stalled
        short.start()
    busy.join()
    short.join()
    return latencies


def summary(latencies: list[float]) -> str:
    return (f"{len(latencies)} polls, median {statistics.median(latencies) * 1000:.1f} ms, "
            f"worst {max(latencies) * 1000:.1f} ms")


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/score"])
def test_a_maximal_prompt_stalls_neither_the_probes_nor_other_clients(long_server, long_context_package, path):
    """The longest prompt the character bound lets through (~850,000 characters, ~490,000 tokens:
    it does not fit, which only tokenizing can tell) takes the server most of a second to
    tokenize. Meanwhile /healthz is polled back to back and a short completion is sent: no poll
    may take HEALTHZ_BOUND_SECONDS longer than the worst of the same polling without the big
    prompt (a loaded machine's own scheduling delays), and the completion must finish first, as
    usual. With tokenizing on the event loop, the poll in flight waits for the whole tokenization."""
    per_token = longest_entry(long_context_package)
    if path == "/v1/score":
        body = {"text": prose(LONG_CONTEXT * per_token)}
    else:
        body = {"prompt": prose((LONG_CONTEXT - 1) * per_token), "max_tokens": 1}
    big: dict = {}

    def send_big():
        started = time.monotonic()
        big["response"] = httpx.post(long_server + path, json=body, timeout=120)
        big["seconds"] = time.monotonic() - started

    with httpx.Client(base_url=long_server, timeout=60) as client:
        client.get("/healthz")  # the connection is open before the clock starts
        baseline = poll_healthz(client, threading.Thread(target=lambda: None),
                                short_completion(long_server, {}, {}))
        short: dict = {}
        during = poll_healthz(client, threading.Thread(target=send_big), short_completion(long_server, short, big))
    print(f"{path}: big prompt {big['seconds']:.2f} s; /healthz without it: {summary(baseline)}; "
          f"with it: {summary(during)}")

    assert max(during) < max(baseline) + HEALTHZ_BOUND_SECONDS, \
        f"/healthz stalled while the big prompt was handled: {summary(during)}; without it: {summary(baseline)}"
    response = big["response"]
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert ("prompt tokens" in message) if path == "/v1/completions" else ("text: has" in message)  # tokenized
    assert short["response"].status_code == 200
    text = short["response"].json()["choices"][0]["text"]
    assert len(text) > 5 and " honey from the nectar of flowers.".startswith(text)  # what the model learned
    assert short["before_big"], f"the short completion waited for the big prompt ({big['seconds']:.2f} s)"
