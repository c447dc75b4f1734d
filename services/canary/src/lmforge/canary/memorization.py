"""Memorization: the share of the canary's generated tokens that lie inside spans found verbatim in the
training data, through the server's POST /v1/trace (the canary speaks HTTP only; it does not import
lmforge.trace).

Each check's output is traced with span_density 1 (every maximal span: coverage needs all of them, not
the few OLMoTrace's display filter keeps) and `memorization.min_span_tokens`. The answer's "tokens" is
the output's length in the index tokenizer's tokens, so

    ratio = Σ tokens inside the union of the spans ≥ min_span_tokens / Σ tokens

over all outputs. Maximal spans overlap (one output may continue two documents), hence the union.
The server leaves out spans occurring more than its `trace.max_count` times (boilerplate), so those
are not counted. A server without a trace index (404), one still loading it (503 after the client's
retries), or any trace that fails (429 or 504 past the retries, 413 for an output over the server's
trace.max_tokens, an unexpected answer) makes the measurement "not traced" with the reason: no ratio,
and the run does not fail."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from lmforge.canary.client import EndpointError, InferenceClient, RouteUnavailable
from lmforge.canary.config import MemorizationSection
from lmforge.common.errors import InputError
from lmforge.common.logging import get_logger
from lmforge.common.spans import covered_tokens

log = get_logger("canary")

LONGEST_SPANS = 5  # kept in the result and listed in the report
MAX_DOCUMENTS = 3  # source documents asked for per span


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SpanSource(_Record):
    url: str | None = None
    record_id: str | None = None


class MemorizedSpan(_Record):
    check: str  # the id of the check whose output holds the span
    start: int  # token offsets in the output, [start, end)
    end: int
    count: int  # occurrences in the training data
    text: str | None = None
    documents: list[SpanSource] = []

    @property
    def length(self) -> int:
        return self.end - self.start


class Memorization(_Record):
    traced: bool
    reason: str | None = None  # why not traced
    min_span_tokens: int
    tokens: int = 0  # generated tokens traced
    memorized_tokens: int = 0  # of them, inside a span of ≥ min_span_tokens
    ratio: float | None = None
    spans: int = 0  # spans of ≥ min_span_tokens
    longest: list[MemorizedSpan] = []  # the LONGEST_SPANS longest, longest first


def _spans(check: str, body: Any, url: str) -> tuple[int, list[MemorizedSpan]]:
    """(the output's tokens, its spans) from a /v1/trace answer."""
    try:
        tokens = int(body["tokens"])
        spans = [MemorizedSpan(check=check, start=int(s["start"]), end=int(s["end"]), count=int(s["count"]),
                               text=s.get("text"),
                               documents=[SpanSource(url=d.get("url"), record_id=d.get("record_id"))
                                          for d in s.get("documents") or []])
                 for s in body["spans"]]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise EndpointError(f"{url}: unexpected answer for check {check!r}: {str(body)[:200]}") from exc
    return tokens, spans


def measure_memorization(client: InferenceClient, outputs: list[tuple[str, str]],
                         config: MemorizationSection) -> Memorization:
    """Trace each (check id, output text); see the module docstring."""
    min_length = config.min_span_tokens
    tokens = memorized = 0
    spans: list[MemorizedSpan] = []
    for check, text in outputs:
        if not text:
            continue
        try:
            body = client.trace(text, min_span_tokens=min_length, max_documents=MAX_DOCUMENTS)
            output_tokens, found = _spans(check, body, client.trace_url)
        except (RouteUnavailable, EndpointError, InputError) as exc:
            # a trace that failed (busy or timed out past the retries, an output over trace.max_tokens, a bad
            # answer) costs the measurement, not the run's perplexity and scores
            log.warning("memorization_not_traced", check=check, reason=str(exc))
            return Memorization(traced=False, reason=f"check {check!r}: {exc}", min_span_tokens=min_length)
        found = [span for span in found if span.length >= min_length]
        tokens += output_tokens
        memorized += covered_tokens(((s.start, s.end) for s in found), min_length)
        spans += found
    longest = sorted(spans, key=lambda s: -s.length)[:LONGEST_SPANS]  # stable: ties keep the check order
    result = Memorization(traced=True, min_span_tokens=min_length, tokens=tokens, memorized_tokens=memorized,
                          ratio=memorized / tokens if tokens else 0.0, spans=len(spans), longest=longest)
    log.info("memorization_traced", tokens=tokens, memorized_tokens=memorized, ratio=result.ratio,
             spans=len(spans), min_span_tokens=min_length)
    return result
