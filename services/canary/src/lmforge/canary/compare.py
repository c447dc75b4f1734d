"""The regression rules: a run against its baseline (and optional absolute limits) → a verdict
with the reasons, each one sentence naming the numbers and the tolerance.

With a baseline:
- perplexity regressed when perplexity > baseline × (1 + max_perplexity_increase_ratio);
- score regressed when score < baseline score − max_score_drop (the reason names the checks
  that passed in the baseline and fail now).
With or without one: perplexity > max_perplexity, score < min_score (when configured).
NaN never passes. No baseline and no absolute limit: passed, with a note saying so."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lmforge.canary.baseline import Baseline
from lmforge.canary.config import ToleranceSection
from lmforge.canary.evaluate import EvalResult


@dataclass
class Verdict:
    passed: bool
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    newly_failing: list[str] = field(default_factory=list)  # check ids: passed in the baseline, fail now
    has_baseline: bool = False


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def compare(result: EvalResult, baseline: Baseline | None, tolerance: ToleranceSection) -> Verdict:
    reasons: list[str] = []
    notes: list[str] = []
    newly_failing: list[str] = []
    ppl, score = result.perplexity, result.score
    if baseline is not None:
        limit = baseline.perplexity * (1 + tolerance.max_perplexity_increase_ratio)
        if not ppl <= limit:  # NaN included
            change = (ppl / baseline.perplexity - 1) * 100 if baseline.perplexity else math.inf
            reasons.append(f"perplexity {_fmt(ppl)} is {change:+.1f}% vs the baseline {_fmt(baseline.perplexity)} "
                           f"(tolerance +{tolerance.max_perplexity_increase_ratio * 100:.1f}%)")
        newly_failing = [c.id for c in result.checks
                         if not c.passed and (b := baseline.check(c.id)) is not None and b.passed]
        if not score >= baseline.score - tolerance.max_score_drop - 1e-9:
            failing = f"; newly failing: {', '.join(newly_failing)}" if newly_failing else ""
            reasons.append(f"score {score:.3f} ({result.checks_passed}/{result.checks_total} checks) is "
                           f"{baseline.score - score:.3f} below the baseline {baseline.score:.3f} "
                           f"(tolerance {tolerance.max_score_drop:.3f}){failing}")
        if baseline.model != result.model:
            notes.append(f"model {result.model!r} compared with the baseline of model {baseline.model!r}")
    else:
        notes.append("no baseline: nothing to compare with (record one with `lmforge-canary make-baseline`)")
    if tolerance.max_perplexity is not None and not ppl <= tolerance.max_perplexity:
        reasons.append(f"perplexity {_fmt(ppl)} is above the limit max_perplexity={_fmt(tolerance.max_perplexity)}")
    if tolerance.min_score is not None and not score >= tolerance.min_score:
        reasons.append(f"score {score:.3f} is below the limit min_score={tolerance.min_score:.3f}")
    return Verdict(passed=not reasons, reasons=reasons, notes=notes, newly_failing=newly_failing,
                   has_baseline=baseline is not None)
