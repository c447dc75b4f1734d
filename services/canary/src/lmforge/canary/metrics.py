"""The canary's Prometheus metrics (docs/design.md names), pushed to a Pushgateway once per run.

Gauges, in a fresh registry per run:
- lmforge_canary_passed                      1 pass, 0 regression (alert: == 0)
- lmforge_canary_score                       fraction of continuation checks passed
- lmforge_canary_perplexity                  pooled perplexity of the held-out texts
- lmforge_canary_last_run_timestamp_seconds  end of the run, Unix time (alert on staleness)
- lmforge_canary_duration_seconds            how long the evaluation took
- lmforge_canary_baseline_present            1 when compared with a baseline, else 0
- lmforge_canary_baseline_perplexity, lmforge_canary_baseline_score   (only with a baseline)
- lmforge_canary_memorized_token_ratio       share of the checks' generated tokens inside spans of
                                             ≥ memorization.min_span_tokens found verbatim in the
                                             training data (only when traced: alert above a threshold)
- lmforge_canary_memorized_spans             how many such spans (only when traced)

Pushed with PUT (the group's previous metrics are replaced) under job `push.job`
("lmforge-canary") and the grouping key {model: MODEL, **push.grouping}."""

from __future__ import annotations

import time

from prometheus_client import Gauge, push_to_gateway

from lmforge.canary.baseline import Baseline
from lmforge.canary.compare import Verdict
from lmforge.canary.config import PushSection
from lmforge.canary.evaluate import EvalResult
from lmforge.common.errors import LmforgeError
from lmforge.common.logging import get_logger
from lmforge.common.metrics import new_registry
from lmforge.common.retry import RetryPolicy, describe

log = get_logger("canary")
PUSH_BACKOFF_SECONDS = 0.5  # the first retry's wait at most; doubles, with full jitter
PUSH_BACKOFF_MAX_SECONDS = 5.0


class PushError(LmforgeError):
    """The Pushgateway did not take the metrics."""

    exit_code = 4


def build_registry(result: EvalResult, verdict: Verdict, baseline: Baseline | None, now: float | None = None):
    registry = new_registry()

    def gauge(name: str, doc: str, value: float) -> None:
        Gauge(name, doc, registry=registry).set(value)

    gauge("lmforge_canary_passed", "1 when the canary passed, 0 on regression", 1 if verdict.passed else 0)
    gauge("lmforge_canary_score", "Fraction of the canary's continuation checks that passed", result.score)
    gauge("lmforge_canary_perplexity", "Perplexity on the canary's held-out texts, pooled by token",
          result.perplexity)
    gauge("lmforge_canary_last_run_timestamp_seconds", "When the last canary run ended (Unix time)",
          time.time() if now is None else now)
    gauge("lmforge_canary_duration_seconds", "Duration of the last canary evaluation", result.seconds)
    gauge("lmforge_canary_baseline_present", "1 when the run was compared with a baseline",
          1 if baseline is not None else 0)
    if baseline is not None:
        gauge("lmforge_canary_baseline_perplexity", "Perplexity recorded in the canary baseline", baseline.perplexity)
        gauge("lmforge_canary_baseline_score", "Score recorded in the canary baseline", baseline.score)
    memorization = result.memorization
    if memorization is not None and memorization.traced:
        gauge("lmforge_canary_memorized_token_ratio", "Share of the canary's generated tokens inside spans of at "
              "least memorization.min_span_tokens tokens found verbatim in the training data", memorization.ratio)
        gauge("lmforge_canary_memorized_spans", "Spans of the canary's outputs found verbatim in the training "
              "data (at least memorization.min_span_tokens tokens)", memorization.spans)
    return registry


def grouping_key(model: str, push: PushSection) -> dict[str, str]:
    return {"model": model, **push.grouping}


def push(gateway: str, registry, model: str, config: PushSection) -> dict[str, str]:
    """PUT the registry to the Pushgateway, retrying; returns the grouping key. Raises PushError."""
    key, gateway = grouping_key(model, config), gateway.rstrip("/")
    # Every error (URLError, HTTPError, OSError, timeouts) means "not pushed": all are retried.
    retry = RetryPolicy(config.attempts, PUSH_BACKOFF_SECONDS, PUSH_BACKOFF_MAX_SECONDS, log=log, event="push_retry")
    try:
        retry.call(f"push to {gateway}", lambda: push_to_gateway(
            gateway, job=config.job, registry=registry, grouping_key=key, timeout=config.timeout_seconds),
            pushgateway=gateway)
    except Exception as exc:
        raise PushError(f"cannot push to the Pushgateway {gateway} after {config.attempts} attempt(s): "
                        f"{describe(exc)}") from exc
    return key
