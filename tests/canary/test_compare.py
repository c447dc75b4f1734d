"""The regression rules, on hand-made results."""

from __future__ import annotations

import math

from lmforge.canary.baseline import Baseline
from lmforge.canary.compare import compare
from lmforge.canary.config import ToleranceSection
from lmforge.canary.evaluate import CheckResult, EvalResult, EvalSetRef, TextResult


def result(perplexity: float, passed: list[bool], model: str = "m") -> EvalResult:
    tokens = 100
    checks = [CheckResult(id=f"c{i}", passed=p, output="x") for i, p in enumerate(passed)]
    return EvalResult(model=model, endpoint="http://x", eval_set=EvalSetRef(name="", sha256="0"),
                      started="2025-01-01T00:00:00+00:00", seconds=1.0, perplexity=perplexity, tokens=tokens,
                      score=sum(passed) / len(passed), checks_passed=sum(passed), checks_total=len(passed),
                      held_out=[TextResult(id="t", tokens=tokens, total_logprob=-tokens * math.log(perplexity)
                                           if perplexity > 0 else 0.0, perplexity=perplexity)],
                      checks=checks)


def baseline(perplexity: float, passed: list[bool]) -> Baseline:
    return Baseline(**result(perplexity, passed, model="base").model_dump(), recorded="2025-01-01T00:00:00+00:00")


TOL = ToleranceSection(max_perplexity_increase_ratio=0.1, max_score_drop=0.1)


def test_within_tolerance_passes():
    verdict = compare(result(10.9, [True] * 9 + [False]), baseline(10.0, [True] * 10), TOL)
    assert verdict.passed and verdict.reasons == []
    assert verdict.newly_failing == ["c9"]
    assert any("compared with the baseline of model 'base'" in n for n in verdict.notes)


def test_perplexity_and_score_beyond_tolerance_regress():
    verdict = compare(result(11.5, [True] * 8 + [False] * 2), baseline(10.0, [True] * 10), TOL)
    assert not verdict.passed
    assert verdict.reasons[0] == "perplexity 11.5 is +15.0% vs the baseline 10 (tolerance +10.0%)"
    assert verdict.reasons[1].startswith("score 0.800 (8/10 checks) is 0.200 below the baseline 1.000")
    assert verdict.reasons[1].endswith("newly failing: c8, c9")


def test_nan_never_passes():
    verdict = compare(result(float("nan"), [True]), baseline(10.0, [True]), TOL)
    assert not verdict.passed and verdict.reasons[0].startswith("perplexity nan")


def test_no_baseline_passes_with_a_note_unless_an_absolute_limit_is_broken():
    verdict = compare(result(50.0, [False, True]), None, TOL)
    assert verdict.passed and not verdict.has_baseline and "no baseline" in verdict.notes[0]
    limits = TOL.model_copy(update={"max_perplexity": 20.0, "min_score": 0.75})
    verdict = compare(result(50.0, [False, True]), None, limits)
    assert not verdict.passed
    assert verdict.reasons == ["perplexity 50 is above the limit max_perplexity=20",
                               "score 0.500 is below the limit min_score=0.750"]
