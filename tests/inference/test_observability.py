"""What operators see: the docs/design.md metric names with values that match the traffic sent,
request spans with queue → prefill → decode children, OTLP export to a collector, and the
trace id in each request's log line."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from lmforge.inference.api import create_app
from lmforge.inference.config import ServeConfig
from lmforge.inference.metrics import ServeMetrics
from lmforge.inference.service import InferenceService
from lmforge.inference.stats import EngineStats
from tests.inference.metrics_text import sample_value, samples
from tests.ports import free_port
from tests.serving import in_process_server, running_server

DESIGN_NAMES = [
    "lmforge_inference_time_to_first_token_seconds", "lmforge_inference_time_per_output_token_seconds",
    "lmforge_inference_request_latency_seconds", "lmforge_inference_queue_time_seconds",
    "lmforge_inference_requests_total", "lmforge_inference_prompt_tokens_total",
    "lmforge_inference_generation_tokens_total", "lmforge_inference_requests_running",
    "lmforge_inference_requests_waiting", "lmforge_inference_kv_cache_usage_ratio", "lmforge_inference_model_info",
    "lmforge_inference_kv_cache_blocks", "lmforge_inference_kv_cache_blocks_in_use",
    "lmforge_inference_preemptions_total", "lmforge_inference_prefix_cache_queries_total",
    "lmforge_inference_prefix_cache_hits_total", "lmforge_inference_prefill_tokens_total",
]
# The engine's series (EngineStats, read at scrape time) and their Prometheus types.
ENGINE_TYPES = {
    "lmforge_inference_kv_cache_usage_ratio": "gauge", "lmforge_inference_kv_cache_blocks": "gauge",
    "lmforge_inference_kv_cache_blocks_in_use": "gauge", "lmforge_inference_preemptions": "counter",
    "lmforge_inference_prefix_cache_queries": "counter", "lmforge_inference_prefix_cache_hits": "counter",
    "lmforge_inference_prefill_tokens": "counter",
}


def family_types(text: str) -> dict[str, str]:
    return {family.name: family.type for family in text_string_to_metric_families(text)}


def test_metrics_match_the_traffic(tiny_package):
    with running_server(tiny_package, "engine.max_running=2") as url:
        before = httpx.get(f"{url}/metrics").text
        assert sample_value(before, "lmforge_inference_requests_total") == 0
        generated = prompt = 0
        repeated = "Quiet zebras jog past 42 violet kiosks at dawn; "  # text the model never saw
        for i, text in enumerate(["Bees make", "The sun rises", "Two plus two", repeated, repeated]):
            body = httpx.post(f"{url}/v1/completions", json={"prompt": text, "max_tokens": 10 + i,
                                                             "temperature": 0}).json()
            generated += body["usage"]["completion_tokens"]
            prompt += body["usage"]["prompt_tokens"]
        # The repeat finds the first's full 16-token blocks cached (all but its last token's block).
        hits = (body["usage"]["prompt_tokens"] - 1) // 16 * 16
        assert hits >= 16
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "x", "top_p": 5}).status_code == 400
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "x" * (2 << 20)}).status_code == 413
        counted = httpx.get(f"{url}/metrics").text
        assert sample_value(counted, "lmforge_inference_requests_total", {"status": "413"}) == 1  # the body limit's
        leave_mid_body(url)
        wait_for(lambda: sample_value(httpx.get(f"{url}/metrics").text, "lmforge_inference_requests_total",
                                      {"status": "499"}) == 1)
        text = httpx.get(f"{url}/metrics").text

    for name in DESIGN_NAMES:
        assert samples(text, name) or samples(text, name + "_count"), name
    count = lambda name: sample_value(text, name + "_count", {"model_name": "tiny-v1"})  # noqa: E731
    assert sample_value(text, "lmforge_inference_requests_total", {"status": "200"}) == 5
    assert sample_value(text, "lmforge_inference_requests_total", {"status": "400"}) == 1
    statuses = {s.labels["status"] for s in samples(text, "lmforge_inference_requests_total")}
    assert statuses == {"200", "413", "400", "499"}  # the client that left mid-body: 499, not a 5xx
    assert sample_value(text, "lmforge_inference_generation_tokens_total") == generated
    assert sample_value(text, "lmforge_inference_prompt_tokens_total") == prompt
    for name in ("time_to_first_token_seconds", "request_latency_seconds", "queue_time_seconds",
                 "time_per_output_token_seconds"):
        assert count(f"lmforge_inference_{name}") == 5, name
    ttft = sample_value(text, "lmforge_inference_time_to_first_token_seconds_sum")
    latency = sample_value(text, "lmforge_inference_request_latency_seconds_sum")
    assert 0 < ttft < latency < 30
    assert sample_value(text, "lmforge_inference_requests_running") == 0
    assert sample_value(text, "lmforge_inference_requests_waiting") == 0
    assert sample_value(text, "lmforge_inference_kv_cache_usage_ratio") == 0
    # The engine's counters, scraped from the server: typed as counters, and consistent with the
    # traffic (on an idle pool nothing is preempted; every prompt token is looked up in the prefix
    # cache, and prefilled unless found there).
    assert {name: family_types(text)[name] for name in ENGINE_TYPES} == ENGINE_TYPES
    assert sample_value(text, "lmforge_inference_preemptions_total", {"model_name": "tiny-v1"}) == 0
    assert sample_value(text, "lmforge_inference_prefix_cache_queries_total") == prompt
    assert sample_value(text, "lmforge_inference_prefix_cache_hits_total") == hits
    assert sample_value(text, "lmforge_inference_prefill_tokens_total") == prompt - hits
    assert sample_value(text, "lmforge_inference_kv_cache_blocks") > 0
    assert sample_value(text, "lmforge_inference_kv_cache_blocks_in_use") == 0
    info = samples(text, "lmforge_inference_model_info")
    assert [(s.labels["version"], s.labels["step"], s.labels["device"], s.value) for s in info] == \
        [("tiny-v1", "300", "cpu", 1.0)]
    assert "gpu" not in text  # no GPU here: the series are absent, not zero


def leave_mid_body(url: str) -> None:
    """A client that announces a 1,000-byte body, sends 10 bytes and goes away."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"prompt\":")


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


ENGINE_GAUGES = ["lmforge_inference_requests_running", "lmforge_inference_requests_waiting",
                 "lmforge_inference_kv_cache_usage_ratio", "lmforge_inference_kv_cache_blocks_in_use"]
ENGINE_COUNTERS = ["lmforge_inference_preemptions_total", "lmforge_inference_prefix_cache_queries_total",
                   "lmforge_inference_prefix_cache_hits_total", "lmforge_inference_prefill_tokens_total"]


def test_gauges_have_no_sample_until_they_have_a_value(tiny_package, tmp_path):
    """While the model loads, or after it failed to, there is no engine: its gauges and model_info
    are absent, not 0 (a dashboard must not show an idle engine that does not exist)."""
    broken = InferenceService(ServeConfig(model=str(tmp_path / "nowhere")))
    broken.load()
    service = InferenceService(ServeConfig(model=str(tiny_package)))
    with TestClient(create_app(service)) as client, TestClient(create_app(broken)) as broken_client:
        for text in (client.get("/metrics").text, broken_client.get("/metrics").text):
            for name in [*ENGINE_GAUGES, *ENGINE_COUNTERS, "lmforge_inference_kv_cache_blocks",
                         "lmforge_inference_model_info"]:
                assert samples(text, name) == [], name
        service.load()
        text = client.get("/metrics").text
    service.stop()
    broken.stop()
    for name in [*ENGINE_GAUGES, *ENGINE_COUNTERS]:
        assert [(s.labels, s.value) for s in samples(text, name)] == [({"model_name": "tiny-v1"}, 0.0)], name
    assert sample_value(text, "lmforge_inference_kv_cache_blocks") > 0
    assert [s.value for s in samples(text, "lmforge_inference_model_info")] == [1.0]


def test_engine_stats_are_exposed_as_read_at_scrape_time():
    """What the engine counts reaches the exposition as is, read anew at each scrape: counters
    as counters (`_total`), the pool's usage as blocks in use over blocks in the pool."""
    stats = EngineStats(preemptions=3, prefix_cache_queries=96, prefix_cache_hits=64, prefill_tokens=40,
                        kv_blocks_total=200, kv_blocks_in_use=50)
    registry = ServeMetrics("m", "cpu", lambda: (2, 1), lambda: stats).registry
    text = generate_latest(registry).decode()
    assert {name: family_types(text)[name] for name in ENGINE_TYPES} == ENGINE_TYPES
    read = {name: sample_value(text, name, {"model_name": "m"}) for name in (
        "lmforge_inference_preemptions_total", "lmforge_inference_prefix_cache_queries_total",
        "lmforge_inference_prefix_cache_hits_total", "lmforge_inference_prefill_tokens_total",
        "lmforge_inference_kv_cache_blocks", "lmforge_inference_kv_cache_blocks_in_use",
        "lmforge_inference_kv_cache_usage_ratio")}
    assert read == {"lmforge_inference_preemptions_total": 3, "lmforge_inference_prefix_cache_queries_total": 96,
                    "lmforge_inference_prefix_cache_hits_total": 64, "lmforge_inference_prefill_tokens_total": 40,
                    "lmforge_inference_kv_cache_blocks": 200, "lmforge_inference_kv_cache_blocks_in_use": 50,
                    "lmforge_inference_kv_cache_usage_ratio": 0.25}
    stats.preemptions += 1
    assert sample_value(generate_latest(registry).decode(), "lmforge_inference_preemptions_total") == 4


def test_metrics_on_their_own_port(tiny_package):
    port = free_port()
    with running_server(tiny_package, f"metrics_port={port}") as url:
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "Bees", "max_tokens": 2}).status_code == 200
        assert httpx.get(f"{url}/metrics").status_code == 404  # not on the API port
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert sample_value(text, "lmforge_inference_requests_total", {"status": "200"}) == 1


def test_spans_queue_prefill_decode_under_the_request_span(tiny_package):
    exporter = InMemorySpanExporter()
    service = InferenceService(ServeConfig(model=str(tiny_package)), span_exporter=exporter)
    service.load()
    with in_process_server(service) as url:
        httpx.post(f"{url}/v1/completions", json={"prompt": "Bees make", "max_tokens": 5, "temperature": 0})
        # greedy, as the first: a sampled continuation may end with the end-of-text token (finish_reason stop)
        with httpx.stream("POST", f"{url}/v1/completions", json={"prompt": "Bees make", "max_tokens": 5,
                                                                 "temperature": 0, "stream": True}) as response:
            list(response.iter_lines())
    spans = exporter.get_finished_spans()
    requests = [s for s in spans if s.name == "POST /v1/completions"]
    assert len(requests) == 2
    for request in requests:
        children = sorted((s for s in spans if s.parent is not None and s.parent.span_id == request.context.span_id
                           and s.name.startswith("inference.")), key=lambda s: s.start_time)
        assert [c.name for c in children] == ["inference.queue", "inference.prefill", "inference.decode"]
        assert all(c.context.trace_id == request.context.trace_id for c in children)
        queue, prefill, decode = children
        assert request.start_time <= queue.start_time <= queue.end_time <= prefill.start_time + 1000
        assert prefill.end_time <= decode.start_time + 1000 and decode.end_time <= request.end_time
        assert decode.attributes["lmforge.generated_tokens"] == 5
        assert request.attributes["lmforge.finish_reason"] == "length"
        assert request.attributes["http.status_code" if "http.status_code" in request.attributes
                                  else "http.response.status_code"] == 200


class _Collector(BaseHTTPRequestHandler):
    received: list[bytes] = []

    def do_POST(self):  # noqa: N802 - http.server's naming
        _Collector.received.append(self.rfile.read(int(self.headers["content-length"])))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_traces_are_exported_with_otlp_and_the_trace_id_is_logged(tiny_package, tmp_path):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    collector = HTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    log = tmp_path / "serve.log"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.server_port}", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    try:
        with running_server(tiny_package, env=env, log_path=log) as url:
            httpx.post(f"{url}/v1/completions", json={"prompt": "Bees make", "max_tokens": 4})
        # the server flushes its spans on shutdown at the latest
    finally:
        collector.shutdown()
    names, trace_ids = set(), set()
    for payload in _Collector.received:
        request = ExportTraceServiceRequest.FromString(payload)
        for resource_spans in request.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}["service.name"]
            assert service == "lmforge-inference"
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    names.add(span.name)
                    trace_ids.add(span.trace_id.hex())
    assert {"POST /v1/completions", "inference.queue", "inference.prefill", "inference.decode"} <= names
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    completions = [line for line in lines if line["event"] == "completion"]
    assert len(completions) == 1 and completions[0]["trace_id"] in trace_ids
