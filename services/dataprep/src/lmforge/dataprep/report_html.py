"""Render ``report.json`` as one self-contained HTML page.

Everything is inline: CSS in a ``<style>`` block, charts as hand-written SVG, and a few lines of JavaScript
that make the worker table sortable. The page references nothing outside itself, so it can be opened from
a laptop, attached to a ticket or served from a bucket as it is. Every string that comes from the report is
HTML-escaped before it is written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from html import escape
from typing import Any

TOP_LANGUAGES = 15
MAX_WORKER_ROWS = 200

# Colours used by the charts (kept here so sections stay consistent).
BLUE = "#2563eb"
BLUE_LIGHT = "#dbeafe"
ROSE_LIGHT = "#fecdd3"
TEAL = "#0d9488"
INDIGO = "#4f46e5"
GREEN = "#16a34a"
ORANGE = "#ea580c"
SLATE = "#475569"
ROSE = "#e11d48"
AMBER = "#d97706"
PURPLE = "#7c3aed"


# --------------------------------------------------------------------------------------------------------------
# Small helpers: numbers, units, escaping
# --------------------------------------------------------------------------------------------------------------


def _esc(value: Any) -> str:
    return escape(str(value), quote=True)


def _num(value: Any) -> float:
    """A finite float, whatever the input (None, strings, NaN and infinities become 0)."""
    try:
        result = float(value)
    except (TypeError, ValueError):
        return 0.0
    return result if math.isfinite(result) else 0.0


def _int(value: Any) -> int:
    return int(_num(value))


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _sequence(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def fmt_count(value: Any) -> str:
    """Exact count with thousands separators: ``45,000``."""
    return f"{_int(value):,}"


def fmt_si(value: Any, digits: int = 3) -> str:
    """Compact count with three significant figures: ``4.95 M``, ``812 k``, ``42``."""
    number = _num(value)
    for divisor, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(number) >= divisor:
            scaled = number / divisor
            decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(scaled)))))
            return f"{scaled:.{decimals}f} {suffix}"
    return f"{number:.0f}" if number == int(number) else f"{number:.1f}"


def fmt_bytes(value: Any) -> str:
    """Decimal byte units with one decimal: ``123.5 MB``."""
    number = _num(value)
    for divisor, suffix in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if abs(number) >= divisor:
            return f"{number / divisor:.1f} {suffix}"
    return f"{number:.0f} B"


def fmt_pct(fraction: float) -> str:
    percent = fraction * 100
    if percent == 0:
        return "0%"
    if abs(percent) < 0.1:
        return "<0.1%"
    return f"{percent:.1f}%"


def fmt_seconds(value: Any) -> str:
    seconds = _num(value)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms" if seconds else "0 s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        minutes, rest = divmod(int(round(seconds)), 60)
        return f"{minutes} min {rest} s"
    hours, rest = divmod(int(round(seconds)), 3600)
    return f"{hours} h {rest // 60} min"


def fmt_edge(value: Any) -> str:
    """Token-count bucket edge: ``64``, ``512``, ``2k``, ``16k``."""
    number = _int(value)
    if number >= 1024 and number % 1024 == 0:
        return f"{number // 1024}k"
    return f"{number:,}"


# --------------------------------------------------------------------------------------------------------------
# SVG charts
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    """One bar of a chart."""

    label: str
    value: float
    text: str = ""  # printed next to (horizontal) or above (vertical) the bar
    ghost: float = 0.0  # a lighter bar drawn behind this one, e.g. a stage's input behind its output
    tooltip: str = ""


def _no_data(message: str = "no data") -> str:
    return f'<p class="nodata">{_esc(message)}</p>'


def _truncate(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[: max(1, max_chars - 1)] + "\u2026"


def _svg_open(width: int, height: int, label: str) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {width} {height}" style="max-width:{width}px" '
        f'role="img" aria-label="{_esc(label)}" preserveAspectRatio="xMinYMin meet">'
    )


def _hbar_row(
    bar: Bar, *, x: float, y: float, plot_width: float, top: float, color: str, ghost_color: str, row_height: int
) -> str:
    """One bar (grey track, optional ghost bar, value bar) starting at ``x`` plus its value text after the track."""
    bar_y, bar_h = y + 3, row_height - 6
    parts = [f'<rect x="{x:.1f}" y="{bar_y}" width="{plot_width:.1f}" height="{bar_h}" class="track"/>']
    if bar.ghost > 0 and top > 0:
        ghost_w = plot_width * min(1.0, bar.ghost / top)
        parts.append(f'<rect x="{x:.1f}" y="{bar_y}" width="{ghost_w:.1f}" height="{bar_h}" fill="{ghost_color}"/>')
    bar_w = plot_width * min(1.0, max(0.0, bar.value) / top) if top > 0 else 0.0
    if bar.value > 0:
        bar_w = max(bar_w, 1.5)
    parts.append(f'<rect x="{x:.1f}" y="{bar_y}" width="{bar_w:.1f}" height="{bar_h}" rx="2" fill="{color}"/>')
    parts.append(
        f'<text x="{x + plot_width + 8:.1f}" y="{y + row_height / 2:.1f}" class="val" dominant-baseline="middle">'
        f"{_esc(bar.text)}</text>"
    )
    return "".join(parts)


def _row_label(label: str, *, x: float, y: float, max_chars: int) -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" class="lbl" text-anchor="end" dominant-baseline="middle">'
        f"{_esc(_truncate(label, max_chars))}</text>"
    )


def _tooltip(bar: Bar) -> str:
    return f"<title>{_esc(bar.tooltip or f'{bar.label}: {bar.text}')}</title>"


def hbar_chart(
    bars: list[Bar],
    *,
    title: str,
    color: str,
    ghost_color: str = BLUE_LIGHT,
    scale_max: float | None = None,
    width: int = 720,
    label_width: int = 150,
    text_width: int = 170,
    row_height: int = 24,
) -> str:
    """Horizontal bars, one row per item: label on the left, bar, value text on the right."""
    top = scale_max if scale_max and scale_max > 0 else max((max(b.value, b.ghost) for b in bars), default=0.0)
    if not bars or top <= 0:
        return _no_data()
    plot_width = width - label_width - text_width
    max_chars = max(4, (label_width - 14) // 7)
    parts = [_svg_open(width, len(bars) * row_height + 6, title)]
    for index, bar in enumerate(bars):
        y = 3 + index * row_height
        parts.append(
            "<g>" + _tooltip(bar) + _row_label(bar.label, x=label_width - 10, y=y + row_height / 2, max_chars=max_chars)
        )
        parts.append(
            _hbar_row(
                bar,
                x=label_width,
                y=y,
                plot_width=plot_width,
                top=top,
                color=color,
                ghost_color=ghost_color,
                row_height=row_height,
            )
            + "</g>"
        )
    parts.append("</svg>")
    return "".join(parts)


def multi_hbar_chart(
    labels: list[str],
    columns: list[tuple[str, list[Bar], str]],
    *,
    title: str,
    width: int = 1000,
    label_width: int = 150,
    text_width: int = 80,
    row_height: int = 24,
) -> str:
    """Several horizontal bar charts side by side sharing one label column; ``columns`` = (heading, bars, colour)."""
    if not labels or not columns:
        return _no_data()
    column_width = (width - label_width) / len(columns)
    plot_width = column_width - text_width - 12
    head = 24
    max_chars = max(4, (label_width - 14) // 7)
    parts = [_svg_open(width, head + len(labels) * row_height + 6, title)]
    for col, (heading, _, _) in enumerate(columns):
        x = label_width + col * column_width
        parts.append(f'<text x="{x:.1f}" y="14" class="head">{_esc(heading)}</text>')
    for index, label in enumerate(labels):
        y = head + 3 + index * row_height
        parts.append(_row_label(label, x=label_width - 10, y=y + row_height / 2, max_chars=max_chars))
    for col, (_, bars, color) in enumerate(columns):
        top = max((b.value for b in bars), default=0.0)
        x = label_width + col * column_width
        for index, bar in enumerate(bars[: len(labels)]):
            y = head + 3 + index * row_height
            parts.append(
                "<g>"
                + _tooltip(bar)
                + _hbar_row(
                    bar,
                    x=x,
                    y=y,
                    plot_width=plot_width,
                    top=top,
                    color=color,
                    ghost_color=BLUE_LIGHT,
                    row_height=row_height,
                )
                + "</g>"
            )
    parts.append("</svg>")
    return "".join(parts)


def column_chart(bars: list[Bar], *, title: str, color: str, width: int = 1000, height: int = 280) -> str:
    """Vertical bars (a histogram): value above each bar, label below, light horizontal grid lines."""
    top = max((b.value for b in bars), default=0.0)
    if not bars or top <= 0:
        return _no_data()
    left, right, top_pad = 52, 8, 22
    slot = (width - left - right) / len(bars)
    rotate = slot < 64
    bottom = 58 if rotate else 30
    plot_h = height - top_pad - bottom
    base_y = top_pad + plot_h
    parts = [_svg_open(width, height, title)]
    for fraction in (0.25, 0.5, 0.75, 1.0):
        y = base_y - plot_h * fraction
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(
            f'<text x="{left - 6}" y="{y:.1f}" class="axis" text-anchor="end" dominant-baseline="middle">'
            f"{_esc(fmt_si(top * fraction))}</text>"
        )
    parts.append(f'<line x1="{left}" x2="{width - right}" y1="{base_y}" y2="{base_y}" class="base"/>')
    bar_w = slot * 0.78
    for index, bar in enumerate(bars):
        x = left + index * slot + (slot - bar_w) / 2
        center = x + bar_w / 2
        bar_h = plot_h * max(0.0, bar.value) / top
        if bar.value > 0:
            bar_h = max(bar_h, 1.5)
        parts.append("<g>")
        parts.append(f"<title>{_esc(bar.tooltip or f'{bar.label}: {bar.text}')}</title>")
        parts.append(
            f'<rect x="{x:.1f}" y="{base_y - bar_h:.1f}" width="{bar_w:.1f}" height="{bar_h:.1f}" rx="2" '
            f'fill="{color}"/>'
        )
        parts.append(
            f'<text x="{center:.1f}" y="{base_y - bar_h - 5:.1f}" class="val" text-anchor="middle">'
            f"{_esc(bar.text)}</text>"
        )
        if rotate:
            parts.append(
                f'<text x="{center:.1f}" y="{base_y + 12}" class="lbl" text-anchor="end" '
                f'transform="rotate(-40 {center:.1f} {base_y + 12})">{_esc(bar.label)}</text>'
            )
        else:
            parts.append(
                f'<text x="{center:.1f}" y="{base_y + 18}" class="lbl" text-anchor="middle">{_esc(bar.label)}</text>'
            )
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def _counts_chart(
    counts: Mapping[str, Any], *, title: str, color: str, total: float = 0.0, width: int = 720, label_width: int = 150
) -> str:
    """Bar chart of a ``name -> count`` mapping, largest first; share of ``total`` shown when given."""
    items = sorted(((str(k), _num(v)) for k, v in counts.items()), key=lambda kv: (-kv[1], kv[0]))
    bars = [
        Bar(name, value, fmt_count(value) + (f"  ({fmt_pct(_ratio(value, total))})" if total else ""))
        for name, value in items
    ]
    return hbar_chart(bars, title=title, color=color, width=width, label_width=label_width, text_width=110)


# --------------------------------------------------------------------------------------------------------------
# HTML building blocks
# --------------------------------------------------------------------------------------------------------------


def _section(section_id: str, title: str, body: str, subtitle: str = "") -> str:
    sub = f'<p class="sub">{_esc(subtitle)}</p>' if subtitle else ""
    return f'<section id="{_esc(section_id)}"><h2>{_esc(title)}</h2>{sub}{body}</section>'


def _table(headers: Iterable[str], rows: Iterable[Iterable[str]], *, numeric: Iterable[int] = (), css: str = "") -> str:
    """A table; ``rows`` hold already-escaped cell HTML. Columns listed in ``numeric`` are right-aligned."""
    numeric_cols = set(numeric)

    def cell(tag: str, index: int, content: str) -> str:
        cls = ' class="num"' if index in numeric_cols else ""
        return f"<{tag}{cls}>{content}</{tag}>"

    head = "".join(cell("th", i, _esc(h)) for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>" for row in rows)
    cls = f' class="{_esc(css)}"' if css else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _share_cell(fraction: float, color: str = BLUE) -> str:
    """A percentage with a small inline bar behind it (used inside tables)."""
    width = max(0.0, min(100.0, fraction * 100))
    return (
        f'<span class="minibar"><span style="width:{width:.1f}%;background:{color}"></span></span>'
        f"{_esc(fmt_pct(fraction))}"
    )


def _stat(value: str, label: str, css: str = "") -> str:
    cls = f"stat {css}".strip()
    return f'<div class="{cls}"><div class="v">{_esc(value)}</div><div class="k">{_esc(label)}</div></div>'


# --------------------------------------------------------------------------------------------------------------
# Stage data, normalised once
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    name: str
    phase: str
    docs_in: int
    docs_out: int
    text_bytes_in: int | None  # None: the stage moves no text (shards)
    text_bytes_out: int | None
    worker_seconds: float
    dropped: dict[str, int]
    counters: dict[str, int]
    drop_rate: float
    docs_per_worker_second: float
    text_mb_per_worker_second: float | None


def _optional_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def _stage(raw: Any) -> Stage:
    data = _mapping(raw)
    docs_in, docs_out = _int(data.get("docs_in")), _int(data.get("docs_out"))
    seconds = _num(data.get("worker_seconds"))
    text_in = _optional_int(data.get("text_bytes_in"))
    drop_rate = data.get("drop_rate")
    return Stage(
        name=str(data.get("name", "?")),
        phase=str(data.get("phase", "")),
        docs_in=docs_in,
        docs_out=docs_out,
        text_bytes_in=text_in,
        text_bytes_out=_optional_int(data.get("text_bytes_out")),
        worker_seconds=seconds,
        dropped={str(k): _int(v) for k, v in _mapping(data.get("dropped")).items()},
        counters={str(k): _int(v) for k, v in _mapping(data.get("counters")).items()},
        drop_rate=_num(drop_rate) if drop_rate is not None else _ratio(docs_in - docs_out, docs_in),
        docs_per_worker_second=_ratio(docs_in, seconds),
        text_mb_per_worker_second=None if text_in is None else _ratio(text_in / 1e6, seconds),
    )


def _funnel_base(stages: list[Stage]) -> float:
    """Reference for the funnel: the first stage's input (or, failing that, the largest count seen)."""
    if stages and stages[0].docs_in > 0:
        return float(stages[0].docs_in)
    return float(max((max(s.docs_in, s.docs_out) for s in stages), default=0))


# --------------------------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------------------------


def _input_files_label(inputs: Mapping[str, Any]) -> str:
    """What the input file bytes are: compressed when they all come from gzip files."""
    total, gzip = _int(inputs.get("file_bytes")), _int(inputs.get("gzip_file_bytes"))
    if total and gzip == total:
        return "compressed input (gzip files)"
    if gzip:
        return f"input files as stored ({fmt_bytes(gzip)} of it gzip-compressed)"
    return "input files as stored (uncompressed)"


def _output_text(output: Any) -> str:
    return "this report's directory" if output in (".", "") else str(output)


def _header(report: Mapping[str, Any]) -> str:
    inputs = _mapping(report.get("inputs"))
    totals = _mapping(report.get("totals"))
    records = _int(inputs.get("records"))
    kept_docs = _int(totals.get("kept_docs"))
    wall = totals.get("wall_seconds")
    flow = (
        '<div class="flow">'
        f'<div class="big"><div class="v">{_esc(fmt_bytes(totals.get("input_file_bytes")))}</div>'
        f'<div class="k">{_esc(_input_files_label(inputs))}</div></div>'
        '<div class="arrow">\u2192</div>'
        f'<div class="big"><div class="v">{_esc(fmt_count(kept_docs))}</div><div class="k">kept docs'
        f" ({_esc(fmt_pct(_ratio(kept_docs, records)))} of {_esc(fmt_count(records))} records)</div></div>"
        '<div class="arrow">\u2192</div>'
        f'<div class="big"><div class="v">{_esc(fmt_si(totals.get("output_tokens")))} tokens</div>'
        '<div class="k">output</div></div>'
        "</div>"
    )
    stats = "".join(
        [
            _stat(fmt_count(inputs.get("files")), "input files"),
            _stat(fmt_bytes(totals.get("input_text_bytes")), "input text (uncompressed)"),
            _stat(fmt_bytes(totals.get("kept_text_bytes")), "kept text (uncompressed)"),
            _stat(fmt_si(totals.get("train_tokens")), "train tokens"),
            _stat(fmt_si(totals.get("val_tokens")), "val tokens"),
            _stat(
                f"{fmt_count(totals.get('train_shards'))} / {fmt_count(totals.get('val_shards'))}", "shards train/val"
            ),
            _stat(f"{_num(totals.get('tokens_per_kept_text_byte')):.3f}", "tokens per kept text byte"),
            _stat(fmt_count(totals.get("vocab_size")), "vocab size"),
            _stat(fmt_seconds(wall) if wall is not None else "not recorded", "wall time (sum of phases)"),
        ]
    )
    meta = (
        f'<p class="meta">output <code>{_esc(_output_text(report.get("output", "")))}</code>'
        f" \u00b7 generated by {_esc(report.get('generated_by', ''))}</p>"
    )
    title = _esc(report.get("title") or "lmforge data-prep report")
    return f'<header id="summary"><h1>{title}</h1>{meta}{flow}<div class="stats">{stats}</div></header>'


def _bad_input_section(report: Mapping[str, Any]) -> str:
    bad = _mapping(_mapping(report.get("inputs")).get("bad_input"))
    if not bad:
        return _section("bad-input", "Bad input", _no_data())
    chips = []
    for reason, count in sorted(bad.items(), key=lambda kv: (-_num(kv[1]), str(kv[0]))):
        css = "chip bad" if _int(count) else "chip"
        chips.append(f'<span class="{css}"><b>{_esc(fmt_count(count))}</b> {_esc(reason)}</span>')
    total = sum(_int(v) for v in bad.values())
    subtitle = f"{fmt_count(total)} problem(s) in the input files" if total else "every input file read cleanly"
    body = f'<div class="chips">{"".join(chips)}</div>' + _reader_accounting(report)
    return _section("bad-input", "Bad input", body, subtitle)


READER_LABELS = {
    "input_bytes": "input file bytes (as stored: compressed for .gz)",
    "input_files": "input files",
    "unreadable_inputs": "inputs that could not be opened",
}


def _reader_accounting(report: Mapping[str, Any]) -> str:
    """The reader's own counters: what it read and what it could not, as it counted them."""
    counters = _mapping(_mapping(report.get("inputs")).get("reader"))
    if not counters:
        return ""
    rows = [
        [_esc(READER_LABELS.get(name, name)), _esc(fmt_bytes(value) if name.endswith("bytes") else fmt_count(value))]
        for name, value in sorted(counters.items())
    ]
    return "<h3>Reader accounting</h3>" + _table(["counter", "value"], rows, numeric=[1])


def _funnel_section(stages: list[Stage]) -> str:
    base = _funnel_base(stages)
    if not stages or base <= 0:
        return _section("funnel", "Per-stage funnel", _no_data())
    bars = [
        Bar(
            s.name,
            s.docs_out,
            f"{fmt_si(s.docs_out)} docs  ({fmt_pct(_ratio(s.docs_out, base))})",
            ghost=s.docs_in,
            tooltip=f"{s.name}: {fmt_count(s.docs_in)} in \u2192 {fmt_count(s.docs_out)} out",
        )
        for s in stages
    ]
    chart = hbar_chart(
        bars,
        title="documents kept per stage",
        color=BLUE,
        ghost_color=ROSE_LIGHT,
        scale_max=base,
        width=1000,
        label_width=170,
    )
    legend = (
        f'<p class="legend"><span class="sw" style="background:{BLUE}"></span>docs out'
        f'<span class="sw" style="background:{ROSE_LIGHT}"></span>dropped by the stage'
        f" \u00b7 100% = {_esc(fmt_count(base))} docs entering the first stage</p>"
    )
    rows = [
        [
            _esc(s.name),
            _esc(fmt_count(s.docs_in)),
            _esc(fmt_count(s.docs_out)),
            _esc(fmt_count(s.docs_in - s.docs_out)),
            _share_cell(s.drop_rate, ROSE),
            _esc(fmt_bytes(s.text_bytes_in) if s.text_bytes_in is not None else "\u2014"),
            _esc(fmt_bytes(s.text_bytes_out) if s.text_bytes_out is not None else "\u2014"),
            _esc(fmt_pct(_ratio(s.docs_out, base))),
        ]
        for s in stages
    ]
    table = _table(
        ["stage", "docs in", "docs out", "dropped", "drop rate", "text in (uncompressed)", "text out (uncompressed)",
         "kept of total"],
        rows,
        numeric=range(1, 8),
    )
    return _section(
        "funnel",
        "Per-stage funnel",
        chart + legend + table + _counters_details(stages),
        "Documents surviving each stage, relative to what entered the pipeline.",
    )


def _counters_details(stages: list[Stage]) -> str:
    rows = [
        [_esc(s.name), _esc(name), _esc(fmt_count(count))] for s in stages for name, count in sorted(s.counters.items())
    ]
    if not rows:
        return ""
    table = _table(["stage", "counter", "count"], rows, numeric=[2])
    return f"<details><summary>Extra per-stage counters ({len(rows)})</summary>{table}</details>"


def _drop_reasons_section(stages: list[Stage]) -> str:
    total_in = _funnel_base(stages)
    rows = []
    for s in stages:
        reasons = sorted(s.dropped.items(), key=lambda kv: (-kv[1], kv[0]))
        for index, (reason, count) in enumerate(reasons):
            first = index == 0
            rows.append(
                [
                    f"<b>{_esc(s.name)}</b>" if first else "",
                    _esc(reason),
                    _esc(fmt_count(count)),
                    _share_cell(_ratio(count, s.docs_in), ROSE),
                    _esc(fmt_pct(_ratio(count, total_in))),
                ]
            )
    if not rows:
        return _section("drop-reasons", "Drop reasons per stage", _no_data("no documents were dropped"))
    table = _table(
        ["stage", "reason", "docs", "share of stage input", "share of all input"], rows, numeric=[2, 4], css="reasons"
    )
    return _section("drop-reasons", "Drop reasons per stage", table)


def _languages_section(report: Mapping[str, Any]) -> str:
    languages = {str(k): _num(v) for k, v in _mapping(report.get("languages")).items() if _num(v) > 0}
    total = sum(languages.values())
    ranked = sorted(languages.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ranked[:TOP_LANGUAGES]
    other = sum(v for _, v in ranked[TOP_LANGUAGES:])
    bars = [Bar(code, value, f"{fmt_count(value)}  ({fmt_pct(_ratio(value, total))})") for code, value in shown]
    if other:
        rest = len(ranked) - TOP_LANGUAGES
        bars.append(Bar(f"other ({rest})", other, f"{fmt_count(other)}  ({fmt_pct(_ratio(other, total))})"))
    subtitle = f"{len(languages)} language(s) among {fmt_count(total)} documents that reached language ID"
    return _section(
        "languages",
        "Language mix",
        hbar_chart(bars, title="documents per language", color=TEAL, width=900),
        subtitle if languages else "",
    )


def _bucket_label(edges: list[Any], index: int) -> str:
    if index + 1 < len(edges):
        return f"{fmt_edge(edges[index])}\u2013{fmt_edge(edges[index + 1])}"
    return f"\u2265{fmt_edge(edges[index])}"


def _bucket_tooltip(edges: list[Any], index: int) -> str:
    if index + 1 < len(edges):
        return f"{fmt_count(edges[index])} \u2264 tokens < {fmt_count(edges[index + 1])}"
    return f"tokens \u2265 {fmt_count(edges[index])}"


def _doc_length_section(report: Mapping[str, Any]) -> str:
    data = _mapping(report.get("doc_length_tokens"))
    edges, counts = _sequence(data.get("edges")), [_num(c) for c in _sequence(data.get("counts"))]
    size = min(len(edges), len(counts))
    total = sum(counts[:size])
    bars = [
        Bar(
            _bucket_label(edges, i),
            counts[i],
            fmt_si(counts[i]),
            tooltip=f"{_bucket_tooltip(edges, i)}: {fmt_count(counts[i])} docs ({fmt_pct(_ratio(counts[i], total))})",
        )
        for i in range(size)
    ]
    subtitle = ""
    if total:
        running, median_index = 0.0, 0
        for median_index in range(size):
            running += counts[median_index]
            if running >= total / 2:
                break
        subtitle = (
            f"{fmt_count(total)} documents; the median document is in the "
            f"{_bucket_label(edges, median_index)} token bucket"
        )
    chart = column_chart(bars, title="document length in tokens", color=INDIGO)
    return _section("doc-length", "Document length (tokens)", chart, subtitle)


def _phase_processed(phase: Mapping[str, Any]) -> str:
    """What a phase got through, each size labelled."""
    parts = []
    if phase.get("file_bytes") is not None:
        parts.append(f"{fmt_bytes(phase.get('file_bytes'))} input files")
    if _int(phase.get("text_bytes")):
        parts.append(f"{fmt_bytes(phase.get('text_bytes'))} text (uncompressed)")
    if _int(phase.get("docs")):
        parts.append(f"{fmt_count(phase.get('docs'))} docs")
    if _int(phase.get("tokens")):
        parts.append(f"{fmt_si(phase.get('tokens'))} tokens")
    return " \u00b7 ".join(parts) or "\u2014"


def _phase_throughput(phase: Mapping[str, Any]) -> str:
    """Throughput over the phase's wall-clock, each rate labelled."""
    if _num(phase.get("wall_seconds")) <= 0:
        return "\u2014"
    parts = []
    if phase.get("file_bytes") is not None:
        parts.append(f"{_num(phase.get('file_mb_per_second')):,.1f} MB/s input files")
    if _int(phase.get("text_bytes")):
        parts.append(f"{_num(phase.get('text_mb_per_second')):,.1f} MB/s text")
    if _int(phase.get("docs")):
        parts.append(f"{fmt_si(phase.get('docs_per_second'))} docs/s")
    if _int(phase.get("tokens")):
        parts.append(f"{fmt_si(phase.get('tokens_per_second'))} tokens/s")
    return " \u00b7 ".join(parts) or "\u2014"


def _phases_table(phases: list[Mapping[str, Any]]) -> str:
    total = sum(_num(p.get("wall_seconds")) for p in phases)
    bars = [
        Bar(str(p.get("name", "?")), _num(p.get("wall_seconds")), fmt_seconds(p.get("wall_seconds")),
            tooltip=f"{p.get('label', '')}: {fmt_seconds(p.get('wall_seconds'))} wall-clock")
        for p in phases
    ]
    chart = hbar_chart(bars, title="wall-clock seconds per phase", color=SLATE, width=1000, label_width=170)
    rows = [
        [
            f"<b>{_esc(p.get('name', '?'))}</b><br><span class=\"sub\">{_esc(p.get('label', ''))}</span>",
            _esc(fmt_seconds(p.get("wall_seconds"))),
            _share_cell(_ratio(_num(p.get("wall_seconds")), total), SLATE),
            _esc(fmt_count(p.get("processes"))),
            _esc(fmt_seconds(p.get("cpu_seconds"))),
            _esc(fmt_bytes(p.get("peak_rss_bytes"))),
            _esc(_phase_processed(p)),
            _esc(_phase_throughput(p)),
        ]
        for p in phases
    ]
    table = _table(
        ["phase", "wall-clock", "share of wall-clock", "processes", "CPU seconds", "main peak RSS", "processed",
         "throughput (per wall-clock second)"],
        rows,
        numeric=[1, 3, 4, 5],
    )
    return f"<h3>Wall-clock by phase</h3>{chart}{table}"


def _stage_time_table(stages: list[Stage]) -> str:
    timed = [s for s in stages if s.worker_seconds > 0]
    if not timed:
        return ""
    total = sum(s.worker_seconds for s in timed)
    rows = [
        [
            _esc(s.name),
            _esc(s.phase),
            _esc(fmt_seconds(s.worker_seconds)),
            _share_cell(_ratio(s.worker_seconds, total), SLATE),
            _esc(f"{fmt_si(s.docs_per_worker_second)}/s"),
            _esc(f"{s.text_mb_per_worker_second:,.1f} MB/s" if s.text_mb_per_worker_second is not None else "\u2014"),
        ]
        for s in timed
    ]
    table = _table(
        ["stage", "phase", "worker seconds", "share of worker time", "docs per worker-second",
         "text MB per worker-second"],
        rows,
        numeric=[2, 4, 5],
    )
    return (
        "<h3>Time inside each stage (summed over worker processes)</h3>"
        '<p class="sub">Not wall-clock: the time worker processes spent in each stage, added up over all of them '
        "(for global_dedup, the CPU time of the dedup phase). Rates are per worker-second, i.e. per core.</p>"
        + table
    )


def _throughput_section(report: Mapping[str, Any], stages: list[Stage]) -> str:
    phases = [_mapping(p) for p in _sequence(report.get("phases"))]
    if not any(_num(p.get("wall_seconds")) > 0 for p in phases):
        body = _no_data("no timings recorded") + _stage_time_table(stages)
        return _section("throughput", "Time and throughput", body)
    total = sum(_num(p.get("wall_seconds")) for p in phases)
    return _section(
        "throughput",
        "Time and throughput",
        _phases_table(phases) + _stage_time_table(stages),
        f"{fmt_seconds(total)} of wall-clock over the phases; a phase run by several processes at once counts once.",
    )


def _pii_panel(pii: Mapping[str, Any]) -> str:
    if pii.get("enabled") is False:
        return '<div class="panel"><h3>PII: check off</h3>' + _no_data("check off (pii.enabled is false)") + "</div>"
    items = _mapping(pii.get("items_scrubbed"))
    documents, total = _int(pii.get("documents_touched")), sum(_int(v) for v in items.values())
    head = (
        f"<h3>PII: {_esc(fmt_count(documents))} documents touched, {_esc(fmt_count(total))} items scrubbed</h3>"
    )
    chart = _counts_chart(items, title="PII items scrubbed", color=ROSE, width=460) if total else _no_data(
        "no PII found"
    )
    kept = _mapping(pii.get("items_kept"))
    note = (
        '<p class="sub">kept, not personal data: '
        + _esc(", ".join(f"{fmt_count(v)} {k}" for k, v in sorted(kept.items())))
        + "</p>"
        if kept
        else ""
    )
    return f'<div class="panel">{head}<p class="sub">items scrubbed by kind:</p>{chart}{note}</div>'


def _contamination_panel(contamination: Mapping[str, Any]) -> str:
    if not contamination.get("enabled"):
        return (
            '<div class="panel"><h3>Contamination: check off</h3>'
            + _no_data("check off: no eval set configured (contamination.eval_sets)")
            + "</div>"
        )
    removed, checked = _int(contamination.get("documents_removed")), _int(contamination.get("documents_checked"))
    sets = ", ".join(str(s) for s in _sequence(contamination.get("eval_sets")))
    per_set = _mapping(contamination.get("documents_per_eval_set"))
    chart = (
        _counts_chart(per_set, title="documents matching each eval set", color=AMBER, width=460)
        if removed
        else _no_data(f"no contamination found in {fmt_count(checked)} documents checked")
    )
    return (
        f'<div class="panel"><h3>Contamination: {_esc(fmt_count(removed))} documents removed</h3>'
        f'<p class="sub">{_esc(fmt_count(checked))} documents checked against {_esc(sets)}</p>{chart}</div>'
    )


def _pii_contamination_section(report: Mapping[str, Any]) -> str:
    body = (
        '<div class="panels two">'
        + _pii_panel(_mapping(report.get("pii")))
        + _contamination_panel(_mapping(report.get("contamination")))
        + "</div>"
    )
    return _section("pii", "PII and contamination", body)


DEDUP_LABELS = {
    ("within_input", "duplicate_url"): "same URL, within an input",
    ("within_input", "duplicate_content"): "exact same text, within an input",
    ("removed", "duplicate_url"): "same URL, across inputs",
    ("removed", "duplicate_content"): "exact same text, across inputs",
    ("removed", "near_duplicate"): "near-duplicate (MinHash), across inputs",
}


def _dedup_section(report: Mapping[str, Any]) -> str:
    dedup = _mapping(report.get("dedup"))
    counts: dict[str, float] = {}
    for scope in ("within_input", "removed"):
        for reason, value in _mapping(dedup.get(scope)).items():
            counts[DEDUP_LABELS.get((scope, str(reason)), f"{reason} ({scope})")] = _num(value)
    total = sum(counts.values())
    url_exact = sum(v for k, v in counts.items() if not k.startswith("near"))
    near = total - url_exact
    stats = "".join(
        [
            _stat(fmt_count(total), "documents removed as duplicates"),
            _stat(fmt_count(url_exact), "URL / exact-text duplicates"),
            _stat(fmt_count(near), "near-duplicates (MinHash)"),
            _stat(fmt_count(dedup.get("near_duplicate_groups")), "near-duplicate groups"),
            _stat(fmt_count(dedup.get("clusters")), "duplicate clusters across inputs (URL, exact or near)"),
        ]
    )
    chart = (
        _counts_chart(counts, title="documents removed by dedup", color=PURPLE, total=total, label_width=300)
        if total
        else _no_data("no duplicates removed")
    )
    note = (
        '<p class="sub">near-duplicate detection is off (minhash.enabled is false)</p>'
        if dedup.get("near_duplicate_enabled") is False
        else ""
    )
    return _section("dedup", "Deduplication", f'<div class="stats">{stats}</div>{note}{chart}')


def _worker_issue(worker: Mapping[str, Any]) -> str:
    parts = []
    if worker.get("error"):
        parts.append(f'<span class="err">{_esc(worker.get("error"))}</span>')
    problems = _mapping(worker.get("problems"))
    if problems:
        parts.append(_esc(", ".join(f"{fmt_count(v)} {k}" for k, v in sorted(problems.items()))))
    return "<br>".join(parts)


def _worker_task(worker: Mapping[str, Any]) -> str:
    if worker.get("input"):
        return f'<span class="path">{_esc(worker.get("input"))}</span>'
    where = f" (pid {worker.get('pid')} on {worker.get('host')})" if worker.get("pid") is not None else ""
    return f"<b>{_esc(worker.get('task', 'main process'))}</b>{_esc(where)}"


def _workers_section(report: Mapping[str, Any]) -> str:
    workers = [_mapping(w) for w in _sequence(report.get("workers"))]
    if not workers:
        return _section("workers", "Workers", _no_data())
    # inputs with an error first, then the slowest
    workers.sort(key=lambda w: (not (w.get("error") or w.get("problems")), -_num(w.get("seconds"))))
    slowest = max(_num(w.get("seconds")) for w in workers)
    peak = max(workers, key=lambda w: _num(w.get("peak_rss_bytes")))
    shown = [w for i, w in enumerate(workers)
             if i < MAX_WORKER_ROWS or w.get("error") or w.get("task") == "main process"]
    rows = [
        [
            _esc(w.get("phase", "")),
            _worker_task(w),
            f'<span data-v="{_num(w.get("seconds"))}">{_share_bar(_ratio(_num(w.get("seconds")), slowest))}'
            f"{_esc(fmt_seconds(w.get('seconds')))}</span>",
            f'<span data-v="{_num(w.get("peak_rss_bytes"))}">{_esc(fmt_bytes(w.get("peak_rss_bytes")))}</span>',
            _worker_issue(w),
        ]
        for w in shown
    ]
    errors = sum(1 for w in workers if w.get("error"))
    note = f" (showing {len(shown)})" if len(shown) < len(workers) else ""
    subtitle = (
        f"{len(workers)} row(s){note}: each input's filter and tokenize task, and each main process per phase; "
        f"{errors} input(s) with an error; slowest {fmt_seconds(slowest)}; highest peak RSS "
        f"{fmt_bytes(peak.get('peak_rss_bytes'))} ({peak.get('task', '')}, {peak.get('phase', '')}). "
        "Click a column header to sort."
    )
    table = _table(["phase", "task", "seconds", "peak RSS", "error / bad input"], rows, numeric=[2, 3],
                   css="sortable")
    return _section("workers", "Workers", table, subtitle)


def _share_bar(fraction: float) -> str:
    width = max(0.0, min(100.0, fraction * 100))
    return f'<span class="minibar"><span style="width:{width:.1f}%;background:{SLATE}"></span></span>'


def _config_section(report: Mapping[str, Any]) -> str:
    config = report.get("config")
    if not isinstance(config, Mapping) or not config:
        return _section("config", "Config used", _no_data())
    text = json.dumps(config, indent=1, sort_keys=True)
    return _section(
        "config",
        "Config used",
        f"<pre>{_esc(text)}</pre>",
        "The resolved data-prep config (defaults, file, environment and --set), secrets redacted.",
    )


# --------------------------------------------------------------------------------------------------------------
# Page
# --------------------------------------------------------------------------------------------------------------

_CSS = """
:root { --fg:#0f172a; --muted:#64748b; --line:#e2e8f0; --bg:#f8fafc; --card:#fff; }
* { box-sizing:border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
       font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif; }
main { max-width:1080px; margin:0 auto; padding:24px 20px 60px; }
header { background:#0f172a; color:#f8fafc; border-radius:12px; padding:22px 26px; margin-bottom:18px; }
header h1 { margin:0 0 4px; font-size:22px; font-weight:650; }
header .meta { margin:0 0 16px; color:#94a3b8; font-size:13px; }
header code { color:#e2e8f0; word-break:break-all; }
.flow { display:flex; align-items:center; gap:14px; flex-wrap:wrap; margin-bottom:16px; }
.flow .big { background:#1e293b; border-radius:10px; padding:12px 18px; min-width:200px; }
.flow .big .v { font-size:28px; font-weight:700; letter-spacing:-0.02em; }
.flow .big .k { color:#94a3b8; font-size:13px; }
.flow .arrow { font-size:28px; color:#60a5fa; }
.stats { display:grid; grid-template-columns:repeat(auto-fill,minmax(170px,1fr)); gap:10px; }
header .stats { grid-template-columns:repeat(3,1fr); }
.stat { border:1px solid var(--line); border-radius:8px; padding:8px 12px; background:var(--card); }
header .stat { background:#1e293b; border-color:#334155; }
.stat .v { font-size:18px; font-weight:650; }
.stat .k { color:var(--muted); font-size:12px; }
header .stat .k { color:#94a3b8; }
section { background:var(--card); border:1px solid var(--line); border-radius:12px; padding:18px 22px;
          margin-bottom:18px; }
section h2 { margin:0 0 4px; font-size:17px; }
section h3 { margin:4px 0 6px; font-size:13px; color:var(--muted); font-weight:600; text-transform:uppercase;
             letter-spacing:0.04em; }
.sub { margin:0 0 12px; color:var(--muted); font-size:13px; }
.nodata { color:var(--muted); font-style:italic; margin:8px 0; }
.chips { display:flex; flex-wrap:wrap; gap:8px; margin-top:8px; }
.chip { border:1px solid var(--line); border-radius:999px; padding:4px 12px; color:var(--muted); background:#f1f5f9; }
.chip.bad { background:#fef2f2; border-color:#fca5a5; color:#991b1b; }
.chip b { font-weight:700; }
svg.chart { display:block; width:100%; height:auto; margin:6px 0 10px; }
svg.chart text { font-size:12px; fill:#334155; }
svg.chart text.val { fill:#0f172a; font-variant-numeric:tabular-nums; }
svg.chart text.axis { fill:#94a3b8; font-size:11px; }
svg.chart text.head { fill:#64748b; font-size:12px; font-weight:600; }
svg.chart rect.track { fill:#f1f5f9; }
svg.chart line.grid { stroke:#e2e8f0; stroke-dasharray:3 3; }
svg.chart line.base { stroke:#94a3b8; }
svg.chart g:hover rect:not(.track) { opacity:0.8; }
.legend { color:var(--muted); font-size:12px; margin:0 0 12px; }
.legend .sw { display:inline-block; width:12px; height:12px; border-radius:2px; vertical-align:-2px;
              margin:0 5px 0 12px; }
.legend .sw:first-child { margin-left:0; }
table { border-collapse:collapse; width:100%; margin:8px 0; font-variant-numeric:tabular-nums; }
th, td { text-align:left; padding:5px 10px; border-bottom:1px solid var(--line); vertical-align:middle; }
th { font-size:12px; color:var(--muted); font-weight:600; background:#f8fafc; }
th.num, td.num { text-align:right; white-space:nowrap; }
tbody tr:hover { background:#f8fafc; }
table.reasons td:first-child { white-space:nowrap; }
table.sortable th { cursor:pointer; user-select:none; }
table.sortable th[data-dir=asc]::after { content:" \\25B2"; }
table.sortable th[data-dir=desc]::after { content:" \\25BC"; }
.minibar { display:inline-block; width:60px; height:8px; background:#f1f5f9; border-radius:4px;
           margin-right:8px; vertical-align:0; overflow:hidden; }
.minibar span { display:block; height:100%; }
.path { font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; font-size:12px; word-break:break-all; }
.panels { display:grid; grid-template-columns:repeat(auto-fit,minmax(300px,1fr)); gap:14px; }
.panels.two { grid-template-columns:repeat(auto-fit,minmax(380px,1fr)); }
details { margin-top:8px; }
summary { cursor:pointer; color:var(--muted); font-size:13px; }
pre { background:#f8fafc; border:1px solid var(--line); border-radius:8px; padding:10px 14px; margin:8px 0;
      font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; max-height:480px; overflow:auto; }
.err { color:#991b1b; font-weight:600; }
footer { color:var(--muted); font-size:12px; text-align:center; }
"""

_SORT_JS = """
document.querySelectorAll("table.sortable th").forEach(function (th) {
  th.addEventListener("click", function () {
    var table = th.closest("table"), body = table.tBodies[0], col = th.cellIndex;
    var asc = th.getAttribute("data-dir") !== "asc";
    var key = function (row) {
      var cell = row.cells[col], tagged = cell.querySelector("[data-v]");
      return tagged ? tagged.getAttribute("data-v") : cell.textContent.trim();
    };
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = key(a), y = key(b), nx = parseFloat(x), ny = parseFloat(y);
      var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
      return asc ? c : -c;
    });
    th.parentNode.querySelectorAll("th").forEach(function (h) { h.removeAttribute("data-dir"); });
    th.setAttribute("data-dir", asc ? "asc" : "desc");
    rows.forEach(function (row) { body.appendChild(row); });
  });
});
"""


def render_report_html(report: dict) -> str:
    """Render a ``report.json`` dict as a self-contained HTML page (inline CSS, inline SVG, no external refs)."""
    report = _mapping(report)
    stages = [_stage(raw) for raw in _sequence(report.get("stages"))]
    title = _esc(report.get("title") or "lmforge data-prep report")
    body = "".join(
        [
            _header(report),
            _bad_input_section(report),
            _funnel_section(stages),
            _drop_reasons_section(stages),
            _languages_section(report),
            _doc_length_section(report),
            _throughput_section(report, stages),
            _pii_contamination_section(report),
            _dedup_section(report),
            _workers_section(report),
            _config_section(report),
            f"<footer>{_esc(report.get('generated_by', ''))}</footer>",
        ]
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{title}</title><style>{_CSS}</style></head>"
        f"<body><main>{body}</main><script>{_SORT_JS}</script></body></html>\n"
    )
