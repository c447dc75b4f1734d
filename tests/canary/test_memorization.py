"""The canary's memorization measurement: the union of the traced spans, the gauges, the report (a server
without a trace index: test_canary.py, beside the servers it shares).

The arithmetic is checked on /v1/trace answers served by an httpx MockTransport behind the canary's own
InferenceClient, so the spans (overlapping ones included) are known exactly; the whole path on a real
lmforge-serve tracing a real index of what its tiny model learned (tests/trace_index.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest

from lmforge.canary.client import InferenceClient
from lmforge.canary.compare import Verdict, compare
from lmforge.canary.config import HttpSection, MemorizationSection, PushSection, ToleranceSection
from lmforge.canary.evaluate import CheckResult, EvalResult, EvalSetRef
from lmforge.canary.memorization import measure_memorization
from lmforge.canary.metrics import build_registry, push
from lmforge.canary.report import render
from tests.canary.helpers import run_canary
from tests.prometheus_tools import pushed_value, registry_samples
from tests.serving import EOT, SENTENCES, running_server
from tests.trace_index import build_test_index

FAST = HttpSection(attempts=2, backoff_seconds=0.01, backoff_max_seconds=0.01)
EVAL_SET = SimpleNamespace(name="m", checks=[])


def _span(start: int, end: int, count: int, url: str, record_id: str, text: str) -> dict:
    document = {"url": url, "record_id": record_id, "doc_id": "d", "shard": "s", "token_offset": 0,
                "snippet": text, "match_start": 0, "match_end": len(text)}
    return {"start": start, "end": end, "length": end - start, "count": count, "unigram_logprob": -1.0,
            "text": text, "documents": [document]}


# Two outputs: "a" (100 tokens) with overlapping spans [0,40) and [30,75) and a short one [80,90) below the
# 32-token minimum; "b" (60 tokens) with [10,50) inside which [15,49) also lies. Union ≥ 32: 75 + 40 tokens.
ANSWERS = {
    "output a": {"tokens": 100, "truncated": False, "spans": [
        _span(0, 40, 3, "https://a.example/1", "<urn:uuid:a1>", "first span"),
        _span(30, 75, 1, "https://a.example/2", "<urn:uuid:a2>", "second, overlapping span"),
        _span(80, 90, 9, "https://a.example/3", "<urn:uuid:a3>", "too short")]},
    "output b": {"tokens": 60, "truncated": False, "spans": [
        _span(10, 50, 2, "https://b.example/1", "<urn:uuid:b1>", "span of b"),
        _span(15, 49, 2, "https://b.example/2", "<urn:uuid:b2>", "inner span of b")]},
}


def _client(handler) -> tuple[InferenceClient, list[dict]]:
    sent: list[dict] = []

    def record(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append({"path": request.url.path, "auth": request.headers.get("authorization"), **body})
        return handler(body)

    client = InferenceClient("http://canary.test", FAST, api_key="secret")
    client.client = httpx.Client(base_url=client.endpoint, headers=client.client.headers,
                                 transport=httpx.MockTransport(record))
    return client, sent


def _result(memorization) -> EvalResult:
    checks = [CheckResult(id="a", passed=True, output="output a"), CheckResult(id="b", passed=True, output="output b")]
    return EvalResult(model="canary-mem", endpoint="http://canary.test", eval_set=EvalSetRef(name="m", sha256="0"),
                      started="2026-01-01T00:00:00+00:00", seconds=1.0, perplexity=1.5, tokens=10, score=1.0,
                      checks_passed=2, checks_total=2, held_out=[], checks=checks, memorization=memorization)


def _measured():
    client, sent = _client(lambda body: httpx.Response(200, json={"object": "trace", **ANSWERS[body["text"]]}))
    with client:
        return measure_memorization(client, [("a", "output a"), ("b", "output b"), ("empty", "")],
                                    MemorizationSection()), sent


def test_ratio_over_all_outputs_with_overlapping_spans():
    memorization, sent = _measured()
    # Every output but the empty one is traced, authenticated, with every maximal span of ≥ 32 tokens.
    assert [s["text"] for s in sent] == ["output a", "output b"]
    assert all(s["path"] == "/v1/trace" and s["auth"] == "Bearer secret" for s in sent)
    assert all(s["span_density"] == 1 and s["min_span_tokens"] == 32 and s["max_documents"] == 3 for s in sent)
    assert memorization.traced and memorization.tokens == 160
    assert memorization.memorized_tokens == 75 + 40
    assert memorization.ratio == pytest.approx(115 / 160)
    assert memorization.spans == 4  # the 10-token span is below the minimum
    assert [(s.check, s.length) for s in memorization.longest] == [("a", 45), ("a", 40), ("b", 40), ("b", 34)]


def test_gauges_pushed_and_report_lists_the_longest_spans(pushgateway):
    result = _result(_measured()[0])
    verdict = compare(result, None, ToleranceSection())
    registry = build_registry(result, verdict, None)
    samples = registry_samples(registry)
    assert samples["lmforge_canary_memorized_token_ratio"] == pytest.approx(115 / 160)
    assert samples["lmforge_canary_memorized_spans"] == 4
    push(pushgateway, registry, result.model, PushSection(attempts=1))
    assert pushed_value(pushgateway, "lmforge_canary_memorized_token_ratio", job="lmforge-canary",
                        model="canary-mem") == pytest.approx(115 / 160)
    table = render(result, EVAL_SET, verdict, None, None, ToleranceSection(), None)
    assert "memorization: 71.88% of 160 generated tokens (115) inside 4 span(s) of ≥ 32 tokens" in table
    rows = table[table.index("longest spans:"):].splitlines()[1:5]
    assert "https://a.example/2 <urn:uuid:a2>" in rows[0] and "'second, overlapping span'" in rows[0]
    assert " 45 " in rows[0] and "     1  " in rows[0]
    assert "https://a.example/1 <urn:uuid:a1>" in rows[1] and "https://b.example/1 <urn:uuid:b1>" in rows[2]
    assert "too short" not in table


def test_a_trace_index_still_loading_is_not_traced():
    client, sent = _client(lambda body: httpx.Response(
        503, json={"error": {"message": "the trace index is loading", "type": "trace_not_ready"}}))
    with client:
        memorization = measure_memorization(client, [("a", "output a")], MemorizationSection())
    assert len(sent) == FAST.attempts  # 503 is retried, as for completions
    assert not memorization.traced and memorization.ratio is None
    assert memorization.reason == "check 'a': HTTP 503: the trace index is loading"
    result = _result(memorization)
    samples = registry_samples(build_registry(result, Verdict(passed=True), None))
    assert "lmforge_canary_memorized_token_ratio" not in samples and "lmforge_canary_passed" in samples
    table = render(result, EVAL_SET, Verdict(passed=True), None, None, ToleranceSection(), None)
    assert "memorization: not traced (check 'a': HTTP 503: the trace index is loading)" in table


@pytest.mark.parametrize(("status", "said"), [(413, "the text has 3000 tokens"), (504, "the trace took too long"),
                                              (429, "busy")])
def test_a_failed_trace_costs_the_measurement_not_the_run(status, said):
    client, _ = _client(lambda body: httpx.Response(status, json={"error": {"message": said, "type": "x"}}))
    with client:
        memorization = measure_memorization(client, [("a", "output a")], MemorizationSection())
    assert not memorization.traced and memorization.ratio is None
    assert memorization.reason.startswith("check 'a': ") and said in memorization.reason


def _halves_index(root, package) -> list[str]:
    """An index of what the tiny model learned, each sentence as two overlapping pieces (its first and last
    70 %), so a memorized continuation is covered by two overlapping maximal spans. Returns the URLs."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(package / "tokenizer.json"))
    docs, urls = [], []
    for i, sentence in enumerate(SENTENCES):
        ids = tokenizer.encode(sentence).ids
        cut = round(len(ids) * 0.7)
        docs += [ids[:cut], ids[len(ids) - cut:]]
        urls += [f"https://learned.example/{i}/head", f"https://learned.example/{i}/tail"]
    build_test_index(root, docs, vocab_size=tokenizer.get_vocab_size(), eos_token_id=tokenizer.token_to_id(EOT),
                     urls=urls, tokenizer_json=package / "tokenizer.json")
    return urls


def test_memorized_outputs_traced_by_a_real_server(canary_dir, good_package, eval_set, pushgateway):
    index = canary_dir / "trace-index-halves"
    _halves_index(index, good_package)
    with running_server(good_package, f"trace.index={index}", "model_name=canary-traced",
                        log_path=canary_dir / "traced-server.log") as url:
        result = run_canary("--endpoint", url, "--eval-set", str(eval_set), "--pushgateway", pushgateway,
                            "--set", "memorization.min_span_tokens=6")
        assert result.code == 0, str(result)
        # The expected ratio from the route's own answers, as a set of covered positions per output.
        tokens = covered = 0
        spans = []
        for check in (e for e in result.logs if e["event"] == "check_done"):
            body = httpx.post(f"{url}/v1/trace", json={"text": check["output"], "min_span_tokens": 6,
                                                       "max_documents": 3, "span_density": 1}, timeout=30).json()
            tokens += body["tokens"]
            covered += len({t for s in body["spans"] for t in range(s["start"], s["end"])})
            spans += [(s["length"], s["documents"][0]["url"]) for s in body["spans"]]
    assert covered > 0 and len(spans) > len(SENTENCES)  # overlapping halves: several spans per output
    assert sum(length for length, _ in spans) > covered  # ... which overlap: the union counts each token once
    event = result.event("memorization_traced")
    assert (event["tokens"], event["memorized_tokens"], event["spans"]) == (tokens, covered, len(spans))
    group = {"job": "lmforge-canary", "model": "canary-traced"}
    assert pushed_value(pushgateway, "lmforge_canary_memorized_token_ratio", **group) == pytest.approx(
        covered / tokens)
    assert pushed_value(pushgateway, "lmforge_canary_memorized_spans", **group) == len(spans)
    table = result.stderr
    assert f"memorization: {covered / tokens:.2%} of {tokens} generated tokens ({covered})" in table
    listed = table[table.index("longest spans:"):].splitlines()[1:6]
    longest = sorted((length for length, _ in spans), reverse=True)[:5]
    assert [int(row.split()[1]) for row in listed] == longest
    assert all("https://learned.example/" in row and "<urn:uuid:" in row for row in listed)
