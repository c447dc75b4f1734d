"""The training report: RUN_DIR/report.html, one self-contained page drawn from metrics.jsonl.

Loss (train and val), learning rate, gradient norm, tokens/s and MFU over steps as inline SVG
line charts, one line per attempt, so the steps a resumed attempt computed again show over the
first attempt's; committed checkpoints and each resume point are marked on every chart. Inline
CSS, no JavaScript, nothing fetched: the page opens from a laptop, a ticket or a bucket as it is.
Every string from the run is HTML-escaped.

The trainer rewrites it (rank 0) at each committed checkpoint and when the attempt ends;
`lmforge-train report --run-dir DIR` draws it from any metrics.jsonl.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from lmforge.common.chart_axes import nice_ticks, y_range
from lmforge.common.storage import atomic_write_bytes
from lmforge.trainer.metrics_file import attempt_of, by_attempt, latest_per_step, read_records

REPORT_FILE = "report.html"
MAX_POINTS = 2000  # per line; longer ones are thinned evenly (the last point is always kept)
WIDTH, HEIGHT = 960, 260
LEFT, RIGHT, TOP, BOTTOM = 70, 16, 22, 30
ATTEMPT_COLORS = ("#2563eb", "#0d9488", "#7c3aed", "#db2777", "#ca8a04", "#475569")
CHECKPOINT_COLOR, RESUME_COLOR = "#16a34a", "#ea580c"


# ---------------------------------------------------------------- numbers


def _finite(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def fmt_number(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e4:
        for divisor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(v) >= divisor:
                return f"{v / divisor:.3g} {suffix}"
    if abs(v) < 1e-2:
        return f"{v:.2e}"
    return f"{v:.4g}"


def fmt_percent(v: float) -> str:
    return f"{v * 100:.3g}%"


def fmt_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _thin(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(points) <= MAX_POINTS:
        return points
    stride = math.ceil(len(points) / MAX_POINTS)
    return points[::stride] + ([points[-1]] if (len(points) - 1) % stride else [])


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
        return cls(list(attempts.values()), latest_per_step(records), latest_per_step(records, "eval"),
                   targets[-1] if targets else None)

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


# ---------------------------------------------------------------- charts


@dataclass
class Line:
    label: str
    color: str
    points: list[tuple[float, float]]  # (step, value), finite values only
    dashed: bool = False
    dots: bool = False  # evaluations: few points, each drawn


def _series(records: list[dict], key: str) -> list[tuple[float, float]]:
    return [(r["step"], v) for r in records if (v := _finite(r.get(key))) is not None]


def line_chart(name: str, lines: list[Line], view: RunView, fmt: Callable[[float], str]) -> str:
    """One chart: the lines over steps, with a marker for each committed checkpoint and resume."""
    values = [v for line in lines for _, v in line.points]
    lo, hi = y_range(values, pad=0.06)
    x_max = max(view.last_step, (view.target_steps or 1) - 1, 1)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(step: float) -> float:
        return LEFT + step / x_max * plot_w

    def y(v: float) -> float:
        return TOP + (hi - v) / (hi - lo) * plot_h

    parts = [f'<svg class="chart" data-chart="{escape(name)}" data-points="{len(values)}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(name)} over steps">']
    for tick in nice_ticks(lo, hi):
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
                     'stroke="#e2e8f0" stroke-dasharray="3 3"/>'
                     f'<text class="axis" x="{LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">'
                     f"{escape(fmt(tick))}</text>")
    for tick in nice_ticks(0, x_max):
        if tick == int(tick):
            parts.append(f'<text class="axis" x="{x(tick):.1f}" y="{HEIGHT - 10}" text-anchor="middle">'
                         f"{int(tick)}</text>")
    parts.append(f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" '
                 'stroke="#cbd5e1"/>')
    for step, attempt in view.checkpoints:
        parts.append(f'<g class="marker checkpoint" data-step="{step}"><title>checkpoint: step {step} committed '
                     f'(attempt {attempt})</title><line x1="{x(step):.1f}" x2="{x(step):.1f}" y1="{TOP}" '
                     f'y2="{TOP + plot_h}" stroke="{CHECKPOINT_COLOR}" stroke-dasharray="4 3"/></g>')
    for attempt in view.resumes:
        step = attempt.resumed_from
        parts.append(f'<g class="marker resume" data-step="{step}" data-attempt="{attempt.number}">'
                     f"<title>attempt {attempt.number} resumed from the checkpoint of step {step}</title>"
                     f'<line x1="{x(step):.1f}" x2="{x(step):.1f}" y1="{TOP - 8}" y2="{TOP + plot_h}" '
                     f'stroke="{RESUME_COLOR}" stroke-width="2"/>'
                     f'<text class="mark" x="{x(step) + 4:.1f}" y="{TOP - 10}" fill="{RESUME_COLOR}">'
                     f"attempt {attempt.number} resumes</text></g>")
    for line in lines:
        points = _thin(line.points)
        d = " L".join(f"{x(s):.1f},{y(v):.1f}" for s, v in points)
        dash = ' stroke-dasharray="6 4"' if line.dashed else ""
        path = f'<path d="M{d}" fill="none" stroke-width="1.6"{dash}/>' if len(points) > 1 else ""
        dots = "".join(f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="3"/>'
                       for s, v in (points if line.dots or len(points) == 1 else []))
        parts.append(f'<g class="series" stroke="{line.color}" fill="{line.color}" data-points="{len(line.points)}">'
                     f"<title>{escape(line.label)}</title>{path}{dots}</g>")
    parts.append("</svg>")
    return "".join(parts)


def _legend(lines: list[Line], view: RunView) -> str:
    items = [f'<li><span class="swatch{" dashed" if line.dashed else ""}" style="border-color:{line.color}">'
             f"</span>{escape(line.label)}</li>" for line in lines]
    if view.checkpoints:
        items.append(f'<li><span class="swatch dashed" style="border-color:{CHECKPOINT_COLOR}"></span>'
                     "checkpoint committed</li>")
    if view.resumes:
        items.append(f'<li><span class="swatch" style="border-color:{RESUME_COLOR}"></span>resume point</li>')
    return f'<ul class="legend">{"".join(items)}</ul>'


@dataclass(frozen=True)
class Metric:
    name: str
    title: str
    key: str
    fmt: Callable[[float], str]
    missing: str = "no values logged"


METRICS = (
    Metric("lr", "Learning rate", "lr", fmt_number),
    Metric("grad_norm", "Gradient norm (before clipping)", "grad_norm", fmt_number),
    Metric("tokens_per_second", "Tokens per second (all ranks)", "tokens_per_second", fmt_number),
    Metric("mfu", "MFU (model FLOPs utilization per device)", "mfu", fmt_percent,
           "n/a: no peak FLOP/s is known for this device (on CPU, or set metrics.peak_flops)"),
)


def _chart_section(name: str, title: str, lines: list[Line], view: RunView, fmt: Callable[[float], str],
                   missing: str) -> str:
    lines = [line for line in lines if line.points]
    body = (line_chart(name, lines, view, fmt) + _legend(lines, view) if lines
            else f'<p class="nodata" data-chart="{escape(name)}">{escape(missing)}</p>')
    return f'<section id="{escape(name)}"><h2>{escape(title)}</h2>{body}</section>'


def _loss_section(view: RunView) -> str:
    lines = [Line(f"train loss, attempt {a.number}", a.color, _series(a.steps, "loss")) for a in view.attempts]
    lines += [Line(f"val loss, attempt {a.number}", a.color, _series(a.evals, "val_loss"), dashed=True, dots=True)
              for a in view.attempts]
    return _chart_section("loss", "Loss", lines, view, fmt_number, "no steps logged yet")


def _metric_section(metric: Metric, view: RunView) -> str:
    lines = [Line(f"attempt {a.number}", a.color, _series(a.steps, metric.key)) for a in view.attempts]
    return _chart_section(metric.name, metric.title, lines, view, metric.fmt, metric.missing)


# ---------------------------------------------------------------- tables and header


def _clock(timestamp) -> str:
    t = _finite(timestamp)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else ""


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _attempts_section(view: RunView) -> str:
    rows = []
    for a in view.attempts:
        logged = [r["step"] for r in a.steps]
        rows.append([str(a.number), _clock(a.start.get("timestamp")) if a.start else "",
                     "scratch" if a.resumed_from is None else f"checkpoint of step {a.resumed_from}",
                     f"{min(logged)}–{max(logged)} ({len(logged)} logged)" if logged else "none",
                     ", ".join(map(str, a.checkpoints)) or "none",
                     str(a.start.get("world_size", "")) if a.start else "",
                     fmt_duration(a.seconds) if a.seconds is not None else "", a.outcome])
    note = ('<p class="sub">A resumed attempt computes again the steps between its checkpoint and where the '
            "attempt before it stopped: the charts draw each attempt's own line; the figures at the top take "
            "each step from the newest attempt that logged it.</p>" if len(view.attempts) > 1 else "")
    table = _table(["attempt", "started", "resumed from", "steps", "checkpoints committed", "ranks", "wall time",
                    "outcome"], rows)
    return f'<section id="attempts"><h2>Attempts</h2>{note}{table}</section>'


def _median(values: list[float]) -> float | None:
    values = sorted(values)
    return values[len(values) // 2] if values else None


def _stat(value: str, label: str) -> str:
    return f'<div class="stat"><div class="v">{escape(value)}</div><div class="k">{escape(label)}</div></div>'


def _header(view: RunView, title: str, facts: str) -> str:
    last = view.steps[-1] if view.steps else {}
    val = view.evals[-1] if view.evals else {}
    best = min((v for r in view.evals if (v := _finite(r.get("val_loss"))) is not None), default=None)
    tokens = _median([v for _, v in _series(view.steps, "tokens_per_second")])
    mfu = _median([v for _, v in _series(view.steps, "mfu")])
    done = f"{view.last_step + 1:,}" + (f" / {view.target_steps:,}" if view.target_steps else "") if view.steps else "0"

    def shown(value, fmt=fmt_number) -> str:
        return fmt(v) if (v := _finite(value)) is not None else "n/a"

    stats = "".join([
        _stat(done, "steps"), _stat(shown(last.get("loss")), "train loss (last step)"),
        _stat(shown(val.get("val_loss")), "val loss (last eval)"), _stat(shown(best), "best val loss"),
        _stat(shown(tokens), "tokens/s (median)"), _stat(shown(mfu, fmt_percent), "MFU (median)"),
        _stat(str(len(view.attempts)), "attempts"), _stat(str(len(view.checkpoints)), "checkpoints committed"),
    ])
    return (f"<header><h1>{escape(title)}</h1><p class=\"meta\">{escape(facts)}</p>"
            f'<div class="stats">{stats}</div></header>')


def _facts(config: dict | None) -> str:
    """A few settings from config.json (not all of it: paths and tracking addresses stay out)."""
    if not config:
        return "drawn from metrics.jsonl"
    model, data, parallel, optim = (config.get(k) or {} for k in ("model", "data", "parallel", "optim"))
    overrides = model.get("overrides") or {}
    return (f"model {model.get('preset', '?')}{' ' + json.dumps(overrides) if overrides else ''}, "
            f"parallel {parallel.get('mode', '?')}, {data.get('batch_size', '?')} × {data.get('seq_len', '?')} "
            f"tokens per rank per micro-step, grad_accum {config.get('grad_accum', '?')}, "
            f"lr {optim.get('lr', '?')} ({optim.get('schedule', '?')}), seed {config.get('seed', '?')}")


STYLE = """
:root { --fg:#0f172a; --muted:#64748b; --line:#e2e8f0; --bg:#f8fafc; }
* { box-sizing:border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
       font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif; }
main { max-width:1040px; margin:0 auto; padding:24px 20px 60px; }
header { background:#0f172a; color:#f8fafc; border-radius:12px; padding:22px 26px; margin-bottom:18px; }
header h1 { margin:0 0 4px; font-size:22px; font-weight:650; }
header .meta { margin:0 0 16px; color:#94a3b8; font-size:13px; }
.stats { display:grid; grid-template-columns:repeat(4,1fr); gap:10px; }
.stat { background:#1e293b; border:1px solid #334155; border-radius:8px; padding:8px 12px; }
.stat .v { font-size:18px; font-weight:650; } .stat .k { color:#94a3b8; font-size:12px; }
section { background:#fff; border:1px solid var(--line); border-radius:12px; padding:18px 22px; margin-bottom:18px; }
section h2 { margin:0 0 6px; font-size:17px; }
.sub { margin:0 0 12px; color:var(--muted); font-size:13px; }
.nodata { color:var(--muted); font-style:italic; margin:8px 0; }
svg.chart { display:block; width:100%; height:auto; margin:4px 0 6px; }
svg.chart text { font-size:11px; } svg.chart .axis { fill:#64748b; } svg.chart .mark { font-weight:600; }
svg.chart .series circle { stroke:none; }
.legend { list-style:none; padding:0; margin:0; font-size:12px; color:var(--muted); display:flex;
          flex-wrap:wrap; gap:4px 18px; }
.swatch { display:inline-block; width:18px; margin-right:6px; vertical-align:middle; border-top:2px solid; }
.swatch.dashed { border-top-style:dashed; }
table { border-collapse:collapse; width:100%; font-variant-numeric:tabular-nums; }
th, td { text-align:left; padding:5px 10px; border-bottom:1px solid var(--line); }
th { font-size:12px; color:var(--muted); font-weight:600; background:#f8fafc; }
footer { color:var(--muted); font-size:12px; text-align:center; }
"""


def render_report(records: list[dict], *, title: str = "lmforge training report", config: dict | None = None) -> str:
    """The page for the records of one metrics.jsonl (all attempts)."""
    view = RunView.of(records)
    body = "".join([
        _header(view, title, _facts(config)), _attempts_section(view), _loss_section(view),
        *(_metric_section(metric, view) for metric in METRICS),
        f"<footer>drawn from metrics.jsonl at {escape(_clock(time.time()))} by lmforge-train</footer>",
    ])
    return ("<!DOCTYPE html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{STYLE}</style></head>"
            f"<body><main>{body}</main></body></html>\n")


def write_report(run_dir: Path, output: Path | None = None) -> Path:
    """RUN_DIR/report.html (or `output`) from RUN_DIR/metrics.jsonl and config.json."""
    records = read_records(run_dir / "metrics.jsonl")
    config_path = run_dir / "config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else None
    path = output or run_dir / REPORT_FILE
    html = render_report(records, title=f"lmforge training report: {run_dir.resolve().name}", config=config)
    atomic_write_bytes(path, html.encode("utf-8"))
    return path


class ReportRefresher:
    """Redraws RUN_DIR/report.html off the training loop. A draw reads the whole metrics.jsonl
    (1.5 s for 100,000 step records, bench/report_stall.py), and rank 0 drawing inline at every checkpoint would
    stall every rank that long. `request()` returns at once; requests made while a draw runs
    fold into one more draw; `close()` waits for the draw in flight and draws the final page."""

    def __init__(self, run_dir: Path, on_error: Callable[[Exception], None],
                 draw: Callable[[Path], object] = write_report):
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
