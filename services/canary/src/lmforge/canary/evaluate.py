"""Run an eval set against the endpoint: per-item results, pooled perplexity, score.

perplexity = exp(−Σ logprob / Σ scored tokens) over all held-out texts pooled by token (a
text's first token is not scored); score = checks passed / checks; with `memorization` enabled, the
share of the checks' generated tokens found verbatim in the training data (memorization.py). The
result is also the body of a baseline file (baseline.py adds its header)."""

from __future__ import annotations

import datetime as dt
import math
import time

from pydantic import BaseModel, ConfigDict

from lmforge.canary.client import InferenceClient
from lmforge.canary.config import MemorizationSection
from lmforge.canary.evalset import EvalSet, continuation_passes
from lmforge.canary.memorization import Memorization, measure_memorization
from lmforge.common.logging import get_logger

log = get_logger("canary")


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextResult(_Record):
    id: str
    tokens: int  # scored tokens (all but the first)
    total_logprob: float
    perplexity: float


class CheckResult(_Record):
    id: str
    passed: bool
    output: str
    finish_reason: str | None = None


class EvalSetRef(_Record):
    name: str
    sha256: str


class EvalResult(_Record):
    model: str
    endpoint: str
    eval_set: EvalSetRef
    started: str  # ISO 8601, UTC
    seconds: float
    perplexity: float
    tokens: int
    score: float
    checks_passed: int
    checks_total: int
    held_out: list[TextResult]
    checks: list[CheckResult]
    memorization: Memorization | None = None  # None: not measured (memorization.enabled false)

    def check(self, check_id: str) -> CheckResult | None:
        return next((c for c in self.checks if c.id == check_id), None)

    def text(self, text_id: str) -> TextResult | None:
        return next((t for t in self.held_out if t.id == text_id), None)


def pooled_perplexity(texts: list[TextResult]) -> float:
    tokens = sum(t.tokens for t in texts)
    return math.exp(-sum(t.total_logprob for t in texts) / tokens)


def evaluate(client: InferenceClient, evalset: EvalSet, default_max_tokens: int,
             memorization: MemorizationSection | None = None) -> EvalResult:
    started, clock = dt.datetime.now(dt.UTC), time.monotonic()
    model = client.model_name()
    log.info("canary_started", endpoint=client.endpoint, model=model, eval_set=evalset.name or None,
             held_out=len(evalset.held_out), checks=len(evalset.checks))
    texts = []
    for item in evalset.held_out:
        logprobs = client.score(item.text, item=f"held_out {item.id!r}")
        total = sum(logprobs)
        result = TextResult(id=item.id, tokens=len(logprobs), total_logprob=total,
                            perplexity=math.exp(-total / len(logprobs)))
        log.info("held_out_scored", id=item.id, tokens=result.tokens, perplexity=round(result.perplexity, 6))
        texts.append(result)
    checks = []
    for item in evalset.checks:
        output, finish_reason = client.complete(item.prompt, item.max_tokens or default_max_tokens, item.stop,
                                                item=f"check {item.id!r}")
        result = CheckResult(id=item.id, passed=continuation_passes(output, item.expected), output=output,
                             finish_reason=finish_reason)
        log.info("check_done", id=item.id, passed=result.passed, output=output, expected=item.expected)
        checks.append(result)
    passed = sum(c.passed for c in checks)
    memorized = None
    if memorization is not None and memorization.enabled:
        memorized = measure_memorization(client, [(c.id, c.output) for c in checks], memorization)
    return EvalResult(model=model, endpoint=client.endpoint,
                      eval_set=EvalSetRef(name=evalset.name, sha256=evalset.sha256),
                      started=started.isoformat(timespec="seconds"), seconds=round(time.monotonic() - clock, 3),
                      perplexity=pooled_perplexity(texts), tokens=sum(t.tokens for t in texts),
                      score=passed / len(checks), checks_passed=passed, checks_total=len(checks),
                      held_out=texts, checks=checks, memorization=memorized)
