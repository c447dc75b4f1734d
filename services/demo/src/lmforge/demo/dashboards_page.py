"""The chart's Grafana dashboards drawn from a Prometheus, as one self-contained HTML page: each
panel's own PromQL asked as a range query (as Grafana asks it), drawn as an inline SVG line chart
with the panel's title, unit and legend (its legendFormat). No JavaScript, nothing fetched.

Grafana itself is not part of the demo; this page shows what its dashboards would show. Panels
of every type (stat, bar gauge, state timeline) are drawn as line charts of their series, with
each series' last value in the legend, which is what a stat or bar gauge panel displays."""

from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from lmforge.common.chart_axes import nice_ticks, y_range
from lmforge.common.storage import atomic_write_bytes
from lmforge.demo.dashboards import load_dashboards, panel_targets, panels, requires_of, unit_of
from lmforge.demo.prometheus import query_range

MAX_SERIES = 24  # per panel; the rest are counted, not drawn
WIDTH, HEIGHT = 520, 210
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 10, 26
# Grafana's classic palette.
COLORS = ("#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9", "#705da0",
          "#508642", "#cca300", "#447ebc", "#c15c17", "#890f02", "#0a437c", "#6d1f62", "#584477")


@dataclass
class Series:
    legend: str
    points: list[tuple[float, float]]  # (unix time, value); NaN where Prometheus has NaN

    def finite(self) -> list[tuple[float, float]]:
        return [(t, v) for t, v in self.points if math.isfinite(v)]


@dataclass
class Target:
    expr: str
    series: list[Series] = field(default_factory=list)
    error: str | None = None


@dataclass
class Panel:
    title: str
    kind: str  # Grafana panel type; "row" for a row header
    unit: str = "none"
    requires: str | None = None
    targets: list[Target] = field(default_factory=list)

    @property
    def series(self) -> list[Series]:
        return [s for t in self.targets for s in t.series]

    @property
    def points(self) -> int:
        return sum(len(s.finite()) for s in self.series)


@dataclass
class Dashboard:
    name: str  # the file's base name
    title: str
    panels: list[Panel]


def legend(fmt: str, labels: dict[str, str]) -> str:
    """Grafana's legendFormat: {{label}} replaced by the series' value of that label ("" when it
    has none); without a format, the series as `name{label="value", …}`."""
    if fmt and fmt != "__auto":
        out = fmt
        while "{{" in out and "}}" in out.split("{{", 1)[1]:
            head, rest = out.split("{{", 1)
            name, tail = rest.split("}}", 1)
            out = head + labels.get(name.strip(), "") + tail
        return out.strip()
    name = labels.get("__name__", "")
    rest = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{name}{{{rest}}}" if rest or not name else name


def fetch(prometheus: str, start: float, end: float, step: float, **macros: str) -> list[Dashboard]:
    """Every panel of every dashboard, its targets asked as range queries over [start, end]
    (GPU-only panels' targets are listed, not asked: their series exist only where a GPU is)."""
    dashboards = []
    for name, spec in load_dashboards().items():
        drawn = []
        for panel in panels(spec):
            view = Panel(panel.get("title", ""), panel.get("type", ""), unit_of(panel), requires_of(panel))
            drawn.append(view)
            if view.kind == "row":
                continue
            for expr, fmt in panel_targets(panel, **macros):
                target = Target(expr)
                view.targets.append(target)
                if view.requires == "gpu":
                    continue
                try:
                    result = query_range(prometheus, expr, start, end, step)
                except Exception as exc:  # a PromQL error or an unreachable Prometheus: shown on the panel
                    target.error = str(exc)
                    continue
                target.series = [Series(legend(fmt, r.get("metric", {})),
                                        [(float(t), float(v)) for t, v in r["values"]]) for r in result]
        dashboards.append(Dashboard(name, spec.get("title", name), drawn))
    return dashboards


# ---------------------------------------------------------------- values and axes


def _number(v: float, digits: int = 3) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e4 or abs(v) < 1e-3:
        return f"{v:.2e}"
    return f"{v:.{digits}g}"


def _scaled(v: float, base: float, units: tuple[str, ...]) -> str:
    i = 0
    while abs(v) >= base and i < len(units) - 1:
        v, i = v / base, i + 1
    return f"{_number(v)} {units[i]}".rstrip()


def format_value(v: float, unit: str) -> str:
    """`v` as Grafana writes a value of `unit` (the units the chart's dashboards use)."""
    if not math.isfinite(v):
        return str(v)
    if unit == "percentunit":
        return f"{_number(v * 100)}%"
    if unit == "percent":
        return f"{_number(v)}%"
    if unit == "s":
        if v != 0 and abs(v) < 1:
            return f"{_number(v * 1000)} ms"
        if abs(v) >= 3600:
            return f"{_number(v / 3600)} h"
        if abs(v) >= 60:
            return f"{_number(v / 60)} min"
        return f"{_number(v)} s"
    if unit == "bytes":
        return _scaled(v, 1024, ("B", "KiB", "MiB", "GiB", "TiB"))
    if unit == "Bps":
        return _scaled(v, 1024, ("B/s", "KiB/s", "MiB/s", "GiB/s"))
    if unit == "sci":
        return f"{v:.2e}"
    if unit in ("short", "reqps", "none"):
        text = _scaled(v, 1000, ("", "k", "M", "G", "T"))
        return text + (" req/s" if unit == "reqps" else "")
    return f"{_number(v)} {unit}"  # a custom unit, e.g. tok/s: Grafana writes it as a suffix


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


# ---------------------------------------------------------------- drawing


def svg_chart(panel: Panel, start: float, end: float) -> str:
    """An SVG line chart of the panel's series over [start, end] (gaps where a value is NaN)."""
    series = panel.series[:MAX_SERIES]
    values = [v for s in series for _, v in s.finite()]
    lo, hi = y_range(values)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    span = max(end - start, 1e-9)

    def x(t: float) -> float:
        return LEFT + (t - start) / span * plot_w

    def y(v: float) -> float:
        return TOP + (hi - v) / (hi - lo) * plot_h

    parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
             f'role="img" data-points="{len(values)}" xmlns="http://www.w3.org/2000/svg">']
    for tick in nice_ticks(lo, hi, 5):
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(tick):.1f}" y2="{y(tick):.1f}"/>')
        parts.append(f'<text class="axis" x="{LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">'
                     f'{html.escape(format_value(tick, panel.unit))}</text>')
    for i in range(5):
        t = start + span * i / 4
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        parts.append(f'<text class="axis" x="{x(t):.1f}" y="{HEIGHT - 8}" text-anchor="{anchor}">{_clock(t)}</text>')
    parts.append(f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}"/>')
    for i, s in enumerate(series):
        color = COLORS[i % len(COLORS)]
        segments: list[list[tuple[float, float]]] = [[]]
        for t, v in s.points:
            if math.isfinite(v):
                segments[-1].append((x(t), y(v)))
            elif segments[-1]:
                segments.append([])  # a NaN breaks the line, as in Grafana
        lines = [seg for seg in segments if len(seg) > 1]
        d = " ".join("M" + " L".join(f"{px:.1f},{py:.1f}" for px, py in seg) for seg in lines)
        parts.append(f'<g class="series" stroke="{color}" fill="{color}" data-points="{len(s.finite())}">'
                     f"<title>{html.escape(s.legend)}</title>" + (f'<path d="{d}"/>' if d else "")
                     + "".join(f'<circle cx="{seg[0][0]:.1f}" cy="{seg[0][1]:.1f}" r="2.5"/>'  # a lone sample
                               for seg in segments if len(seg) == 1) + "</g>")
    parts.append("</svg>")
    return "".join(parts)


def _legend(panel: Panel) -> str:
    items = []
    for i, s in enumerate(panel.series[:MAX_SERIES]):
        finite = s.finite()
        last = format_value(finite[-1][1], panel.unit) if finite else "no value"
        items.append(f'<li><span class="swatch" style="background:{COLORS[i % len(COLORS)]}"></span>'
                     f'{html.escape(s.legend or "(no labels)")} '
                     f'<span class="last">last {html.escape(last)}</span></li>')
    more = len(panel.series) - MAX_SERIES
    if more > 0:
        items.append(f"<li>… {more} more series, not drawn</li>")
    return f'<ul class="legend">{"".join(items)}</ul>'


def _panel(panel: Panel, start: float, end: float) -> str:
    unit = "" if panel.unit == "none" else f' <span class="unit">({html.escape(panel.unit)})</span>'
    head = f'<h4>{html.escape(panel.title)}{unit} <span class="kind">{html.escape(panel.kind)}</span></h4>'
    queries = "".join(f"<pre>{html.escape(t.expr)}</pre>" for t in panel.targets)
    details = f"<details><summary>PromQL</summary>{queries}</details>" if queries else ""
    errors = "".join(f'<p class="error">query failed: {html.escape(t.error)}</p>' for t in panel.targets if t.error)
    if panel.requires == "gpu":
        body = '<p class="note">GPU-only panel: its series exist only where a GPU is present; not asked here.</p>'
    elif panel.points:
        body = svg_chart(panel, start, end) + _legend(panel)
    else:
        body = '<p class="nodata">No data</p>'
    return (f'<section class="panel" data-panel="{html.escape(panel.title)}" data-requires="{panel.requires or ""}">'
            f"{head}{body}{errors}{details}</section>")


STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1f2329; background: #f4f5f5; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { margin: 28px 0 8px; font-size: 18px; }
h3 { margin: 16px 0 6px; font-size: 15px; color: #555; border-bottom: 1px solid #ccc; }
h4 { margin: 0 0 6px; font-size: 14px; } .meta { color: #555; margin: 0 0 4px; }
.grid-panels { display: flex; flex-wrap: wrap; gap: 12px; }
.panel { background: #fff; border: 1px solid #dcdee1; border-radius: 4px; padding: 10px; width: 540px; }
.unit, .kind, .last { color: #6c737a; font-weight: normal; font-size: 12px; } .kind { float: right; }
svg.chart .grid { stroke: #e4e6e8; } svg.chart .frame { fill: none; stroke: #c7cbd0; }
svg.chart .axis { font-size: 10px; fill: #6c737a; }
svg.chart .series path { fill: none; stroke-width: 1.6; } svg.chart .series circle { stroke: none; }
.legend { list-style: none; padding: 0; margin: 4px 0 0; font-size: 12px; columns: 2; }
.swatch { display: inline-block; width: 10px; height: 3px; margin-right: 5px; vertical-align: middle; }
.nodata { color: #c4162a; font-weight: bold; } .note { color: #6c737a; } .error { color: #c4162a; }
pre { white-space: pre-wrap; font-size: 11px; background: #f4f5f5; padding: 4px; margin: 4px 0; }
"""


def render_page(dashboards: list[Dashboard], *, prometheus: str, start: float, end: float, step: float) -> str:
    """The HTML page: one section per dashboard, its rows as headings, one chart per panel with data."""
    body = []
    for dashboard in dashboards:
        body.append(f'<h2 id="{html.escape(dashboard.name)}">{html.escape(dashboard.title)}</h2>')
        group: list[str] = []
        for panel in dashboard.panels:
            if panel.kind == "row":
                if group:
                    body.append(f'<div class="grid-panels">{"".join(group)}</div>')
                    group = []
                body.append(f"<h3>{html.escape(panel.title)}</h3>")
            else:
                group.append(_panel(panel, start, end))
        if group:
            body.append(f'<div class="grid-panels">{"".join(group)}</div>')
    asked = [p for d in dashboards for p in d.panels if p.kind != "row" and p.requires != "gpu"]
    with_data = sum(1 for p in asked if p.points)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>lmforge dashboards</title><style>{STYLE}</style></head>
<body>
<h1>lmforge dashboards, drawn from Prometheus</h1>
<p class="meta">What the chart's Grafana dashboards show for this run: each panel's own PromQL as a range query
against {html.escape(prometheus)}, {_clock(start)}–{_clock(end)} local time
({time.strftime("%Y-%m-%d", time.localtime(start))}), step {step:g} s; dashboard variables set to all.</p>
<p class="meta">{with_data} of {len(asked)} panels have data.</p>
{"".join(body)}
</body></html>
"""


def write_page(path: Path, prometheus: str, start: float, end: float, step: float, **macros: str) -> list[Dashboard]:
    """Fetch every panel over [start, end] and write the page to `path`; returns what it drew."""
    dashboards = fetch(prometheus, start, end, step, **macros)
    atomic_write_bytes(path, render_page(dashboards, prometheus=prometheus, start=start, end=end,
                                         step=step).encode("utf-8"))
    return dashboards
