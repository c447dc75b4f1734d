"""The geometry of an SVG line chart (the training report's charts, the dashboards page's
panels): lines, vertical markers, ticks and axis titles in pixels, ready for the shared
``line_chart`` macro (templates/charts.html) to lay out."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lmforge.pages.chart_axes import nice_ticks, tick_digits, y_range


@dataclass(frozen=True)
class Frame:
    """The chart's size and the margins around its plot area."""

    width: int
    height: int
    left: int
    right: int
    top: int
    bottom: int

    @property
    def plot_width(self) -> int:
        return self.width - self.left - self.right

    @property
    def plot_height(self) -> int:
        return self.height - self.top - self.bottom

    @property
    def plot_bottom(self) -> int:
        return self.top + self.plot_height


@dataclass
class Line:
    label: str
    color: str
    points: list[tuple[float, float]]  # (x, y); a non-finite y breaks the line
    dashed: bool = False
    dots: bool = False  # a dot at every point (few points, e.g. evaluations); lone points always get one


@dataclass
class Marker:
    """A vertical line across the plot at `x` (a checkpoint, a resume)."""

    x: float
    kind: str  # its class, after "marker"
    title: str
    color: str
    data: dict[str, object] = field(default_factory=dict)  # data-* attributes
    label: str = ""  # written beside the top of the line
    dashed: bool = False


@dataclass(frozen=True)
class LegendItem:
    """One entry of a chart's legend (the shared ``legend`` macro)."""

    label: str
    color: str = ""  # "": no swatch
    style: str = "line"  # line | dashed | box (a filled square, for bars)
    note: str = ""  # written after the label, e.g. a series' last value


@dataclass(frozen=True)
class Tick:
    at: float  # pixels along its axis
    label: str
    anchor: str = "middle"


@dataclass(frozen=True)
class DrawnLine:
    label: str
    color: str
    points: int  # finite points, before thinning
    path: str  # SVG path data ("" when no two points join)
    dots: list[tuple[float, float]]
    dashed: bool


@dataclass(frozen=True)
class DrawnMarker:
    x: float
    kind: str
    title: str
    color: str
    data: dict[str, object]
    label: str
    dashed: bool


@dataclass(frozen=True)
class LineChart:
    frame: Frame
    label: str  # what the chart shows, for screen readers
    name: str | None  # its data-chart attribute
    points: int  # finite points over every line
    x_title: str
    y_title: str
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    lines: list[DrawnLine]
    markers: list[DrawnMarker]


def thin(points: list[tuple[float, float]], limit: int | None) -> list[tuple[float, float]]:
    """At most about `limit` points, taken evenly; the last one is always kept."""
    if limit is None or len(points) <= limit:
        return points
    stride = math.ceil(len(points) / limit)
    return points[::stride] + ([points[-1]] if (len(points) - 1) % stride else [])


def line_chart(
    lines: list[Line],
    *,
    frame: Frame,
    x_range: tuple[float, float],
    x_ticks: list[tuple[float, str]],
    y_format: Callable[[float, int], str],
    x_title: str,
    y_title: str,
    label: str,
    name: str | None = None,
    markers: Sequence[Marker] = (),
    max_points: int | None = None,
    y_pad: float = 0.05,
) -> LineChart:
    """The chart of `lines` (at least one finite point among them) over `x_range`, the y axis
    fitted to their values with round ticks written by `y_format(value, significant digits)`;
    `x_ticks`: (x, label)."""
    values = [y for line in lines for _, y in line.points if math.isfinite(y)]
    lo, hi = y_range(values, pad=y_pad)
    x_lo, x_hi = x_range
    x_span = (x_hi - x_lo) or 1.0

    def x(value: float) -> float:
        return round(frame.left + (value - x_lo) / x_span * frame.plot_width, 1)

    def y(value: float) -> float:
        return round(frame.top + (hi - value) / (hi - lo) * frame.plot_height, 1)

    def anchor(px: float) -> str:
        return "start" if px <= frame.left + 0.5 else "end" if px >= frame.left + frame.plot_width - 0.5 else "middle"

    y_ticks = nice_ticks(lo, hi)
    digits = tick_digits(y_ticks)
    drawn = []
    for line in lines:
        segments: list[list[tuple[float, float]]] = [[]]
        for px, value in thin(line.points, max_points):
            if math.isfinite(value):
                segments[-1].append((x(px), y(value)))
            elif segments[-1]:
                segments.append([])
        path = " ".join("M" + " L".join(f"{a:.1f},{b:.1f}" for a, b in seg) for seg in segments if len(seg) > 1)
        dots = [p for seg in segments for p in seg] if line.dots else [seg[0] for seg in segments if len(seg) == 1]
        drawn.append(
            DrawnLine(
                line.label, line.color, sum(1 for _, v in line.points if math.isfinite(v)), path, dots, line.dashed
            )
        )
    return LineChart(
        frame=frame,
        label=label,
        name=name,
        points=len(values),
        x_title=x_title,
        y_title=y_title,
        x_ticks=[Tick(x(value), text, anchor(x(value))) for value, text in x_ticks],
        y_ticks=[Tick(y(value), y_format(value, digits)) for value in y_ticks],
        lines=drawn,
        markers=[DrawnMarker(x(m.x), m.kind, m.title, m.color, m.data, m.label, m.dashed) for m in markers],
    )
