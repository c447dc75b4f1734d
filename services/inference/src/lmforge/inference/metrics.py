"""The serving metrics (docs/design.md names; semantics mirror vLLM's so its PromQL carries over).
Every series has a `model_name` label. A gauge is absent until it has a value, never a made-up 0:
the engine's series (running, waiting, the KV-cache pool, and its counters of preemptions, prefix-cache
lookups and prefill tokens) appear once the engine exists, model_info once the model is loaded, GPU
series only when a GPU is present and NVML reads it."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from lmforge.common.metrics import counter_family, gauge_family, new_registry
from lmforge.inference.engine import Sequence
from lmforge.inference.stats import EngineStats

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0)
PER_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                     1.0, 2.5, 5.0)
REQUEST_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)
TRACE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
P = "lmforge_inference_"


class ServeMetrics:
    def __init__(self, model_name: str, device: str, counts: Callable[[], tuple[int, int] | None],
                 stats: Callable[[], EngineStats | None]):
        """`counts` (running, waiting) and the engine's `stats` are read at scrape time; None: no engine yet."""
        self.registry = new_registry()
        self.model_name = model_name
        labels = ["model_name"]
        r = self.registry
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Arrival to first generated token.", labels,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram(P + "time_per_output_token_seconds", "Time between generated tokens after the first.",
                              labels, buckets=PER_TOKEN_BUCKETS, registry=r)
        self.latency = Histogram(P + "request_latency_seconds", "Arrival to last token (end to end).", labels,
                                 buckets=REQUEST_BUCKETS, registry=r)
        self.queue_time = Histogram(P + "queue_time_seconds", "Time waiting for a KV-cache slot.", labels,
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.prefill_time = Histogram(P + "prefill_time_seconds", "Prefill of the prompt.", labels,
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.decode_time = Histogram(P + "decode_time_seconds", "First to last generated token.", labels,
                                     buckets=REQUEST_BUCKETS, registry=r)
        self.requests = Counter(P + "requests_total", "Requests by HTTP status.", labels + ["status"], registry=r)
        self.finished = Counter(P + "finished_requests_total", "Generations by finish reason.",
                                labels + ["finish_reason"], registry=r)
        self.prompt_tokens = Counter(P + "prompt_tokens_total", "Prompt tokens processed.", labels, registry=r)
        self.generation_tokens = Counter(P + "generation_tokens_total", "Tokens generated.", labels, registry=r)
        r.register(EngineCollector(model_name, counts, stats))
        self.model_info = Gauge(P + "model_info", "The served model (value 1, once loaded).",
                                labels + ["version", "step", "device"], registry=r)
        self.model_swaps = Counter(P + "model_swaps_total", "Model pointer changes acted on: swapped (the new "
                                   "package serves) or refused (it did not verify or load; the old one serves on).",
                                   labels + ["outcome"], registry=r)
        self.pointer_read_errors = Counter(P + "model_pointer_read_errors_total",
                                           "Failed reads of the model pointer (the served model is kept).", labels,
                                           registry=r)
        self.trace = TraceMetrics(r, model_name)
        self.device = device
        if device.startswith("cuda"):
            gpu = NvmlCollector(model_name)
            if gpu.available:
                r.register(gpu)

    def set_model_info(self, version: str, step: int | None) -> None:
        """The one served model (a swap replaces the series)."""
        self.model_info.clear()
        self.model_info.labels(self.model_name, version, "" if step is None else str(step), self.device).set(1)

    def observe_swap(self, outcome: str) -> None:
        self.model_swaps.labels(self.model_name, outcome).inc()

    def observe_pointer_read_error(self) -> None:
        self.pointer_read_errors.labels(self.model_name).inc()

    def observe_request(self, status: int) -> None:
        self.requests.labels(self.model_name, str(status)).inc()

    def observe_generation(self, seq: Sequence, finish_reason: str, ended_at: float, generated: int) -> None:
        """Histograms and counters of a generation that has ended: completed, stopped (also by a
        stop string the API found) or cancelled. Timestamps are the engine's time.monotonic()."""
        name = self.model_name
        self.finished.labels(name, finish_reason).inc()
        self.prompt_tokens.labels(name).inc(len(seq.prompt))
        self.generation_tokens.labels(name).inc(generated)
        if seq.scheduled_at is not None:
            self.queue_time.labels(name).observe(seq.scheduled_at - seq.arrived)
        if seq.first_token_at is None:
            return
        self.ttft.labels(name).observe(seq.first_token_at - seq.arrived)
        self.prefill_time.labels(name).observe(seq.first_token_at - seq.scheduled_at)
        self.decode_time.labels(name).observe(ended_at - seq.first_token_at)
        self.latency.labels(name).observe(ended_at - seq.arrived)
        if generated > 1:
            self.tpot.labels(name).observe((ended_at - seq.first_token_at) / (generated - 1))


class TraceMetrics:
    """/v1/trace's series (the inference server's, and the standalone trace service's beside vLLM): latency by
    outcome (ok, busy, timeout, too_long, invalid, unavailable), spans reported, and the loaded index's size
    (absent until an index is loaded)."""

    def __init__(self, registry, model_name: str):
        labels = ["model_name"]
        self.model_name = model_name
        self.latency = Histogram(P + "trace_request_latency_seconds", "Trace requests from arrival to answer, by "
                                 "outcome.", labels + ["outcome"], buckets=TRACE_BUCKETS, registry=registry)
        self.spans = Counter(P + "trace_spans", "Spans reported by traces.", labels, registry=registry)
        self.index_tokens = Gauge(P + "trace_index_tokens", "Training tokens in the loaded trace index.", labels,
                                  registry=registry)
        self.index_bytes = Gauge(P + "trace_index_bytes", "Bytes of the loaded trace index's files.", labels,
                                 registry=registry)
        self.index_partitions = Gauge(P + "trace_index_partitions", "Partitions of the loaded trace index.", labels,
                                      registry=registry)

    def set_index(self, tokens: int, size: int, partitions: int) -> None:
        self.index_tokens.labels(self.model_name).set(tokens)
        self.index_bytes.labels(self.model_name).set(size)
        self.index_partitions.labels(self.model_name).set(partitions)
        self.spans.labels(self.model_name)  # 0 from now on, not absent

    def observe(self, outcome: str, seconds: float, spans: int = 0) -> None:
        self.latency.labels(self.model_name, outcome).observe(seconds)
        if spans:
            self.spans.labels(self.model_name).inc(spans)


# The engine's counters (EngineStats fields), exposed as lmforge_inference_<field>_total.
ENGINE_COUNTERS = {
    "preemptions": "Running sequences preempted for lack of KV-cache blocks (recomputed later).",
    "prefix_cache_queries": "Prompt tokens looked up in the prefix cache.",
    "prefix_cache_hits": "Prompt tokens found in the prefix cache (not prefilled again).",
    "prefill_tokens": "Tokens computed by prefill (recomputation included, prefix-cache hits not).",
}


class EngineCollector:
    """The engine's series, read at scrape time: gauges of the batch and the KV-cache pool, and
    the counters the engine keeps (a new engine after a model swap starts them at 0, which rate()
    takes for a reset). No sample before the engine exists (while the model loads, or after it
    failed to)."""

    def __init__(self, model_name: str, counts: Callable[[], tuple[int, int] | None],
                 stats: Callable[[], EngineStats | None]):
        self.model_name, self.counts, self.stats = model_name, counts, stats

    def collect(self):
        counts, stats = self.counts(), self.stats()
        running, waiting = counts if counts is not None else (None, None)
        labels = {"model_name": self.model_name}

        def read(field: str) -> float | None:
            return None if stats is None else getattr(stats, field)

        yield gauge_family(P + "requests_running", "Sequences in the running batch.", running, labels)
        yield gauge_family(P + "requests_waiting", "Requests waiting to be admitted.", waiting, labels)
        yield gauge_family(P + "kv_cache_usage_ratio", "Fraction of KV-cache blocks in use.", read("kv_cache_usage"),
                           labels)
        yield gauge_family(P + "kv_cache_blocks", "KV-cache blocks in the pool.", read("kv_blocks_total"), labels)
        yield gauge_family(P + "kv_cache_blocks_in_use", "KV-cache blocks held by running sequences.",
                           read("kv_blocks_in_use"), labels)
        for field, documentation in ENGINE_COUNTERS.items():
            yield counter_family(P + field, documentation, read(field), labels)


class NvmlCollector:
    """GPU utilization and memory from NVML at scrape time."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.available = bool(self._handles)
        except Exception:  # noqa: BLE001 - no driver: no GPU series
            self.available = False

    def collect(self):
        utilization = GaugeMetricFamily(P + "gpu_utilization_ratio", "GPU busy fraction (NVML).",
                                        labels=["model_name", "gpu"])
        memory = GaugeMetricFamily(P + "gpu_memory_used_bytes", "GPU memory in use (NVML).",
                                   labels=["model_name", "gpu"])
        for index, handle in enumerate(self._handles):
            try:
                busy = self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100
                used = self._nvml.nvmlDeviceGetMemoryInfo(handle).used
            except self._nvml.NVMLError:  # a GPU NVML cannot read now: no sample, and the scrape still succeeds
                continue
            utilization.add_metric([self.model_name, str(index)], busy)
            memory.add_metric([self.model_name, str(index)], used)
        yield utilization
        yield memory
