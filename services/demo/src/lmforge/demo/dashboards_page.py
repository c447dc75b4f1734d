"""The chart's Grafana dashboards drawn from a Prometheus, as one self-contained HTML page: each
panel's own PromQL asked as a range query (as Grafana asks it), drawn as an inline SVG line chart
with the panel's title, unit and legend (its legendFormat). No JavaScript, nothing fetched.

Grafana itself is not part of the demo; this page shows what its dashboards would show. A stat
panel is drawn as Grafana draws it: each series' last value, large, in the panel's unit and its
threshold's colour (lmforge.demo.stat_panel). Panels of the other types (bar gauge, state
timeline) are drawn as line charts of their series, with each series' last value in the legend,
which is what a bar gauge displays. This module asks and computes; templates/dashboards.html
lays the page out."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from lmforge.common.atomic_files import atomic_write_bytes
from lmforge.demo.dashboards import (
    load_dashboards,
    panel_targets,
    panels,
    regex_value,
    repeat_of,
    requires_of,
    substitute,
    unit_of,
)
from lmforge.demo.prometheus import query_range
from lmforge.demo.stat_panel import StatStyle, StatValue, stat_values
from lmforge.pages.formatting import byte_size, number, short_duration
from lmforge.pages.html_pages import render
from lmforge.pages.line_chart import Frame, LegendItem, Line, LineChart, line_chart

MAX_SERIES = 24  # per panel; the rest are counted, not drawn
FRAME = Frame(width=520, height=224, left=80, right=12, top=10, bottom=40)
# Grafana's classic palette.
COLORS = (
    "#7eb26d",
    "#eab839",
    "#6ed0e0",
    "#ef843c",
    "#e24d42",
    "#1f78c1",
    "#ba43a9",
    "#705da0",
    "#508642",
    "#cca300",
    "#447ebc",
    "#c15c17",
    "#890f02",
    "#0a437c",
    "#6d1f62",
    "#584477",
)


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
    stat: StatStyle | None = None  # a stat panel's colours and text; None: Grafana's defaults

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


def panel_of(spec: dict) -> Panel:
    """A panel of a dashboard's JSON, before its targets are asked."""
    kind = spec.get("type", "")
    stat = StatStyle.of(spec) if kind == "stat" else None
    return Panel(spec.get("title", ""), kind, unit_of(spec), requires_of(spec), stat=stat)


def label_values(prometheus: str, selector: str, label: str, start: float, end: float, step: float) -> list[str]:
    """The values `label` takes on the series of `selector` over [start, end], sorted (Grafana's
    label_values(selector, label) over the dashboard's time range)."""
    result = query_range(prometheus, f"group by ({label}) ({selector})", start, end, step)
    return sorted({r["metric"][label] for r in result if r.get("metric", {}).get(label)})


def repeated(prometheus: str, spec: dict, panel: dict, start: float, end: float, step: float,
             **macros: str) -> list[tuple[dict, dict[str, str]]]:
    """(panel, macros) for each copy Grafana draws of `panel`: one per value of its `repeat`
    variable (every value: the variables' default is All), its title and matchers given that
    value; the panel once, unchanged, when it does not repeat or the values cannot be asked."""
    repeat = repeat_of(spec, panel)
    if repeat is None:
        return [(panel, macros)]
    variable, selector, label = repeat
    try:
        values = label_values(prometheus, selector, label, start, end, step)
    except Exception:  # noqa: BLE001 - drawn once, its own queries then show the error
        values = []
    return [({**panel, "title": substitute(panel.get("title", ""), **{variable: value})},
             {**macros, variable: regex_value(value)}) for value in values] or [(panel, macros)]


def fetch(prometheus: str, start: float, end: float, step: float, **macros: str) -> list[Dashboard]:
    """Every panel of every dashboard, its targets asked as range queries over [start, end]
    (GPU-only panels' targets are listed, not asked: their series exist only where a GPU is).
    A repeated panel is drawn once per value of its variable, as Grafana draws it."""
    dashboards = []
    for name, spec in load_dashboards().items():
        drawn = []
        copies = (copy for p in panels(spec) for copy in repeated(prometheus, spec, p, start, end, step, **macros))
        for panel, values in copies:
            view = panel_of(panel)
            drawn.append(view)
            if view.kind == "row":
                continue
            for expr, fmt in panel_targets(panel, **values):
                target = Target(expr)
                view.targets.append(target)
                if view.requires == "gpu":
                    continue
                try:
                    result = query_range(prometheus, expr, start, end, step)
                except Exception as exc:  # a PromQL error or an unreachable Prometheus: shown on the panel
                    target.error = str(exc)
                    continue
                target.series = [
                    Series(legend(fmt, r.get("metric", {})), [(float(t), float(v)) for t, v in r["values"]])
                    for r in result
                ]
        dashboards.append(Dashboard(name, spec.get("title", name), drawn))
    return dashboards


# ---------------------------------------------------------------- values and axes

# A unit's name on a chart's y axis.
UNIT_TITLES = {
    "percentunit": "percent",
    "percent": "percent",
    "s": "seconds",
    "bytes": "bytes",
    "Bps": "bytes / second",
    "reqps": "requests / second",
    "short": "value",
    "none": "value",
    "sci": "value",
}


def format_value(v: float, unit: str, digits: int = 3) -> str:
    """`v` as Grafana writes a value of `unit` (the units the chart's dashboards use), with
    `digits` significant figures."""
    if not math.isfinite(v):
        return str(v)
    if unit == "percentunit":
        return f"{number(v * 100, digits)}%"
    if unit == "percent":
        return f"{number(v, digits)}%"
    if unit == "s":
        return short_duration(v, digits)
    if unit == "bytes":
        return byte_size(v, binary=True, digits=digits)
    if unit == "Bps":
        return byte_size(v, binary=True, digits=digits) + "/s"
    if unit == "sci":
        return f"{v:.{digits - 1}e}"
    if unit in ("short", "reqps", "none"):
        return number(v, digits) + (" req/s" if unit == "reqps" else "")
    return f"{number(v, digits)} {unit}"  # a custom unit, e.g. tok/s: Grafana writes it as a suffix


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


# ---------------------------------------------------------------- the page's data


@dataclass(frozen=True)
class PanelView:
    title: str
    kind: str
    unit: str  # "" for none
    requires: str  # "" or "gpu"
    chart: LineChart | None  # None: a stat panel, GPU-only, or no data
    legend: list[LegendItem]
    stats: list[StatValue]  # a stat panel's values
    errors: list[str]
    queries: list[str]


@dataclass(frozen=True)
class PanelGroup:
    title: str | None  # the row's title; None for panels above the first row
    panels: list[PanelView]


def panel_chart(panel: Panel, start: float, end: float) -> LineChart:
    """The panel's series over [start, end] as a line chart (gaps where a value is NaN)."""
    series = panel.series[:MAX_SERIES]
    lines = [Line(s.legend, COLORS[i % len(COLORS)], s.points) for i, s in enumerate(series)]
    ticks = [start + (end - start) * i / 4 for i in range(5)]
    return line_chart(
        lines,
        frame=FRAME,
        x_range=(start, end),
        x_ticks=[(t, _clock(t)) for t in ticks],
        y_format=lambda v, digits: format_value(v, panel.unit, digits),
        x_title="time (local)",
        y_title=UNIT_TITLES.get(panel.unit, panel.unit),
        label=f"{panel.title} over time",
    )


def _legend(panel: Panel) -> list[LegendItem]:
    items = []
    for i, s in enumerate(panel.series[:MAX_SERIES]):
        finite = s.finite()
        last = format_value(finite[-1][1], panel.unit) if finite else "no value"
        items.append(LegendItem(s.legend or "(no labels)", COLORS[i % len(COLORS)], note=f"last {last}"))
    more = len(panel.series) - MAX_SERIES
    if more > 0:
        items.append(LegendItem(f"… {more} more series, not drawn"))
    return items


def _stats(panel: Panel) -> list[StatValue]:
    """A stat panel's value per series with data: its last finite one."""
    last = [(s.legend, s.finite()[-1][1]) for s in panel.series[:MAX_SERIES] if s.finite()]
    return stat_values(last, panel.stat or StatStyle(), lambda value: format_value(value, panel.unit))


def panel_view(panel: Panel, start: float, end: float) -> PanelView:
    drawn = panel.requires != "gpu" and panel.points > 0
    stat = panel.kind == "stat"
    return PanelView(
        panel.title,
        panel.kind,
        "" if panel.unit == "none" else panel.unit,
        panel.requires or "",
        panel_chart(panel, start, end) if drawn and not stat else None,
        _legend(panel) if drawn and not stat else [],
        _stats(panel) if drawn and stat else [],
        [t.error for t in panel.targets if t.error],
        [t.expr for t in panel.targets],
    )


def _groups(dashboard: Dashboard, start: float, end: float) -> list[PanelGroup]:
    """The dashboard's panels under its rows, as Grafana lays them out."""
    groups = [PanelGroup(None, [])]
    for panel in dashboard.panels:
        if panel.kind == "row":
            groups.append(PanelGroup(panel.title, []))
        else:
            groups[-1].panels.append(panel_view(panel, start, end))
    return [g for g in groups if g.title is not None or g.panels]


def render_page(dashboards: list[Dashboard], *, prometheus: str, start: float, end: float, step: float) -> str:
    """The HTML page: one part per dashboard, its rows as headings, one chart per panel with data."""
    asked = [p for d in dashboards for p in d.panels if p.kind != "row" and p.requires != "gpu"]
    return render(
        "lmforge.demo",
        "demo/dashboards.html",
        title="lmforge dashboards",
        prometheus=prometheus,
        span=f"{_clock(start)}–{_clock(end)} local time ({time.strftime('%Y-%m-%d', time.localtime(start))})",
        step=f"{step:g}",
        with_data=sum(1 for p in asked if p.points),
        asked=len(asked),
        dashboards=[(d, _groups(d, start, end)) for d in dashboards],
    )


def write_page(path: Path, prometheus: str, start: float, end: float, step: float, **macros: str) -> list[Dashboard]:
    """Fetch every panel over [start, end] and write the page to `path`; returns what it drew."""
    dashboards = fetch(prometheus, start, end, step, **macros)
    atomic_write_bytes(
        path, render_page(dashboards, prometheus=prometheus, start=start, end=end, step=step).encode("utf-8")
    )
    return dashboards
