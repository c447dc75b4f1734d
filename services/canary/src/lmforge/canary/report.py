"""The human-readable table of a run (the CLI writes it to stderr; stdout carries only the JSON
log lines). Its last block is `RESULT: PASS` or `RESULT: REGRESSION` with one line per reason."""

from __future__ import annotations

from lmforge.canary.baseline import Baseline
from lmforge.canary.compare import Verdict
from lmforge.canary.evalset import EvalSet
from lmforge.canary.evaluate import EvalResult
from lmforge.canary.memorization import Memorization

OUTPUT_CHARS = 48
SPAN_CHARS = 80


def _short(text: str, limit: int = OUTPUT_CHARS) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def _change(value: float, base: float | None) -> str:
    if base is None or base == 0:
        return "-"
    return f"{(value / base - 1) * 100:+.1f}%"


def _memorization_lines(memorization: Memorization | None) -> list[str]:
    if memorization is None:
        return ["memorization: not measured (memorization.enabled is false)"]
    if not memorization.traced:
        return [f"memorization: not traced ({memorization.reason})"]
    lines = [f"memorization: {memorization.ratio:.2%} of {memorization.tokens} generated tokens "
             f"({memorization.memorized_tokens}) inside {memorization.spans} span(s) of ≥ "
             f"{memorization.min_span_tokens} tokens found verbatim in the training data"]
    if memorization.longest:
        lines.append(f"longest spans:  {'check':<12}  {'tokens':>6}  {'count':>6}  source (url, record id)  text")
    for span in memorization.longest:
        first = span.documents[0] if span.documents else None
        source = f"{first.url or '-'} {first.record_id or '-'}" if first else "-"
        more = f" (+{len(span.documents) - 1} more)" if len(span.documents) > 1 else ""
        lines.append(f"{'':<16}{span.check[:12]:<12}  {span.length:>6}  {span.count:>6}  {source}{more}  "
                     f"{_short(span.text or '', SPAN_CHARS)}")
    return lines


def render(result: EvalResult, evalset: EvalSet, verdict: Verdict | None, baseline: Baseline | None,
           baseline_uri: str | None, tolerance, push_status: str | None) -> str:
    width = min(32, max([13, *(len(t.id) for t in result.held_out), *(len(c.id) for c in result.checks)]))
    name = f" {evalset.name!r}" if evalset.name else ""
    lines = [f"lmforge canary: model {result.model!r} at {result.endpoint}, eval set{name} "
             f"({len(result.held_out)} held-out texts, {result.checks_total} checks, {result.seconds:.1f}s)"]
    if baseline is not None:
        lines.append(f"baseline: {baseline_uri} (model {baseline.model!r}, recorded {baseline.recorded})")
    elif baseline_uri:
        lines.append(f"baseline: none found at {baseline_uri}")
    lines += ["", f"{'held-out text':<{width}}  {'tokens':>6}  {'perplexity':>10}  {'baseline':>10}  {'change':>8}"]
    for text in result.held_out:
        base = baseline.text(text.id) if baseline is not None else None
        base_ppl = base.perplexity if base is not None else None
        lines.append(f"{text.id[:width]:<{width}}  {text.tokens:>6}  {text.perplexity:>10.4f}  "
                     f"{'-' if base_ppl is None else f'{base_ppl:.4f}':>10}  {_change(text.perplexity, base_ppl):>8}")
    base_ppl = baseline.perplexity if baseline is not None else None
    pooled = (f"{'all (pooled)':<{width}}  {result.tokens:>6}  {result.perplexity:>10.4f}  "
              f"{'-' if base_ppl is None else f'{base_ppl:.4f}':>10}  {_change(result.perplexity, base_ppl):>8}")
    if baseline is not None:
        pooled += f"  (tolerance +{tolerance.max_perplexity_increase_ratio * 100:.1f}%)"
    lines += [pooled, "", f"{'check':<{width}}  {'result':<6}  output"]
    expected = {c.id: c.expected for c in evalset.checks}
    for check in result.checks:
        line = f"{check.id[:width]:<{width}}  {'pass' if check.passed else 'FAIL':<6}  {_short(check.output)}"
        if not check.passed:
            line += f"  expected {_short(expected.get(check.id, ''))}"
            if verdict is not None and check.id in verdict.newly_failing:
                line += "  (passed in the baseline)"
        lines.append(line)
    score = f"{'score':<{width}}  {result.score:.3f} ({result.checks_passed}/{result.checks_total})"
    if baseline is not None:
        score += f"  baseline {baseline.score:.3f}  (tolerance -{tolerance.max_score_drop:.3f})"
    lines += [score, "", *_memorization_lines(result.memorization), ""]
    if push_status:
        lines.append(f"pushgateway: {push_status}")
    if verdict is not None:
        lines += [f"note: {note}" for note in verdict.notes]
        lines.append("RESULT: PASS" if verdict.passed else "RESULT: REGRESSION")
        lines += [f"  - {reason}" for reason in verdict.reasons]
    return "\n".join(lines) + "\n"
