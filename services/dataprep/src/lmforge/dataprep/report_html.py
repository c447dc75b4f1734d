"""Render ``report.json`` as one self-contained HTML page.

Everything is inline: CSS in a ``<style>`` block, charts as hand-written SVG, and a few lines of JavaScript
that make the worker table sortable. The page references nothing outside itself, so it can be opened from
a laptop, attached to a ticket or served from a bucket as it is. Every string that comes from the report is
HTML-escaped before it is written.
"""

from __future__ import annotations

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
    docs_in: int
    docs_out: int
    bytes_in: int
    bytes_out: int
    seconds: float
    cpu_seconds: float
    dropped: dict[str, int]
    counters: dict[str, int]
    drop_rate: float
    docs_per_second: float
    mb_per_second: float


def _stage(raw: Any) -> Stage:
    data = _mapping(raw)
    docs_in, docs_out = _int(data.get("docs_in")), _int(data.get("docs_out"))
    seconds = _num(data.get("seconds"))
    bytes_in = _int(data.get("bytes_in"))
    drop_rate = data.get("drop_rate")
    docs_per_second = data.get("docs_per_second")
    mb_per_second = data.get("mb_per_second")
    return Stage(
        name=str(data.get("name", "?")),
        docs_in=docs_in,
        docs_out=docs_out,
        bytes_in=bytes_in,
        bytes_out=_int(data.get("bytes_out")),
        seconds=seconds,
        cpu_seconds=_num(data.get("cpu_seconds")),
        dropped={str(k): _int(v) for k, v in _mapping(data.get("dropped")).items()},
        counters={str(k): _int(v) for k, v in _mapping(data.get("counters")).items()},
        drop_rate=_num(drop_rate) if drop_rate is not None else _ratio(docs_in - docs_out, docs_in),
        docs_per_second=_num(docs_per_second) if docs_per_second is not None else _ratio(docs_in, seconds),
        mb_per_second=_num(mb_per_second) if mb_per_second is not None else _ratio(bytes_in / 1e6, seconds),
    )


def _funnel_base(stages: list[Stage]) -> float:
    """Reference for the funnel: the first stage's input (or, failing that, the largest count seen)."""
    if stages and stages[0].docs_in > 0:
        return float(stages[0].docs_in)
    return float(max((max(s.docs_in, s.docs_out) for s in stages), default=0))


# --------------------------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------------------------


def _header(report: Mapping[str, Any]) -> str:
    inputs = _mapping(report.get("inputs"))
    totals = _mapping(report.get("totals"))
    input_bytes = totals.get("input_bytes") or inputs.get("bytes")
    records = _int(inputs.get("records"))
    kept_docs = _int(totals.get("kept_docs"))
    flow = (
        '<div class="flow">'
        f'<div class="big"><div class="v">{_esc(fmt_bytes(input_bytes))}</div><div class="k">input</div></div>'
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
            _stat(fmt_bytes(totals.get("kept_bytes")), "kept text"),
            _stat(fmt_si(totals.get("train_tokens")), "train tokens"),
            _stat(fmt_si(totals.get("val_tokens")), "val tokens"),
            _stat(
                f"{fmt_count(totals.get('train_shards'))} / {fmt_count(totals.get('val_shards'))}", "shards train/val"
            ),
            _stat(f"{_num(totals.get('tokens_per_input_byte')):.3f}", "tokens per input byte"),
            _stat(fmt_count(totals.get("vocab_size")), "vocab size"),
            _stat(fmt_seconds(totals.get("wall_seconds")), "wall time"),
        ]
    )
    meta = (
        f'<p class="meta">output <code>{_esc(report.get("output", ""))}</code>'
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
    return _section("bad-input", "Bad input", f'<div class="chips">{"".join(chips)}</div>', subtitle)


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
            _esc(fmt_bytes(s.bytes_in)),
            _esc(fmt_bytes(s.bytes_out)),
            _esc(fmt_pct(_ratio(s.docs_out, base))),
        ]
        for s in stages
    ]
    table = _table(
        ["stage", "docs in", "docs out", "dropped", "drop rate", "bytes in", "bytes out", "kept of total"],
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


def _throughput_section(stages: list[Stage]) -> str:
    if not stages:
        return _section("throughput", "Throughput per stage", _no_data())
    charts = [
        ("wall seconds", [Bar(s.name, s.seconds, fmt_seconds(s.seconds)) for s in stages], SLATE),
        (
            "documents / second",
            [Bar(s.name, s.docs_per_second, f"{fmt_si(s.docs_per_second)}/s") for s in stages],
            GREEN,
        ),
        ("MB / second", [Bar(s.name, s.mb_per_second, f"{s.mb_per_second:,.1f} MB/s") for s in stages], ORANGE),
    ]
    if not any(bar.value > 0 for _, bars, _ in charts for bar in bars):
        return _section("throughput", "Throughput per stage", _no_data("no timings recorded"))
    chart = multi_hbar_chart([s.name for s in stages], charts, title="throughput per stage")
    total = sum(s.seconds for s in stages)
    rows = [
        [
            _esc(s.name),
            _esc(fmt_seconds(s.seconds)),
            _share_cell(_ratio(s.seconds, total), SLATE),
            _esc(fmt_seconds(s.cpu_seconds)),
            _esc(f"{fmt_si(s.docs_per_second)}/s"),
            _esc(f"{s.mb_per_second:,.1f} MB/s"),
        ]
        for s in stages
    ]
    table = _table(["stage", "seconds", "share of time", "cpu seconds", "docs/s", "MB/s"], rows, numeric=[1, 3, 4, 5])
    return _section(
        "throughput",
        "Throughput per stage",
        chart + table,
        f"{fmt_seconds(total)} spent in stages in total (summed over workers).",
    )


def _pii_contamination_section(report: Mapping[str, Any]) -> str:
    pii = _mapping(report.get("pii"))
    contamination = _mapping(report.get("contamination"))
    pii_total = sum(_int(v) for v in pii.values())
    cont_total = sum(_int(v) for v in contamination.values())
    pii_chart = _counts_chart(pii, title="PII found", color=ROSE, width=460) if pii_total else _no_data("no PII found")
    cont_chart = (
        _counts_chart(contamination, title="contamination hits", color=AMBER, width=460)
        if cont_total
        else _no_data("no contamination found")
    )
    body = (
        '<div class="panels two">'
        f'<div class="panel"><h3>PII ({_esc(fmt_count(pii_total))})</h3>{pii_chart}</div>'
        f'<div class="panel"><h3>Contamination ({_esc(fmt_count(cont_total))})</h3>{cont_chart}</div>'
        "</div>"
    )
    return _section("pii", "PII and contamination", body)


def _dedup_section(report: Mapping[str, Any]) -> str:
    dedup = _mapping(report.get("dedup"))
    removed = _mapping(dedup.get("removed"))
    total = sum(_int(v) for v in removed.values())
    stats = _stat(fmt_count(dedup.get("clusters")), "near-duplicate clusters") + _stat(
        fmt_count(total), "documents removed"
    )
    chart = (
        _counts_chart(removed, title="documents removed by dedup", color=PURPLE, total=total)
        if total
        else _no_data("no duplicates removed")
    )
    return _section("dedup", "Deduplication", f'<div class="stats">{stats}</div>{chart}')


def _workers_section(report: Mapping[str, Any]) -> str:
    workers = [_mapping(w) for w in _sequence(report.get("workers"))]
    if not workers:
        return _section("workers", "Workers", _no_data())
    workers.sort(key=lambda w: -_num(w.get("seconds")))
    slowest = max(_num(w.get("seconds")) for w in workers)
    peak = max(_num(w.get("peak_rss_bytes")) for w in workers)
    shown = workers[:MAX_WORKER_ROWS]
    rows = [
        [
            f'<span class="path">{_esc(w.get("input", ""))}</span>',
            f'<span data-v="{_num(w.get("seconds"))}">{_share_bar(_ratio(_num(w.get("seconds")), slowest))}'
            f"{_esc(fmt_seconds(w.get('seconds')))}</span>",
            f'<span data-v="{_num(w.get("peak_rss_bytes"))}">{_esc(fmt_bytes(w.get("peak_rss_bytes")))}</span>',
        ]
        for w in shown
    ]
    note = f" (showing the {len(shown)} slowest)" if len(shown) < len(workers) else ""
    subtitle = (
        f"{len(workers)} worker task(s){note}; slowest {fmt_seconds(slowest)}, highest peak RSS {fmt_bytes(peak)}. "
        "Click a column header to sort."
    )
    table = _table(["input", "seconds", "peak RSS"], rows, numeric=[1, 2], css="sortable")
    return _section("workers", "Workers", table, subtitle)


def _share_bar(fraction: float) -> str:
    width = max(0.0, min(100.0, fraction * 100))
    return f'<span class="minibar"><span style="width:{width:.1f}%;background:{SLATE}"></span></span>'


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
header .stats { grid-template-columns:repeat(4,1fr); }
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
            _throughput_section(stages),
            _pii_contamination_section(report),
            _dedup_section(report),
            _workers_section(report),
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
