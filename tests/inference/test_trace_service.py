"""The standalone trace service (the chart's `trace` container beside vLLM): /v1/trace over the index's own
tokenizer with lmforge-serve's API-key check, the answer exactly lmforge.trace's search (the same body
lmforge-serve gives: tests/inference/test_trace_route.py compares the two), /healthz while the index loads,
/readyz once loaded, the trace metrics; and its command line serving an index from S3 through the cache."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
from starlette.testclient import TestClient

from lmforge.inference import trace_service
from lmforge.inference.config import ServeConfig, TraceConfig
from lmforge.inference.text import Codec
from lmforge.inference.trace_service import create_trace_app
from lmforge.trace.engine import TraceIndex
from lmforge.trace.query import trace_tokens
from tests.inference.metrics_text import sample_value
from tests.ports import free_port
from tests.processes import stop, wait_http_ok
from tests.s3_server import upload_tree
from tests.trace_index import SENTENCES, build_test_index, make_tokenizer

KEY = "sk-trace-service"  # noqa: S105 - a test server's key
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXT = f"As the atlas says: {SENTENCES[3]}"  # the sentence, after a byte-level " " token: as in both documents


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """A two-partition index of the sentences, with the tokenizer they were encoded with."""
    root = tmp_path_factory.mktemp("trace")
    codec = Codec(make_tokenizer(root / "tokenizer.json"))
    docs = [codec.encode(s) for s in SENTENCES] + [codec.encode(f"{SENTENCES[3]} {SENTENCES[5]}")]
    return build_test_index(root / "trace-index", docs, vocab_size=codec.vocab_size, eos_token_id=0,
                            tokenizer_json=root / "tokenizer.json", partitions=2)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "api-keys"
    path.write_text(f"{KEY}\n")
    return path


def expected_body(index_root, text: str, **options) -> dict:
    """What lmforge.trace's search gives for `text`, with the service's settings (the defaults)."""
    codec = Codec(index_root / "tokenizer.json")
    defaults = TraceConfig()
    result = trace_tokens(TraceIndex.open(index_root), codec.encode(text), max_count=defaults.max_count,
                          snippet_tokens=defaults.snippet_tokens, decode=codec.decode,
                          **{"min_span_tokens": defaults.min_span_tokens, "max_documents": 10, **options})
    return {**result.to_dict(), "object": "trace", "model": "trace"}


def test_the_service_answers_as_the_search_does_with_the_same_auth(index, keys):
    app, loader = create_trace_app(ServeConfig(api_keys_file=str(keys), trace=TraceConfig(index=str(index))))
    with TestClient(app) as client:
        assert client.get("/healthz").json() == {"status": "alive"}
        loading = client.get("/readyz")
        assert loading.status_code == 503 and loading.json()["reason"] == "the trace index is loading"
        early = client.post("/v1/trace", json={"text": TEXT}, headers=AUTH)
        assert early.status_code == 503 and early.json()["error"]["code"] == "trace_index_loading"
        loader.load()
        assert client.get("/readyz").status_code == 200

        assert client.post("/v1/trace", json={"text": TEXT}).status_code == 401
        assert client.post("/v1/trace", json={"text": TEXT}, headers={"Authorization": "Bearer nope"}
                           ).status_code == 401
        body = client.post("/v1/trace", json={"text": TEXT, "span_density": 1}, headers=AUTH).json()
        assert body == expected_body(index, TEXT, span_density=1)
        (span,) = body["spans"]
        assert span["text"].strip() == SENTENCES[3] and span["count"] == 2
        assert {d["url"] for d in span["documents"]} == {"https://example.com/3", "https://example.com/10"}
        filtered = client.post("/v1/trace", json={"text": TEXT}, headers=AUTH).json()
        assert filtered == expected_body(index, TEXT, span_density=0.05)
        too_long = client.post("/v1/trace", json={"token_ids": [5] * 2049}, headers=AUTH)
        assert too_long.status_code == 413

        text = client.get("/metrics").text
    assert sample_value(text, "lmforge_inference_trace_index_tokens", {"model_name": "trace"}) == \
        TraceIndex.open(index).tokens
    assert sample_value(text, "lmforge_inference_trace_request_latency_seconds_count", {"outcome": "ok"}) == 2
    assert sample_value(text, "lmforge_inference_trace_request_latency_seconds_count",
                        {"outcome": "unavailable"}) == 1
    assert sample_value(text, "lmforge_inference_trace_request_latency_seconds_count", {"outcome": "too_long"}) == 1
    assert sample_value(text, "lmforge_inference_trace_spans_total") == 1 + len(filtered["spans"])


def test_an_index_that_does_not_load_is_a_reason_not_a_crash(tmp_path, keys):
    app, loader = create_trace_app(ServeConfig(trace=TraceConfig(index=str(tmp_path / "nowhere"))))
    with TestClient(app) as client:
        loader.load()
        assert client.get("/healthz").status_code == 200
        failed = client.post("/v1/trace", json={"text": TEXT})
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "trace_index_unavailable"
        assert failed.json()["error"]["message"] == (f"the trace index failed to load: {tmp_path / 'nowhere'}: not a "
                                                     "trace index (index.json missing)")
        assert client.get("/readyz").status_code == 503


def test_an_unreadable_tokenizer_beside_the_index_is_a_reason_and_no_index_in_the_metrics(index, keys, tmp_path):
    import shutil

    broken = tmp_path / "trace-index"
    shutil.copytree(index, broken)
    (broken / "tokenizer.json").write_text("{not a tokenizer")
    app, loader = create_trace_app(ServeConfig(api_keys_file=str(keys), trace=TraceConfig(index=str(broken))))
    with TestClient(app) as client:
        loader.load()
        failed = client.post("/v1/trace", json={"text": TEXT}, headers=AUTH)
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "trace_index_unavailable"
        assert "cannot read the tokenizer" in failed.json()["error"]["message"]
        assert "cannot read the tokenizer" in client.get("/readyz").json()["reason"]
        text = client.get("/metrics").text
    assert sample_value(text, "lmforge_inference_trace_index_tokens", {"model_name": "trace"}) == 0


def test_the_command_serves_an_index_from_s3(s3, index, keys, tmp_path):
    _, make_bucket = s3
    upload_tree(make_bucket("datasets"), "datasets", index, "cc/trace-index")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "lmforge.inference.trace_service", "--host", "127.0.0.1", "--port", str(port),
         "--set", "trace.index=s3://datasets/cc/trace-index", "--set", f"trace.cache_dir={tmp_path / 'cache'}",
         "--set", f"api_keys_file={keys}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{url}/readyz", process, "trace service", timeout=60)
        answer = httpx.post(f"{url}/v1/trace", json={"text": TEXT, "span_density": 1}, headers=AUTH, timeout=10)
        assert answer.status_code == 200
        assert answer.json() == expected_body(index, TEXT, span_density=1)
        assert httpx.post(f"{url}/v1/trace", json={"text": TEXT}, timeout=10).status_code == 401
        assert sample_value(httpx.get(f"{url}/metrics").text, "lmforge_inference_trace_index_partitions") == 2
    finally:
        stop(process)
    (copy,) = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    assert (copy / "index.json").read_bytes() == (index / "index.json").read_bytes()


def test_the_command_needs_an_index(capsys):
    assert trace_service.main(["--port", str(free_port())]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "no trace index: set trace.index (a data-prep output's trace-index/, a directory or s3://)")
