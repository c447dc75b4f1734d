"""POST /v1/trace and `trace: true` on lmforge-serve, over a real trace index of the tiny model's training
sentences (built by lmforge.trace's builder with the model's own tokenizer) and the memorizing tiny model:
authentication, spans with their source documents, the limits (413, 400), a busy server (429) and a slow trace
(504) with the engine call held on an Event, 503 while the index loads, after it failed to and for an index built
with another tokenizer, 404 without an index, traces on completions and chat completions (whole and streamed, and
through the official openai client), and the trace metrics."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager

import openai
import pytest
from starlette.testclient import TestClient
from tokenizers import Tokenizer

from lmforge.inference.api import create_app
from lmforge.inference.config import ServeConfig, TraceConfig
from lmforge.inference.routes import trace as trace_route
from lmforge.inference.service import InferenceService
from lmforge.inference.trace_service import create_trace_app
from lmforge.trace.engine import TraceIndex
from tests.inference.metrics_text import sample_value, samples
from tests.serving import SENTENCES
from tests.trace_index import build_test_index, make_tokenizer

KEY = "sk-trace-test"  # noqa: S105 - a test server's key
AUTH = {"Authorization": f"Bearer {KEY}"}
FRANCE = SENTENCES[1]  # "The capital of France is Paris, and the capital of Italy is Rome."
PLANTED_URL = "https://planted.example/geography"
NOVEL = "Quiet zebras jog past violet kiosks at dawn."


def training_docs(tokenizer_json) -> tuple[list[list[int]], list[str], Tokenizer]:
    """Every sentence the tiny model learned, as a document, and one more document that quotes the France
    sentence inside other text: that sentence then occurs twice, in two documents."""
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    texts = [*SENTENCES, f"Bees make honey. {FRANCE} Our garden has roses."]
    urls = [f"https://example.com/{i}" for i in range(len(SENTENCES))] + [PLANTED_URL]
    return [tokenizer.encode(t, add_special_tokens=False).ids for t in texts], urls, tokenizer


@pytest.fixture(scope="module")
def trace_index(chat_package, tmp_path_factory):
    docs, urls, tokenizer = training_docs(chat_package / "tokenizer.json")
    root = build_test_index(tmp_path_factory.mktemp("trace") / "trace-index", docs, urls=urls,
                            vocab_size=tokenizer.get_vocab_size(), eos_token_id=tokenizer.token_to_id("<|endoftext|>"),
                            tokenizer_json=chat_package / "tokenizer.json", partitions=2)
    return root


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "api-keys"
    path.write_text(f"{KEY}\n")
    return path


@contextmanager
def serving(package, keys, *, load_index: bool = True, **trace):
    """The tiny model's server (its engine in a thread of this process) with these trace settings; the model
    loaded, and the index unless told not to."""
    config = ServeConfig(model=str(package), engine_layout="thread", api_keys_file=str(keys),
                         trace=TraceConfig(**trace))
    service = InferenceService(config)
    try:
        with TestClient(create_app(service)) as client:
            service.load()
            if load_index and service.trace is not None:
                service.trace.load()
            yield client, service
    finally:
        service.stop()


@pytest.fixture(scope="module")
def server(chat_package, keys, trace_index):
    with serving(chat_package, keys, index=str(trace_index), max_tokens=64, max_documents=5, max_concurrent=1,
                 timeout_s=1.0) as running:
        yield running


def post_trace(client, **body):
    return client.post("/v1/trace", json=body, headers=AUTH)


def test_a_trace_needs_an_api_key(server):
    client, _ = server
    answer = client.post("/v1/trace", json={"text": FRANCE})
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"


def test_a_training_sentence_is_traced_to_its_documents(server, chat_package):
    client, service = server
    answer = post_trace(client, text=FRANCE, span_density=1)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    ids = service.model.codec.encode(FRANCE)
    assert body["object"] == "trace" and body["model"] == "tiny-chat" and body["tokens"] == len(ids)
    index = TraceIndex.open(service.trace.index.root)
    assert body["index"] == {"tokens": index.tokens, "documents": 11, "partitions": 2, "engine": "infini-gram/2.6.0"}
    (span,) = body["spans"]  # the whole sentence: one maximal span, in two documents
    assert (span["start"], span["end"], span["length"], span["count"]) == (0, len(ids), len(ids), 2)
    assert span["text"] == FRANCE
    assert sorted(d["url"] for d in span["documents"]) == ["https://example.com/1", PLANTED_URL]
    planted = next(d for d in span["documents"] if d["url"] == PLANTED_URL)
    assert planted["snippet"][planted["match_start"]:planted["match_end"]].strip() == FRANCE
    assert "Bees make honey." in planted["snippet"]
    assert not body["truncated"]

    by_ids = post_trace(client, token_ids=ids, span_density=1).json()
    assert by_ids == body  # token ids trace as the text they encode

    assert post_trace(client, text=NOVEL).json()["spans"] == []  # never seen: nothing to trace
    one_document = post_trace(client, text=FRANCE, span_density=1, max_documents=1).json()
    assert len(one_document["spans"][0]["documents"]) == 1 and one_document["truncated"]
    # min_span_tokens: a span shorter than it is not reported
    assert post_trace(client, text=FRANCE, span_density=1, min_span_tokens=len(ids) + 1).json()["spans"] == []


def test_limits(server):
    client, _ = server
    too_long = post_trace(client, text=" ".join(SENTENCES))  # more than trace.max_tokens (64) tokens
    assert too_long.status_code == 413 and too_long.json()["error"]["code"] == "trace_input_too_long"
    assert "trace.max_tokens 64" in too_long.json()["error"]["message"]
    assert post_trace(client, token_ids=[5] * 65).status_code == 413
    assert post_trace(client, token_ids=[5] * 64).status_code == 200
    bad_id = post_trace(client, token_ids=[5, 100000])
    assert bad_id.status_code == 400
    assert "token id 100000 is outside the vocabulary" in bad_id.json()["error"]["message"]
    many = post_trace(client, text=FRANCE, max_documents=6)  # over trace.max_documents (5)
    assert many.status_code == 400 and many.json()["error"]["param"] == "max_documents"
    for body in ({"text": FRANCE, "token_ids": [1]}, {}, {"text": ""}, {"token_ids": []},
                 {"text": FRANCE, "min_span_tokens": 2}, {"text": FRANCE, "span_density": 0},
                 {"token_ids": [-1]}, {"text": FRANCE, "bogus": 1}):
        assert post_trace(client, **body).status_code == 400, body


@pytest.fixture
def held_searches(monkeypatch):
    """Every search blocks until `release` is set; `entered` is set once one has started."""
    entered, release = threading.Event(), threading.Event()
    real = trace_route.trace_tokens

    def held(*args, **kwargs):
        entered.set()
        assert release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(trace_route, "trace_tokens", held)
    yield entered, release
    release.set()


def test_busy_and_slow_traces(server, held_searches):
    """max_concurrent 1, timeout_s 1: a second trace while one runs is refused at once (429); the first is
    answered 504 after a second, and its thread stays taken until the search ends (429 still), then frees."""
    client, _ = server
    entered, release = held_searches
    first: dict = {}
    started = time.monotonic()
    waiting = threading.Thread(target=lambda: first.update(answer=post_trace(client, text=FRANCE)))
    waiting.start()
    assert entered.wait(10)
    busy = post_trace(client, text=FRANCE)
    assert busy.status_code == 429 and busy.json()["error"]["code"] == "trace_busy"
    assert busy.headers["retry-after"] == "1"
    waiting.join(10)
    assert first["answer"].status_code == 504 and first["answer"].json()["error"]["code"] == "trace_timeout"
    assert 1.0 <= time.monotonic() - started < 5
    assert post_trace(client, text=FRANCE).status_code == 429  # the timed-out search still holds the thread
    release.set()
    deadline = time.monotonic() + 10
    while (answer := post_trace(client, text=FRANCE)).status_code == 429:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert answer.status_code == 200 and answer.json()["spans"]


def test_trace_true_on_completions_and_chat(server, chat_package):
    client, _ = server
    request = {"prompt": "The capital of", "max_tokens": 40, "temperature": 0, "trace": True,
               "trace_options": {"span_density": 1}}
    body = client.post("/v1/completions", json=request, headers=AUTH).json()
    (choice,) = body["choices"]
    assert choice["text"] == " France is Paris, and the capital of Italy is Rome."
    trace = choice["trace"]
    assert trace["tokens"] == body["usage"]["completion_tokens"]  # the generated tokens, end-of-text included
    longest = max(trace["spans"], key=lambda s: s["length"])
    assert longest["start"] == 0 and longest["text"] == choice["text"]
    assert {d["url"] for d in longest["documents"]} == {"https://example.com/1", PLANTED_URL}

    plain = client.post("/v1/completions", json={**request, "trace": False, "trace_options": None},
                        headers=AUTH).json()
    assert "trace" not in plain["choices"][0]  # without trace, the response is as before

    stream = client.post("/v1/completions", json={**request, "stream": True,
                                                  "stream_options": {"include_usage": True}}, headers=AUTH)
    events = [line.removeprefix("data: ") for line in stream.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks[:-2]) == choice["text"]
    assert chunks[-2]["choices"] == [{"index": 0, "text": "", "logprobs": None, "finish_reason": None,
                                      "trace": trace}]  # the trace chunk: after the text, before the usage
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == body["usage"]

    chat_request = {"messages": [{"role": "user", "content": "Bees"}], "max_tokens": 12, "temperature": 0,
                    "n": 2, "seed": 1, "trace": True, "trace_options": {"span_density": 1, "min_span_tokens": 4}}
    chat = client.post("/v1/chat/completions", json=chat_request, headers=AUTH).json()
    for chat_choice in chat["choices"]:
        assert set(chat_choice["trace"]) >= {"tokens", "truncated", "index", "spans"}
        for span in chat_choice["trace"]["spans"]:
            assert span["text"] in chat_choice["message"]["content"] and span["documents"]
    streamed = client.post("/v1/chat/completions", json={**chat_request, "stream": True}, headers=AUTH)
    events = [line.removeprefix("data: ") for line in streamed.text.splitlines() if line.startswith("data: ")]
    last = json.loads(events[-2])
    assert events[-1] == "[DONE]"
    assert [(c["index"], c["delta"], c["trace"]) for c in last["choices"]] == \
        [(c["index"], {}, c["trace"]) for c in chat["choices"]]  # seeded: the same choices, the same traces


def test_an_engine_failure_after_generation_is_the_choices_trace_error(server, monkeypatch):
    client, _ = server

    def broken(*args, **kwargs):
        raise RuntimeError("trace engine refused the query")

    monkeypatch.setattr(trace_route, "trace_tokens", broken)
    request = {"prompt": "The capital of", "max_tokens": 8, "temperature": 0, "trace": True}
    answer = client.post("/v1/completions", json=request, headers=AUTH)
    assert answer.status_code == 200 and answer.json()["choices"][0]["text"]
    error = answer.json()["choices"][0]["trace"]["error"]
    assert error["code"] == "trace_failed" and "trace engine refused the query" in error["message"]
    stream = client.post("/v1/completions", json={**request, "stream": True}, headers=AUTH)
    events = [line.removeprefix("data: ") for line in stream.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["trace"]["error"]["code"] == "trace_failed"


def test_the_openai_client_parses_a_traced_completion(server):
    client, _ = server
    # a client of its own over the same app: the openai client closes its http client when done
    with openai.OpenAI(base_url="http://testserver/v1", api_key=KEY, http_client=TestClient(client.app),
                       max_retries=0) as api:
        completion = api.completions.create(model="tiny-chat", prompt="The capital of", max_tokens=40,
                                            temperature=0, extra_body={"trace": True})
        choice = completion.choices[0]
        assert choice.text == " France is Paris, and the capital of Italy is Rome."
        assert choice.model_extra["trace"]["spans"]  # the extension, kept as an extra field
        with pytest.raises(openai.BadRequestError, match="trace_options: only allowed when trace is true"):
            api.completions.create(model="tiny-chat", prompt="x", extra_body={"trace_options": {}})


def test_trace_metrics(server):
    client, service = server
    post_trace(client, text=FRANCE)
    text = client.get("/metrics").text
    index = service.trace.index
    assert sample_value(text, "lmforge_inference_trace_index_tokens", {"model_name": "tiny-chat"}) == index.tokens
    assert sample_value(text, "lmforge_inference_trace_index_bytes") == index.bytes > 0
    assert sample_value(text, "lmforge_inference_trace_index_partitions") == 2
    ok = sample_value(text, "lmforge_inference_trace_request_latency_seconds_count", {"outcome": "ok"})
    assert ok >= 1
    assert sample_value(text, "lmforge_inference_trace_spans_total") >= 1
    assert samples(text, "lmforge_inference_trace_request_latency_seconds_bucket")


def test_unavailable_while_loading_after_a_failed_load_and_for_another_tokenizer(chat_package, keys, trace_index,
                                                                                 tmp_path):
    with serving(chat_package, keys, index=str(trace_index), load_index=False) as (client, service):
        loading = post_trace(client, text=FRANCE)
        assert loading.status_code == 503 and loading.json()["error"]["code"] == "trace_index_loading"
        assert loading.json()["error"]["message"] == "the trace index is loading"
        assert loading.headers["retry-after"] == "5"
        completion = client.post("/v1/completions", json={"prompt": "Bees", "trace": True}, headers=AUTH)
        assert completion.status_code == 503  # refused before generating
        text = client.get("/metrics").text
        assert samples(text, "lmforge_inference_trace_index_tokens") == []  # absent, not 0, until loaded
        service.trace.load()
        assert post_trace(client, text=FRANCE).status_code == 200

    with serving(chat_package, keys, index=str(tmp_path / "nowhere")) as (client, _):
        failed = post_trace(client, text=FRANCE)
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "trace_index_unavailable"
        assert failed.json()["error"]["message"].startswith("the trace index failed to load: ")
        assert "\n" not in failed.json()["error"]["message"]

    other_tokenizer = make_tokenizer(tmp_path / "other" / "tokenizer.json", vocab_size=300)
    docs, urls, _ = training_docs(other_tokenizer)
    other = build_test_index(tmp_path / "other-index", docs, urls=urls, vocab_size=300, eos_token_id=0,
                             tokenizer_json=other_tokenizer)
    with serving(chat_package, keys, index=str(other)) as (client, _):
        mismatch = post_trace(client, text=FRANCE)
        assert mismatch.status_code == 503 and mismatch.json()["error"]["code"] == "trace_index_unavailable"
        assert "is not the one the trace index was built with" in mismatch.json()["error"]["message"]
        assert client.post("/v1/completions", json={"prompt": "Bees", "trace": True}, headers=AUTH).status_code == 503
        assert client.post("/v1/completions", json={"prompt": "Bees", "max_tokens": 2},
                           headers=AUTH).status_code == 200  # the model serves on


def test_no_index_no_trace(chat_package, keys):
    with serving(chat_package, keys) as (client, _):
        for answer in (post_trace(client, text=FRANCE),
                       client.post("/v1/completions", json={"prompt": "Bees", "trace": True}, headers=AUTH),
                       client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Bees"}],
                                                                  "trace": True}, headers=AUTH)):
            assert answer.status_code == 404 and answer.json()["error"]["code"] == "trace_not_enabled"
        assert client.post("/v1/completions", json={"prompt": "Bees", "max_tokens": 2}, headers=AUTH).status_code == 200


def test_the_standalone_service_answers_as_the_server_does(server, keys, trace_index):
    """The vLLM backend's trace service (the index's tokenizer) and lmforge-serve (the model's) give one body."""
    client, service = server
    app, loader = create_trace_app(ServeConfig(api_keys_file=str(keys), model_name="tiny-chat",
                                               trace=TraceConfig(index=str(trace_index), max_tokens=64)))
    loader.load()
    with TestClient(app) as standalone:
        for body, status in (({"text": FRANCE, "span_density": 1}, 200),
                             ({"text": f"We read: {FRANCE} {SENTENCES[5]}"}, 413),  # over max_tokens 64
                             ({"token_ids": service.model.codec.encode(SENTENCES[7]), "max_documents": 1}, 200)):
            alone, served = post_trace(standalone, **body), post_trace(client, **body)
            assert alone.status_code == served.status_code == status, body
            assert alone.json() == served.json() and (status != 200 or served.json()["spans"]), body
        assert standalone.post("/v1/trace", json={"text": FRANCE}).status_code == 401
