"""The training report: RUN_DIR/report.html, one self-contained page drawn from metrics.jsonl.

Loss (train and val), learning rate, gradient norm, tokens/s and MFU over steps as inline SVG
line charts, one line per attempt, so the steps a resumed attempt computed again show over the
first attempt's; committed checkpoints and each resume point are marked on every chart. Inline
CSS, no JavaScript, nothing fetched: the page opens from a laptop, a ticket or a bucket as it is.
This module computes what the page shows; templates/report.html lays it out (autoescaped, on the
shared layout of lmforge.pages.html_pages).

A run of several stages (lmforge.trainer.schedule: its `stage` records) also gets a Schedule
section: global batch, sequence length and mixture weights per source as the stage records set
them, and the learning rate, over consumed tokens rather than steps (a stage starts at a token
count, and a batch ramp makes steps uneven), each stage's start marked and named, with a table of
the stages. Evaluations of several sources add their per-source val losses over steps. A file
written before stage records and token counts existed draws as before, without those.

With checkpoint evaluation on, RUN_DIR/evals.jsonl (the uploader's `checkpoint_eval` records,
lmforge.trainer.metrics_file) adds a chart per task metric over consumed tokens (each evaluated
checkpoint's score and the best so far, the maximum as the eval job's best-score gauge takes it),
one of the held-out loss per source, the promoted checkpoint and the regressed ones marked on each,
and the counts (evaluated, skipped, failed; best and promoted step) at the top. A missing file or a
half-written last line draws what there is.

The trainer rewrites it (rank 0) at each committed checkpoint and when the attempt ends;
`lmforge-train report --run-dir DIR` draws it from any metrics.jsonl.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lmforge.common.atomic_files import atomic_write_bytes
from lmforge.pages.chart_axes import nice_ticks
from lmforge.pages.formatting import SI_SUFFIXES, duration, number, percent
from lmforge.pages.html_pages import render
from lmforge.pages.line_chart import Frame, LegendItem, Line, LineChart, Marker, line_chart
from lmforge.trainer.mesh_layout import MESH_AXES
from lmforge.trainer.metrics_file import (
    EVALS_FILE,
    attempt_of,
    by_attempt,
    latest_per_step,
    read_checkpoint_evals,
    read_records,
)

REPORT_FILE = "report.html"
MAX_POINTS = 2000  # per line; longer ones are thinned evenly (the last point is always kept)
FRAME = Frame(width=960, height=280, left=84, right=16, top=22, bottom=44)
ATTEMPT_COLORS = ("#2563eb", "#0d9488", "#7c3aed", "#db2777", "#ca8a04", "#475569")
CHECKPOINT_COLOR, RESUME_COLOR, STAGE_COLOR = "#16a34a", "#ea580c", "#475569"
SETTING_COLOR = "#2563eb"  # a stage setting's line (global batch, sequence length)
SOURCE_COLORS = ("#2563eb", "#db2777", "#0d9488", "#ca8a04", "#7c3aed", "#dc2626", "#0891b2", "#65a30d")


def _finite(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


# ---------------------------------------------------------------- the run, read once


@dataclass
class Attempt:
    number: int
    start: dict | None  # its start record (None in a file written before start records existed)
    steps: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    end: dict | None = None  # None: killed (or still running)

    @property
    def resumed_from(self) -> int | None:
        return self.start.get("resumed_from") if self.start else None

    @property
    def color(self) -> str:
        return ATTEMPT_COLORS[(self.number - 1) % len(ATTEMPT_COLORS)]

    @property
    def outcome(self) -> str:
        if self.end is not None:
            return str(self.end.get("status", "ended"))
        return "no end record: killed, or still running"

    @property
    def seconds(self) -> float | None:
        stamps = [t for r in (self.start, *self.steps, self.end) if r and (t := _finite(r.get("timestamp")))]
        return max(stamps) - min(stamps) if len(stamps) > 1 else None


@dataclass
class RunView:
    attempts: list[Attempt]
    steps: list[dict]  # each step once, the newest attempt's record
    evals: list[dict]
    target_steps: int | None
    stages: list[dict] = field(default_factory=list)  # each stage's record once, in the order they start

    @classmethod
    def of(cls, records: list[dict]) -> RunView:
        starts = {attempt_of(r): r for r in records if r.get("kind") == "start"}
        steps, evals = by_attempt(records, "step"), by_attempt(records, "eval")
        numbers = sorted({*starts, *steps, *evals, *(attempt_of(r) for r in records)})
        attempts = {n: Attempt(n, starts.get(n), steps.get(n, []), evals.get(n, [])) for n in numbers}
        for record in records:
            if record.get("kind") == "checkpoint":
                attempts[attempt_of(record)].checkpoints.append(record["step"])
            elif record.get("kind") == "end":
                attempts[attempt_of(record)].end = record
        targets = [s["steps"] for s in starts.values() if isinstance(s.get("steps"), int)]
        # a resumed attempt records its stage again: the newest record of each stage holds
        stages = {r["stage"]: r for r in records if r.get("kind") == "stage" and isinstance(r.get("stage"), int)}
        return cls(
            list(attempts.values()),
            latest_per_step(records),
            latest_per_step(records, "eval"),
            targets[-1] if targets else None,
            sorted(stages.values(), key=lambda r: (_finite(r.get("start_tokens")) or 0.0, r["stage"])),
        )

    @property
    def checkpoints(self) -> list[tuple[int, int]]:
        """(step, attempt) of every committed checkpoint."""
        return [(step, a.number) for a in self.attempts for step in a.checkpoints]

    @property
    def resumes(self) -> list[Attempt]:
        return [a for a in self.attempts if a.resumed_from is not None]

    @property
    def last_step(self) -> int:
        return max((r["step"] for r in self.steps), default=0)


# ---------------------------------------------------------------- the page's data


def _series(records: list[dict], key: str) -> list[tuple[float, float]]:
    return [(r["step"], v) for r in records if (v := _finite(r.get(key))) is not None]


@dataclass(frozen=True)
class Metric:
    name: str
    title: str
    key: str
    axis: str  # the y axis' title
    fmt: Callable[[float, int], str]  # a tick's label: (value, significant digits)
    missing: str = "no values logged"


METRICS = (
    Metric("lr", "Learning rate", "lr", "learning rate", number),
    Metric("grad_norm", "Gradient norm (before clipping)", "grad_norm", "gradient norm (L2)", number),
    Metric("tokens_per_second", "Tokens per second (all ranks)", "tokens_per_second", "tokens / second", number),
    Metric(
        "mfu",
        "MFU (model FLOPs utilization per device)",
        "mfu",
        "MFU (% of peak FLOP/s)",
        lambda v, _digits: percent(v),
        "n/a: no peak FLOP/s is known for this device (on CPU, or set metrics.peak_flops)",
    ),
)


# Drawn for a mixture-of-experts run only (its step records carry these keys; mean over layers and ranks).
MOE_METRICS = (
    Metric(
        "moe_load_max_over_mean",
        "MoE expert load (busiest expert over the mean)",
        "moe_load_max_over_mean",
        "assignments, max / mean",
        number,
    ),
    Metric(
        "moe_dropped_fraction",
        "MoE dropped tokens (over an expert's capacity)",
        "moe_dropped_fraction",
        "dropped (% of token-expert assignments)",
        lambda v, _digits: percent(v),
    ),
    Metric(
        "moe_balance_loss",
        "MoE load-balancing loss (before its coefficient)",
        "moe_balance_loss",
        "E · Σ f·P (1: uniform)",
        number,
    ),
    Metric("moe_z_loss", "MoE router z-loss (before its coefficient)", "moe_z_loss", "mean logsumexp²", number),
)


@dataclass(frozen=True)
class ChartSection:
    name: str
    title: str
    chart: LineChart | None  # None: nothing logged (`missing` says why)
    legend: list[LegendItem]
    missing: str


def _markers(view: RunView) -> list[Marker]:
    checkpoints = [
        Marker(
            step,
            "checkpoint",
            f"checkpoint: step {step} committed (attempt {attempt})",
            CHECKPOINT_COLOR,
            {"data-step": step},
            dashed=True,
        )
        for step, attempt in view.checkpoints
    ]
    resumes = [
        Marker(
            a.resumed_from,
            "resume",
            f"attempt {a.number} resumed from the checkpoint of step {a.resumed_from}",
            RESUME_COLOR,
            {"data-step": a.resumed_from, "data-attempt": a.number},
            label=f"attempt {a.number} resumes",
        )
        for a in view.resumes
    ]
    return checkpoints + resumes


def _legend(lines: list[Line]) -> list[LegendItem]:
    return [LegendItem(line.label, line.color, "dashed" if line.dashed else "line") for line in lines]


def _line_chart(lines: list[Line], name: str, label: str, axis: str, fmt: Callable[[float, int], str], x_max: float,
                ticks: list[tuple[float, str]], x_title: str, markers: list[Marker]) -> LineChart:
    """The report's line chart from 0 to x_max (every chart: the same frame, thinning and padding)."""
    return line_chart(lines, frame=FRAME, x_range=(0, x_max), x_ticks=ticks, y_format=fmt, x_title=x_title,
                      y_title=axis, label=label, name=name, markers=markers, max_points=MAX_POINTS, y_pad=0.06)


def _chart_section(
    name: str, title: str, axis: str, lines: list[Line], view: RunView, fmt: Callable[[float, int], str], missing: str
) -> ChartSection:
    """The lines over steps, with a marker for each committed checkpoint and resume."""
    lines = [line for line in lines if line.points]
    if not lines:
        return ChartSection(name, title, None, [], missing)
    x_max = max(view.last_step, (view.target_steps or 1) - 1, 1)
    ticks = [(t, str(int(t))) for t in nice_ticks(0, x_max) if t == int(t)]
    chart = _line_chart(lines, name, f"{title} over steps", axis, fmt, x_max, ticks, "training step", _markers(view))
    legend = _legend(lines)
    if view.checkpoints:
        legend.append(LegendItem("checkpoint committed", CHECKPOINT_COLOR, "dashed"))
    if view.resumes:
        legend.append(LegendItem("resume point", RESUME_COLOR))
    return ChartSection(name, title, chart, legend, missing)


def _loss_section(view: RunView) -> ChartSection:
    lines = [Line(f"train loss, attempt {a.number}", a.color, _series(a.steps, "loss")) for a in view.attempts]
    lines += [
        Line(f"val loss, attempt {a.number}", a.color, _series(a.evals, "val_loss"), dashed=True, dots=True)
        for a in view.attempts
    ]
    return _chart_section("loss", "Loss", "loss (cross-entropy)", lines, view, number, "no steps logged yet")


def _source_names(view: RunView) -> list[str]:
    """The data sources, in the order the stage records' mixtures (then the evaluations) name them."""
    names: dict[str, None] = {}
    for mapping in [s.get("mixture") for s in view.stages] + [r.get("val_loss_by_source") for r in view.evals]:
        names.update(dict.fromkeys(mapping if isinstance(mapping, dict) else ()))
    return list(names)


def _by_source(record: dict) -> dict:
    losses = record.get("val_loss_by_source")
    return losses if isinstance(losses, dict) else {}


def _source_color(index: int) -> str:
    return SOURCE_COLORS[index % len(SOURCE_COLORS)]


def _val_loss_by_source_section(view: RunView) -> ChartSection | None:
    """Each source's val loss over steps (evaluations of a run of several sources), the mixture's beside them."""
    if not any(isinstance(r.get("val_loss_by_source"), dict) for r in view.evals):
        return None
    lines = [
        Line(
            f"val loss, {name}",
            _source_color(index),
            [(r["step"], v) for r in view.evals if (v := _finite(_by_source(r).get(name))) is not None],
            dots=True,
        )
        for index, name in enumerate(_source_names(view))
    ]
    lines.append(Line("val loss, the mixture", STAGE_COLOR, _series(view.evals, "val_loss"), dashed=True, dots=True))
    return _chart_section(
        "val_loss_by_source", "Val loss per source", "loss (cross-entropy)", lines, view, number, "no evaluations yet"
    )


def _metric_section(metric: Metric, view: RunView) -> ChartSection:
    lines = [Line(f"attempt {a.number}", a.color, _series(a.steps, metric.key)) for a in view.attempts]
    return _chart_section(metric.name, metric.title, metric.axis, lines, view, metric.fmt, metric.missing)


def _metrics(view: RunView) -> tuple[Metric, ...]:
    moe = any("moe_load_max_over_mean" in r for r in view.steps)
    return METRICS + MOE_METRICS if moe else METRICS


# ---------------------------------------------------------------- the schedule, over consumed tokens


@dataclass(frozen=True)
class ScheduleView:
    rows: list[list[str]]  # one per stage
    charts: list[ChartSection]


def _tokens_label(value: float, _digits: int = 0) -> str:
    """A token count on an axis: 512, 2.5 k, 1.024 M."""
    for divisor, suffix in SI_SUFFIXES:
        if abs(value) >= divisor:
            return f"{value / divisor:.4g} {suffix}"
    return f"{value:.4g}"


def _whole(value: float, digits: int) -> str:
    return f"{value:,.0f}" if value == int(value) else number(value, digits)


def _stage_start(stage: dict) -> float:
    return _finite(stage.get("start_tokens")) or 0.0


def _tokens_drawn(view: RunView) -> float:
    """The x axis' end: the tokens consumed by the last logged step (at least past the last stage's start)."""
    logged = [v for r in view.steps if (v := _finite(r.get("tokens"))) is not None]
    started = [_stage_start(s) + (_finite(s.get("global_batch_tokens")) or 0.0) for s in view.stages]
    return max([*logged, *started, 1.0])


def _stage_series(view: RunView, value: Callable[[dict], object], end: float) -> list[tuple[float, float]]:
    """A step function: each stage's value from its start to the next stage's (the last one's: to `end`)."""
    points = []
    for stage, after in zip(view.stages, [*view.stages[1:], None], strict=True):
        if (v := _finite(value(stage))) is not None:
            points += [(_stage_start(stage), v), (_stage_start(after) if after else end, v)]
    return points


def _mixture_weight(source: str) -> Callable[[dict], object]:
    return lambda stage: (stage.get("mixture") or {}).get(source, 0.0)  # a source a stage leaves out: 0


def _token_series(records: list[dict], key: str) -> list[tuple[float, float]]:
    """`key` of each step at the tokens consumed before it (records that count tokens only)."""
    return [
        (tokens - batch, v)
        for r in records
        if (tokens := _finite(r.get("tokens"))) is not None
        and (batch := _finite(r.get("global_batch_tokens"))) is not None
        and (v := _finite(r.get(key))) is not None
    ]


def _stage_markers(view: RunView) -> list[Marker]:
    return [
        Marker(
            _stage_start(s),
            "stage",
            f"stage {s['stage']} ({s.get('name', '')}) from {_stage_start(s):,.0f} tokens consumed, "
            f"step {s.get('first_step', '?')}",
            STAGE_COLOR,
            {"data-stage": s["stage"], "data-tokens": int(_stage_start(s))},
            label=str(s.get("name", s["stage"])),
            dashed=True,
        )
        for s in view.stages
    ]


def _token_section(
    name: str,
    title: str,
    axis: str,
    lines: list[Line],
    view: RunView,
    fmt: Callable[[float, int], str],
    markers: list[Marker] = (),
    marker_legend: list[LegendItem] = (),
) -> ChartSection:
    """The lines over consumed tokens, each stage's start marked (and `markers`, with their
    `marker_legend`); the axis reaches the last point of any line."""
    lines = [line for line in lines if line.points]
    if not lines:
        return ChartSection(name, title, None, [], "no values logged")
    x_max = max(_tokens_drawn(view), *(x for line in lines for x, _ in line.points))
    ticks = [(t, _tokens_label(t)) for t in nice_ticks(0, x_max)]
    chart = _line_chart(lines, name, f"{title} over consumed tokens", axis, fmt, x_max, ticks, "tokens consumed",
                        [*_stage_markers(view), *markers])
    legend = [*_legend(lines), *marker_legend]
    if view.stages:
        legend.append(LegendItem("stage starts", STAGE_COLOR, "dashed"))
    return ChartSection(name, title, chart, legend, "")


def _schedule(view: RunView) -> ScheduleView | None:
    """The Schedule section: for a run of more than one stage (every run records its one stage: a run
    without a schedule would only draw flat lines)."""
    if len(view.stages) < 2:
        return None
    end = _tokens_drawn(view)
    mixture = [
        Line(source, _source_color(index), _stage_series(view, _mixture_weight(source), end))
        for index, source in enumerate(_source_names(view))
    ]
    learning_rate = [Line(f"attempt {a.number}", a.color, _token_series(a.steps, "lr")) for a in view.attempts]
    charts = [
        _token_section(
            "schedule_batch",
            "Global batch",
            "tokens per step",
            [Line("global batch", SETTING_COLOR, _stage_series(view, lambda s: s.get("global_batch_tokens"), end))],
            view,
            _tokens_label,
        ),
        _token_section(
            "schedule_seq_len",
            "Sequence length",
            "tokens per sequence",
            [Line("sequence length", SETTING_COLOR, _stage_series(view, lambda s: s.get("seq_len"), end))],
            view,
            _whole,
        ),
        _token_section(
            "schedule_mixture", "Data mixture", "weight (share of sequences)", mixture, view, lambda v, _d: percent(v)
        ),
        _token_section("schedule_lr", "Learning rate over tokens", "learning rate", learning_rate, view, number),
    ]
    return ScheduleView([_stage_row(s) for s in view.stages], charts)


# ---------------------------------------------------------------- checkpoint evaluations (evals.jsonl)

PROMOTED_COLOR, REGRESSED_COLOR, BEST_COLOR = "#16a34a", "#dc2626", "#475569"


def _evaluated(evals: list[dict]) -> list[dict]:
    """The records of checkpoints evaluated (not skipped, not failed) that count tokens."""
    return [r for r in evals if not r.get("skipped") and not r.get("failed") and _finite(r.get("tokens")) is not None]


def _promoted(evals: list[dict]) -> dict | None:
    """The record of the checkpoint promoted last (each promotion is a new best: the current one)."""
    return max((r for r in _evaluated(evals) if r.get("promoted") is True), key=lambda r: r["step"], default=None)


def _regressed_on(record: dict, key: str | None) -> bool:
    """Whether the record's `regressed` list names `key` (a "task/metric"; None: any held-out source)."""
    keys = record.get("regressed") if isinstance(record.get("regressed"), list) else []
    return any(k == key if key else str(k).startswith("heldout/") for k in keys)


def _eval_markers(evals: list[dict], key: str | None) -> tuple[list[Marker], list[LegendItem]]:
    """The promoted checkpoint, and the checkpoints that regressed on `key` (_regressed_on), as
    markers, with their legend."""
    markers = [
        Marker(_finite(r["tokens"]), "regressed", f"step {r['step']} regressed "
               f"({', '.join(map(str, r['regressed']))})", REGRESSED_COLOR, {"data-step": r["step"]}, dashed=True)
        for r in _evaluated(evals) if _regressed_on(r, key)
    ]
    legend = [LegendItem("regressed checkpoint", REGRESSED_COLOR, "dashed")] if markers else []
    if (promoted := _promoted(evals)) is not None:
        markers.append(Marker(_finite(promoted["tokens"]), "promoted", f"step {promoted['step']} promoted (the best)",
                              PROMOTED_COLOR, {"data-step": promoted["step"]}, label=f"promoted: {promoted['step']}"))
        legend.append(LegendItem("promoted checkpoint", PROMOTED_COLOR))
    return markers, legend


def _best_so_far(points: list[tuple[float, float]], best: Callable[[float, float], float]) -> list[tuple[float, float]]:
    """The best value up to each point: a step line (it rises or falls only at a new best)."""
    out: list[tuple[float, float]] = []
    for x, value in points:
        if out and best(out[-1][1], value) != out[-1][1]:
            out.append((x, out[-1][1]))
        out.append((x, best(out[-1][1], value) if out else value))
    return out


def _task_metrics(evals: list[dict]) -> list[tuple[str, str]]:
    """(task, metric) in the order the records first name them."""
    names: dict[tuple[str, str], None] = {}
    for record in _evaluated(evals):
        tasks = record.get("tasks") if isinstance(record.get("tasks"), dict) else {}
        for task, metrics in tasks.items():
            names.update(dict.fromkeys((task, metric) for metric in (metrics if isinstance(metrics, dict) else ())))
    return list(names)


def _eval_value(record: dict, group: str, name: str, key: str) -> float | None:
    """record[group][name][key] when it is a finite number (tasks/task/metric, heldout/source/loss)."""
    inner = (record.get(group) or {}).get(name) if isinstance(record.get(group), dict) else None
    return _finite(inner.get(key)) if isinstance(inner, dict) else None


def _regressed_dots(evals: list[dict], points: dict[int, float], key: str | None) -> list[tuple[float, float]]:
    """The regressed checkpoints' own points, each alone (a NaN between them: dots, not a line)."""
    out: list[tuple[float, float]] = []
    for record in _evaluated(evals):
        if _regressed_on(record, key) and record["step"] in points:
            out += [(_finite(record["tokens"]), points[record["step"]]), (_finite(record["tokens"]), math.nan)]
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", text).strip("_")


def _checkpoint_eval_sections(view: RunView, evals: list[dict]) -> list[ChartSection]:
    """One chart per task metric (score and best so far over consumed tokens), then the held-out
    loss per source; the promoted checkpoint and the regressed ones marked on each."""
    evaluated = _evaluated(evals)
    sections = []
    for task, metric in _task_metrics(evals):
        by_step = {r["step"]: v for r in evaluated if (v := _eval_value(r, "tasks", task, metric)) is not None}
        points = [(_finite(r["tokens"]), by_step[r["step"]]) for r in evaluated if r["step"] in by_step]
        key = f"{task}/{metric}"
        markers, marker_legend = _eval_markers(evals, key)
        lines = [
            Line(metric, SOURCE_COLORS[0], points, dots=True),
            Line("best so far", BEST_COLOR, _best_so_far(points, max), dashed=True),
            Line("regressed score", REGRESSED_COLOR, _regressed_dots(evals, by_step, key)),
        ]
        sections.append(_token_section(f"eval_{_slug(task)}_{_slug(metric)}", f"Checkpoint evaluation: {task} "
                                       f"({metric})", metric, lines, view, number, markers, marker_legend))
    sources: dict[str, None] = {}
    for record in evaluated:
        sources.update(dict.fromkeys(record.get("heldout") if isinstance(record.get("heldout"), dict) else ()))
    if sources:
        lines = []
        for index, source in enumerate(sources):
            by_step = {r["step"]: v for r in evaluated if (v := _eval_value(r, "heldout", source, "loss")) is not None}
            lines.append(Line(f"held-out loss, {source}", _source_color(index),
                              [(_finite(r["tokens"]), by_step[r["step"]]) for r in evaluated if r["step"] in by_step],
                              dots=True))
        markers, marker_legend = _eval_markers(evals, None)
        sections.append(_token_section("eval_heldout", "Checkpoint evaluation: held-out loss per source",
                                       "loss (cross-entropy)", lines, view, number, markers, marker_legend))
    return sections


def _eval_stats(evals: list[dict]) -> list[tuple[str, str]]:
    """The header's figures of the checkpoint evaluations (none without evals.jsonl)."""
    if not evals:
        return []
    evaluated = [r for r in evals if not r.get("skipped") and not r.get("failed")]
    best = next((r.get("best_step") for r in reversed(evaluated) if isinstance(r.get("best_step"), int)), None)
    score = next((r.get("score") for r in evaluated if r["step"] == best), None)
    promoted = _promoted(evals)
    return [
        (str(len(evaluated)), "checkpoints evaluated"),
        (f"{sum(1 for r in evals if r.get('skipped'))} / {sum(1 for r in evals if r.get('failed'))}",
         "checkpoints skipped / failed"),
        ("n/a" if best is None else f"{best}" + (f" ({number(v, 4)})" if (v := _finite(score)) is not None else ""),
         "best checkpoint step (score)"),
        ("none" if promoted is None else str(promoted["step"]), "promoted checkpoint step"),
    ]


def _stage_row(stage: dict) -> list[str]:
    def count(key: str) -> str:
        value = stage.get(key)
        return f"{value:,}" if isinstance(value, int) else ""

    mixture = stage.get("mixture") or {}
    theta, scaling = stage.get("rope_theta"), stage.get("rope_scaling")
    return [
        count("stage"),
        str(stage.get("name", "")),
        count("first_step"),
        count("start_tokens"),
        count("seq_len"),
        f"{count('global_batch_tokens')} ({count('global_batch_sequences')} sequences)",
        count("micro_batches"),
        ", ".join(f"{source} {percent(weight)}" for source, weight in mixture.items()),
        "the model's" if theta is None else _whole(t, 4) if (t := _finite(theta)) is not None else str(theta),
        "the model's" if not scaling else ", ".join(f"{k}={v}" for k, v in scaling.items()),
        "on" if stage.get("document_masking") else "off",
    ]


def _clock(timestamp) -> str:
    t = _finite(timestamp)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else ""


def _attempt_rows(view: RunView) -> list[list[str]]:
    rows = []
    for a in view.attempts:
        logged = [r["step"] for r in a.steps]
        rows.append(
            [
                str(a.number),
                _clock(a.start.get("timestamp")) if a.start else "",
                "scratch" if a.resumed_from is None else f"checkpoint of step {a.resumed_from}",
                f"{min(logged)}–{max(logged)} ({len(logged)} logged)" if logged else "none",
                ", ".join(map(str, a.checkpoints)) or "none",
                str(a.start.get("world_size", "")) if a.start else "",
                duration(a.seconds) if a.seconds is not None else "",
                a.outcome,
            ]
        )
    return rows


def _median(values: list[float]) -> float | None:
    values = sorted(values)
    return values[len(values) // 2] if values else None


def _stats(view: RunView) -> list[tuple[str, str]]:
    """The header's figures: (value, what it is)."""
    last = view.steps[-1] if view.steps else {}
    val = view.evals[-1] if view.evals else {}
    best = min((v for r in view.evals if (v := _finite(r.get("val_loss"))) is not None), default=None)
    tokens = _median([v for _, v in _series(view.steps, "tokens_per_second")])
    mfu = _median([v for _, v in _series(view.steps, "mfu")])
    done = f"{view.last_step + 1:,}" + (f" / {view.target_steps:,}" if view.target_steps else "") if view.steps else "0"

    def shown(value, fmt: Callable[[float], str] = lambda v: number(v, 4)) -> str:
        return fmt(v) if (v := _finite(value)) is not None else "n/a"

    return [
        (done, "steps"),
        (shown(last.get("loss")), "train loss (last step)"),
        (shown(val.get("val_loss")), "val loss (last eval)"),
        (shown(best), "best val loss"),
        (shown(tokens, number), "tokens/s (median)"),
        (shown(mfu, percent), "MFU (median)"),
        (str(len(view.attempts)), "attempts"),
        (str(len(view.checkpoints)), "checkpoints committed"),
    ]


def _facts(config: dict | None) -> str:
    """A few settings from config.json (not all of it: paths and tracking addresses stay out)."""
    if not config:
        return "drawn from metrics.jsonl"
    model, data, parallel, optim = (config.get(k) or {} for k in ("model", "data", "parallel", "optim"))
    overrides = model.get("overrides") or {}
    batch = (f"a schedule of {len(config['schedule'])} stages (below)" if config.get("schedule") else
             f"{data.get('batch_size', '?')} × {data.get('seq_len', '?')} tokens per rank per micro-step, "
             f"grad_accum {config.get('grad_accum', '?')}")
    return (
        f"model {model.get('preset', '?')}{' ' + json.dumps(overrides) if overrides else ''}, "
        f"parallel {_parallel(parallel)}, {batch}, "
        f"lr {optim.get('lr', '?')} ({optim.get('schedule', '?')}), seed {config.get('seed', '?')}"
    )


def _parallel(parallel: dict) -> str:
    """The mode, or (unset: the mesh axes decide) the axes above 1."""
    if parallel.get("mode"):
        return parallel["mode"]
    axes = [f"{axis}={value}" for axis, value in parallel.items() if axis in MESH_AXES and value != 1]
    return " ".join(axes) or "none"


def render_report(
    records: list[dict],
    *,
    title: str = "lmforge training report",
    config: dict | None = None,
    checkpoint_evals: list[dict] = (),
) -> str:
    """The page for the records of one metrics.jsonl (all attempts) and the `checkpoint_eval`
    records of its evals.jsonl (metrics_file.read_checkpoint_evals)."""
    view = RunView.of(records)
    evals = list(checkpoint_evals)
    return render(
        "lmforge.trainer",
        "trainer/report.html",
        title=title,
        facts=_facts(config),
        stats=[*_stats(view), *_eval_stats(evals)],
        attempts=_attempt_rows(view),
        sections=[
            _loss_section(view),
            *filter(None, [_val_loss_by_source_section(view)]),
            *(_metric_section(metric, view) for metric in _metrics(view)),
            *_checkpoint_eval_sections(view, evals),
        ],
        schedule=_schedule(view),
        drawn_at=_clock(time.time()),
    )


def write_report(run_dir: Path, output: Path | None = None) -> Path:
    """RUN_DIR/report.html (or `output`) from RUN_DIR/metrics.jsonl, evals.jsonl (when there is
    one) and config.json."""
    records = read_records(run_dir / "metrics.jsonl")
    evals = read_checkpoint_evals(run_dir / EVALS_FILE)
    config_path = run_dir / "config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else None
    path = output or run_dir / REPORT_FILE
    html = render_report(records, title=f"lmforge training report: {run_dir.resolve().name}", config=config,
                         checkpoint_evals=evals)
    atomic_write_bytes(path, html.encode("utf-8"))
    return path


class ReportRefresher:
    """Redraws RUN_DIR/report.html off the training loop. A draw reads the whole metrics.jsonl
    (1.5 s for 100,000 step records, bench/report_stall.py), and rank 0 drawing inline at every checkpoint would
    stall every rank that long. `request()` returns at once; requests made while a draw runs
    fold into one more draw; `close()` waits for the draw in flight and draws the final page."""

    def __init__(
        self, run_dir: Path, on_error: Callable[[Exception], None], draw: Callable[[Path], object] = write_report
    ):
        self.run_dir, self._on_error, self._draw = run_dir, on_error, draw
        self._lock = threading.Lock()
        self._pending = False
        self._thread: threading.Thread | None = None  # set while a drawing thread runs (under the lock)

    def request(self) -> None:
        with self._lock:
            self._pending = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._drain, name="lmforge-report", daemon=True)
                self._thread.start()

    def close(self) -> None:
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()
        self._draw_once()

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._thread = None
                    return
                self._pending = False
            self._draw_once()

    def _draw_once(self) -> None:
        try:
            self._draw(self.run_dir)
        except Exception as exc:  # noqa: BLE001 - the report is only a view of metrics.jsonl
            self._on_error(exc)
