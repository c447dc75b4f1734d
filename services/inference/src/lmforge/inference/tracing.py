"""OpenTelemetry: a tracer provider for the service (OTLP/HTTP export to
OTEL_EXPORTER_OTLP_ENDPOINT when set, or a given exporter in tests) and the spans of one
generation (queue wait, prefill, decode), written after the fact from the engine's
monotonic timestamps as children of the request's span."""

from __future__ import annotations

import os
import time

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter

from lmforge.inference.engine import Sequence


def tracer_provider(service_name: str, exporter: SpanExporter | None = None) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def trace_id_of(span: trace.Span) -> str | None:
    context = span.get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


class MonotonicClock:
    """time.monotonic() seconds → epoch nanoseconds, as OpenTelemetry wants them."""

    def __init__(self):
        self.offset_ns = time.time_ns() - time.monotonic_ns()

    def epoch_ns(self, monotonic_seconds: float) -> int:
        return self.offset_ns + int(monotonic_seconds * 1e9)


def record_generation_spans(tracer: trace.Tracer, parent: trace.Span, seq: Sequence, ended_at: float,
                            clock: MonotonicClock) -> None:
    context = trace.set_span_in_context(parent)
    phases = [("queue", seq.arrived, seq.scheduled_at), ("prefill", seq.scheduled_at, seq.first_token_at),
              ("decode", seq.first_token_at, ended_at)]
    for name, start, end in phases:
        if start is None or end is None:
            return
        span = tracer.start_span(f"inference.{name}", context=context, start_time=clock.epoch_ns(start))
        if name == "prefill":
            span.set_attribute("lmforge.prompt_tokens", len(seq.prompt))
        elif name == "decode":
            span.set_attribute("lmforge.generated_tokens", len(seq.output))
        span.end(end_time=clock.epoch_ns(end))
