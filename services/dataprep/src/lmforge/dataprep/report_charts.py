"""The geometry of the data-prep report's bar charts: horizontal bars (one row per item) and
columns (a histogram), in pixels, for the macros of templates/charts.html to lay out."""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.pages.formatting import si

AXIS_TITLE_HEIGHT = 20  # below the bars: what their length measures


@dataclass(frozen=True)
class Bar:
    """One bar of a chart."""

    label: str
    value: float
    text: str = ""  # printed next to (horizontal) or above (vertical) the bar
    ghost: float = 0.0  # a lighter bar drawn behind this one, e.g. a stage's input behind its output
    tooltip: str = ""


@dataclass(frozen=True)
class HBarRow:
    label: str  # shortened to fit the label column
    tooltip: str
    top: float
    middle: float
    ghost_width: float
    bar_width: float
    text: str


@dataclass(frozen=True)
class HBarChart:
    title: str  # what the chart shows, for screen readers
    axis_title: str  # what a bar's length measures, with its unit
    color: str
    ghost_color: str
    width: int
    height: int
    label_x: float  # the labels end here
    x: float  # the bars start here
    plot_width: float
    bar_height: int
    rows: list[HBarRow]

    @property
    def axis_title_y(self) -> float:
        return self.height - 6


@dataclass(frozen=True)
class Column:
    label: str
    tooltip: str
    text: str
    x: float
    y: float
    width: float
    height: float
    center: float


@dataclass(frozen=True)
class ColumnChart:
    title: str
    x_title: str
    y_title: str
    color: str
    width: int
    height: int
    left: float
    right: float  # the plot's right edge
    top: float
    base_y: float
    plot_height: float
    grid: list[tuple[float, str]]  # (y, label) of each horizontal grid line
    columns: list[Column]
    rotate_labels: bool

    @property
    def plot_middle(self) -> float:
        return round(self.top + self.plot_height / 2, 1)


def _shorten(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[: max(1, max_chars - 1)] + "\u2026"


def hbar_chart(
    bars: list[Bar],
    *,
    title: str,
    axis_title: str,
    color: str,
    ghost_color: str,
    scale_max: float | None = None,
    width: int = 720,
    label_width: int = 150,
    text_width: int = 170,
    row_height: int = 24,
) -> HBarChart | None:
    """Horizontal bars, one row per item: label on the left, bar, value text on the right; the
    longest bar (or `scale_max`) spans the plot. None when there is nothing to draw."""
    top = scale_max if scale_max and scale_max > 0 else max((max(b.value, b.ghost) for b in bars), default=0.0)
    if not bars or top <= 0:
        return None
    plot_width = width - label_width - text_width
    max_chars = max(4, (label_width - 14) // 7)
    rows = []
    for index, bar in enumerate(bars):
        row_top = 3 + index * row_height
        bar_width = plot_width * min(1.0, max(0.0, bar.value) / top)
        rows.append(
            HBarRow(
                label=_shorten(bar.label, max_chars),
                tooltip=bar.tooltip or f"{bar.label}: {bar.text}",
                top=row_top + 3,
                middle=row_top + row_height / 2,
                ghost_width=round(plot_width * min(1.0, bar.ghost / top), 1) if bar.ghost > 0 else 0.0,
                bar_width=round(max(bar_width, 1.5) if bar.value > 0 else 0.0, 1),
                text=bar.text,
            )
        )
    return HBarChart(
        title,
        axis_title,
        color,
        ghost_color,
        width,
        len(bars) * row_height + 6 + AXIS_TITLE_HEIGHT,
        label_width - 10,
        label_width,
        plot_width,
        row_height - 6,
        rows,
    )


def column_chart(
    bars: list[Bar], *, title: str, x_title: str, y_title: str, color: str, width: int = 1000, height: int = 300
) -> ColumnChart | None:
    """Vertical bars (a histogram): value above each bar, label below, light horizontal grid
    lines at quarters of the tallest bar. None when there is nothing to draw."""
    top = max((b.value for b in bars), default=0.0)
    if not bars or top <= 0:
        return None
    left, right, top_pad = 72, 8, 22
    slot = (width - left - right) / len(bars)
    rotate = slot < 64
    bottom = (58 if rotate else 30) + AXIS_TITLE_HEIGHT
    plot_height = height - top_pad - bottom
    base_y = top_pad + plot_height
    bar_width = slot * 0.78
    columns = []
    for index, bar in enumerate(bars):
        x = left + index * slot + (slot - bar_width) / 2
        bar_height = plot_height * max(0.0, bar.value) / top
        if bar.value > 0:
            bar_height = max(bar_height, 1.5)
        columns.append(
            Column(
                bar.label,
                bar.tooltip or f"{bar.label}: {bar.text}",
                bar.text,
                round(x, 1),
                round(base_y - bar_height, 1),
                round(bar_width, 1),
                round(bar_height, 1),
                round(x + bar_width / 2, 1),
            )
        )
    grid = [(round(base_y - plot_height * f, 1), si(top * f)) for f in (0.25, 0.5, 0.75, 1.0)]
    return ColumnChart(
        title,
        x_title,
        y_title,
        color,
        width,
        height,
        left,
        width - right,
        top_pad,
        base_y,
        plot_height,
        grid,
        columns,
        rotate,
    )
