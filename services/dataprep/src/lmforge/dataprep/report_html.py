"""Render ``report.json`` as one self-contained HTML page.

This module reads the report (tolerating missing and malformed fields) and computes what the page
shows: the per-stage funnel, the rows of each table, the geometry of each chart
(lmforge.dataprep.report_charts). templates/report.html lays it out on the shared layout of
lmforge.pages.html_pages: inline CSS, inline SVG and a few lines of JavaScript that make the worker
table sortable. The page references nothing outside itself, so it can be opened from a laptop,
attached to a ticket or served from a bucket as it is. The template engine HTML-escapes every
string from the report (crawled input names, errors, eval-set names, the config).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lmforge.dataprep.report_charts import Bar, ColumnChart, HBarChart, column_chart, hbar_chart
from lmforge.pages.formatting import byte_size, count, duration, percent, si, to_finite
from lmforge.pages.html_pages import render
from lmforge.pages.line_chart import LegendItem

TOP_LANGUAGES = 15
MAX_WORKER_ROWS = 200

# The charts' and share bars' colours, by name (the template gets them as `colors`).
COLORS = {
    "blue": "#2563eb",
    "blue_light": "#dbeafe",
    "rose_light": "#fecdd3",
    "teal": "#0d9488",
    "indigo": "#4f46e5",
    "slate": "#475569",
    "rose": "#e11d48",
    "amber": "#d97706",
    "purple": "#7c3aed",
}

DEDUP_LABELS = {
    ("within_input", "duplicate_url"): "same URL, within an input",
    ("within_input", "duplicate_content"): "exact same text, within an input",
    ("removed", "duplicate_url"): "same URL, across inputs",
    ("removed", "duplicate_content"): "exact same text, across inputs",
    ("removed", "near_duplicate"): "near-duplicate (MinHash), across inputs",
}

READER_LABELS = {
    "input_bytes": "input file bytes (as stored: compressed for .gz)",
    "input_files": "input files",
    "unreadable_inputs": "inputs that could not be opened",
}


# --------------------------------------------------------------------------------------------------------------
# Reading the report
# --------------------------------------------------------------------------------------------------------------


def _int(value: Any) -> int:
    return int(to_finite(value))


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _sequence(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def fmt_edge(value: Any) -> str:
    """Token-count bucket edge: ``64``, ``512``, ``2k``, ``16k``."""
    number = _int(value)
    if number >= 1024 and number % 1024 == 0:
        return f"{number // 1024}k"
    return f"{number:,}"


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
    seconds = to_finite(data.get("worker_seconds"))
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
        drop_rate=to_finite(drop_rate) if drop_rate is not None else _ratio(docs_in - docs_out, docs_in),
        docs_per_worker_second=_ratio(docs_in, seconds),
        text_mb_per_worker_second=None if text_in is None else _ratio(text_in / 1e6, seconds),
    )


def _funnel_base(stages: list[Stage]) -> float:
    """Reference for the funnel: the first stage's input (or, failing that, the largest count seen)."""
    if stages and stages[0].docs_in > 0:
        return float(stages[0].docs_in)
    return float(max((max(s.docs_in, s.docs_out) for s in stages), default=0))


def _counts_chart(
    counts: Mapping[str, Any],
    *,
    title: str,
    axis_title: str,
    color: str,
    total: float = 0.0,
    width: int = 720,
    label_width: int = 150,
) -> HBarChart | None:
    """Bar chart of a ``name -> count`` mapping, largest first; share of ``total`` shown when given."""
    items = sorted(((str(k), to_finite(v)) for k, v in counts.items()), key=lambda kv: (-kv[1], kv[0]))
    bars = [
        Bar(name, value, count(value) + (f"  ({percent(_ratio(value, total))})" if total else ""))
        for name, value in items
    ]
    return hbar_chart(
        bars,
        title=title,
        axis_title=axis_title,
        color=color,
        ghost_color=COLORS["blue_light"],
        width=width,
        label_width=label_width,
        text_width=110,
    )


# --------------------------------------------------------------------------------------------------------------
# What each part of the page shows
# --------------------------------------------------------------------------------------------------------------


def _input_files_label(inputs: Mapping[str, Any]) -> str:
    """What the input file bytes are: compressed when they all come from gzip files."""
    total, gzip = _int(inputs.get("file_bytes")), _int(inputs.get("gzip_file_bytes"))
    if total and gzip == total:
        return "compressed input (gzip files)"
    if gzip:
        return f"input files as stored ({byte_size(gzip)} of it gzip-compressed)"
    return "input files as stored (uncompressed)"


def _summary(report: Mapping[str, Any]) -> dict[str, Any]:
    inputs, totals = _mapping(report.get("inputs")), _mapping(report.get("totals"))
    records, kept_docs = _int(inputs.get("records")), _int(totals.get("kept_docs"))
    wall = totals.get("wall_seconds")
    output = report.get("output", "")
    return {
        "output": "this report's directory" if output in (".", "") else str(output),
        "input_file_bytes": totals.get("input_file_bytes"),
        "input_files_label": _input_files_label(inputs),
        "kept_docs": kept_docs,
        "kept_share": _ratio(kept_docs, records),
        "records": records,
        "output_tokens": totals.get("output_tokens"),
        "stats": [
            (count(inputs.get("files")), "input files"),
            (byte_size(totals.get("input_text_bytes")), "input text (uncompressed)"),
            (byte_size(totals.get("kept_text_bytes")), "kept text (uncompressed)"),
            (si(totals.get("train_tokens")), "train tokens"),
            (si(totals.get("val_tokens")), "val tokens"),
            (f"{count(totals.get('train_shards'))} / {count(totals.get('val_shards'))}", "shards train/val"),
            (f"{to_finite(totals.get('tokens_per_kept_text_byte')):.3f}", "tokens per kept text byte"),
            (count(totals.get("vocab_size")), "vocab size"),
            (duration(wall) if wall is not None else "not recorded", "wall time (sum of phases)"),
        ],
    }


def _bad_input(report: Mapping[str, Any]) -> dict[str, Any]:
    inputs = _mapping(report.get("inputs"))
    bad = _mapping(inputs.get("bad_input"))
    chips = [
        (str(reason), _int(n)) for reason, n in sorted(bad.items(), key=lambda kv: (-to_finite(kv[1]), str(kv[0])))
    ]
    # the reader's own counters: what it read and what it could not, as it counted them
    reader = [
        (READER_LABELS.get(name, name), byte_size(value) if name.endswith("bytes") else count(value))
        for name, value in sorted(_mapping(inputs.get("reader")).items())
    ]
    return {"chips": chips, "total": sum(n for _, n in chips), "reader": reader}


def _funnel(stages: list[Stage]) -> dict[str, Any] | None:
    base = _funnel_base(stages)
    if not stages or base <= 0:
        return None
    bars = [
        Bar(
            s.name,
            s.docs_out,
            f"{si(s.docs_out)} docs  ({percent(_ratio(s.docs_out, base))})",
            ghost=s.docs_in,
            tooltip=f"{s.name}: {count(s.docs_in)} in \u2192 {count(s.docs_out)} out",
        )
        for s in stages
    ]
    chart = hbar_chart(
        bars,
        title="documents kept per stage",
        axis_title="documents (bar: kept; behind it: entering)",
        color=COLORS["blue"],
        ghost_color=COLORS["rose_light"],
        scale_max=base,
        width=1000,
        label_width=170,
    )
    legend = [
        LegendItem("docs out", COLORS["blue"], "box"),
        LegendItem("dropped by the stage", COLORS["rose_light"], "box"),
        LegendItem(f"100% = {count(base)} docs entering the first stage"),
    ]
    counters = [(s.name, name, n) for s in stages for name, n in sorted(s.counters.items())]
    return {"base": base, "stages": stages, "chart": chart, "legend": legend, "counters": counters}


def _drop_reasons(stages: list[Stage]) -> list[dict[str, Any]]:
    total_in = _funnel_base(stages)
    rows = []
    for s in stages:
        for index, (reason, n) in enumerate(sorted(s.dropped.items(), key=lambda kv: (-kv[1], kv[0]))):
            rows.append(
                {
                    "stage": s.name if index == 0 else "",
                    "reason": reason,
                    "docs": n,
                    "of_stage": _ratio(n, s.docs_in),
                    "of_all": _ratio(n, total_in),
                }
            )
    return rows


@dataclass(frozen=True)
class Example:
    url: str
    reason: str
    preview: str


def _score_edge(value: float) -> str:
    return f"{value:.4g}"


def _score_histogram(step_id: str, name: str, raw: Any) -> ColumnChart | None:
    """One score's histogram: a column per bin (values outside the edges count in the end bins)."""
    data = _mapping(raw)
    edges = [to_finite(e) for e in _sequence(data.get("edges"))]
    counts = [to_finite(c) for c in _sequence(data.get("counts"))]
    size = min(len(edges) - 1, len(counts))
    total = sum(counts[:size])
    bars = [
        Bar(
            f"{_score_edge(edges[i])}\u2013{_score_edge(edges[i + 1])}",
            counts[i],
            si(counts[i]) if counts[i] else "",
            tooltip=f"{name} {_score_edge(edges[i])} to {_score_edge(edges[i + 1])}: {count(counts[i])} docs "
            f"({percent(_ratio(counts[i], total))})",
        )
        for i in range(max(size, 0))
    ]
    return column_chart(
        bars, title=f"{step_id}: {name}", x_title=name, y_title="documents", color=COLORS["indigo"], width=900,
        height=240,
    )


def _examples(raw: Any) -> list[Example]:
    return [
        Example(str(e.get("url") or ""), str(e.get("reason") or ""), str(e.get("preview") or ""))
        for e in map(_mapping, _sequence(raw))
    ]


def _steps(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each pipeline step as report.json lists it, whatever its id or type: its counts, drop reasons,
    a histogram per score it recorded and its removed and kept examples."""
    steps = []
    for index, raw in enumerate(_sequence(report.get("steps"))):
        data = _mapping(raw)
        step_id = str(data.get("id", "?"))
        docs_in, docs_out = _int(data.get("docs_in")), _int(data.get("docs_out"))
        dropped = sorted(((str(k), _int(v)) for k, v in _mapping(data.get("dropped")).items()),
                         key=lambda kv: (-kv[1], kv[0]))
        histograms = [(str(name), _score_histogram(step_id, str(name), h))
                      for name, h in sorted(_mapping(data.get("histograms")).items())]
        examples = _mapping(data.get("examples"))
        steps.append({
            "anchor": f"step-{index + 1}",
            "id": step_id,
            "type": str(data.get("type") or step_id),
            "docs_in": docs_in,
            "docs_out": docs_out,
            "drop_rate": _ratio(docs_in - docs_out, docs_in),
            "bytes_in": _int(data.get("bytes_in")),
            "bytes_out": _int(data.get("bytes_out")),
            "seconds": to_finite(data.get("seconds")),
            "reasons": [(reason, n, _ratio(n, docs_in)) for reason, n in dropped],
            "counters": sorted((str(k), _int(v)) for k, v in _mapping(data.get("counters")).items()),
            "histograms": [(name, chart) for name, chart in histograms if chart],
            "removed": _examples(examples.get("removed")),
            "kept": _examples(examples.get("kept")),
        })
    return steps


def _languages(report: Mapping[str, Any]) -> dict[str, Any]:
    languages = {str(k): to_finite(v) for k, v in _mapping(report.get("languages")).items() if to_finite(v) > 0}
    total = sum(languages.values())
    ranked = sorted(languages.items(), key=lambda kv: (-kv[1], kv[0]))
    bars = [
        Bar(code, value, f"{count(value)}  ({percent(_ratio(value, total))})") for code, value in ranked[:TOP_LANGUAGES]
    ]
    other = sum(v for _, v in ranked[TOP_LANGUAGES:])
    if other:
        rest = len(ranked) - TOP_LANGUAGES
        bars.append(Bar(f"other ({rest})", other, f"{count(other)}  ({percent(_ratio(other, total))})"))
    subtitle = f"{len(languages)} language(s) among {count(total)} documents that reached language ID"
    chart = hbar_chart(
        bars,
        title="documents per language",
        axis_title="documents",
        color=COLORS["teal"],
        ghost_color=COLORS["blue_light"],
        width=900,
    )
    return {"chart": chart, "subtitle": subtitle if languages else ""}


def _bucket_label(edges: list[Any], index: int) -> str:
    if index + 1 < len(edges):
        return f"{fmt_edge(edges[index])}\u2013{fmt_edge(edges[index + 1])}"
    return f"\u2265{fmt_edge(edges[index])}"


def _bucket_tooltip(edges: list[Any], index: int) -> str:
    if index + 1 < len(edges):
        return f"{count(edges[index])} \u2264 tokens < {count(edges[index + 1])}"
    return f"tokens \u2265 {count(edges[index])}"


def _doc_length(report: Mapping[str, Any]) -> dict[str, Any]:
    data = _mapping(report.get("doc_length_tokens"))
    edges, counts = _sequence(data.get("edges")), [to_finite(c) for c in _sequence(data.get("counts"))]
    size = min(len(edges), len(counts))
    total = sum(counts[:size])
    bars = [
        Bar(
            _bucket_label(edges, i),
            counts[i],
            si(counts[i]),
            tooltip=f"{_bucket_tooltip(edges, i)}: {count(counts[i])} docs ({percent(_ratio(counts[i], total))})",
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
            f"{count(total)} documents; the median document is in the {_bucket_label(edges, median_index)} token bucket"
        )
    chart = column_chart(
        bars,
        title="document length in tokens",
        x_title="document length (tokens)",
        y_title="documents",
        color=COLORS["indigo"],
    )
    return {"chart": chart, "subtitle": subtitle}


# What a phase got through and how fast, each measure labelled: (amount key, its text, rate key, its text).
# File bytes show when the phase read files at all (0 included); the others when non-zero.
_MEASURES: tuple[tuple[str, Callable[[Any], str], str, Callable[[Any], str]], ...] = (
    ("file_bytes", lambda v: f"{byte_size(v)} input files",
     "file_mb_per_second", lambda v: f"{to_finite(v):,.1f} MB/s input files"),
    ("text_bytes", lambda v: f"{byte_size(v)} text (uncompressed)",
     "text_mb_per_second", lambda v: f"{to_finite(v):,.1f} MB/s text"),
    ("docs", lambda v: f"{count(v)} docs", "docs_per_second", lambda v: f"{si(v)} docs/s"),
    ("tokens", lambda v: f"{si(v)} tokens", "tokens_per_second", lambda v: f"{si(v)} tokens/s"),
)


def _measured(phase: Mapping[str, Any]) -> list[tuple[str, Callable[[Any], str], str, Callable[[Any], str]]]:
    return [m for m in _MEASURES if (phase.get(m[0]) is not None if m[0] == "file_bytes" else _int(phase.get(m[0])))]


def _phase_processed(phase: Mapping[str, Any]) -> str:
    """What a phase got through, each size labelled."""
    return " \u00b7 ".join(text(phase.get(key)) for key, text, _, _ in _measured(phase)) or "\u2014"


def _phase_throughput(phase: Mapping[str, Any]) -> str:
    """Throughput over the phase's wall-clock, each rate labelled."""
    if to_finite(phase.get("wall_seconds")) <= 0:
        return "\u2014"
    return " \u00b7 ".join(text(phase.get(key)) for _, _, key, text in _measured(phase)) or "\u2014"


def _throughput(report: Mapping[str, Any], stages: list[Stage]) -> dict[str, Any]:
    phases = [_mapping(p) for p in _sequence(report.get("phases"))]
    wall = sum(to_finite(p.get("wall_seconds")) for p in phases)
    timed = [s for s in stages if s.worker_seconds > 0]
    worker_seconds = sum(s.worker_seconds for s in timed)
    stage_rows = [{"stage": s, "share": _ratio(s.worker_seconds, worker_seconds)} for s in timed]
    if not any(to_finite(p.get("wall_seconds")) > 0 for p in phases):
        return {"phases": None, "stages": stage_rows, "subtitle": ""}
    bars = [
        Bar(
            str(p.get("name", "?")),
            to_finite(p.get("wall_seconds")),
            duration(p.get("wall_seconds")),
            tooltip=f"{p.get('label', '')}: {duration(p.get('wall_seconds'))} wall-clock",
        )
        for p in phases
    ]
    rows = [
        {
            "name": str(p.get("name", "?")),
            "label": str(p.get("label", "")),
            "wall_seconds": p.get("wall_seconds"),
            "share": _ratio(to_finite(p.get("wall_seconds")), wall),
            "processes": p.get("processes"),
            "cpu_seconds": p.get("cpu_seconds"),
            "peak_rss_bytes": p.get("peak_rss_bytes"),
            "processed": _phase_processed(p),
            "throughput": _phase_throughput(p),
        }
        for p in phases
    ]
    chart = hbar_chart(
        bars,
        title="wall-clock seconds per phase",
        axis_title="wall-clock time (seconds)",
        color=COLORS["slate"],
        ghost_color=COLORS["blue_light"],
        width=1000,
        label_width=170,
    )
    subtitle = f"{duration(wall)} of wall-clock over the phases; a phase run by several processes at once counts once."
    return {"phases": {"chart": chart, "rows": rows}, "stages": stage_rows, "subtitle": subtitle}


def _pii(pii: Mapping[str, Any]) -> dict[str, Any]:
    items = _mapping(pii.get("items_scrubbed"))
    total = sum(_int(v) for v in items.values())
    kept = _mapping(pii.get("items_kept"))
    chart = (
        _counts_chart(items, title="PII items scrubbed", axis_title="items scrubbed", color=COLORS["rose"], width=460)
        if total
        else None
    )
    return {
        "enabled": pii.get("enabled") is not False,
        "documents": _int(pii.get("documents_touched")),
        "total": total,
        "chart": chart,
        "kept": ", ".join(f"{count(v)} {k}" for k, v in sorted(kept.items())),
    }


def _contamination(contamination: Mapping[str, Any]) -> dict[str, Any]:
    removed = _int(contamination.get("documents_removed"))
    chart = (
        _counts_chart(
            _mapping(contamination.get("documents_per_eval_set")),
            title="documents matching each eval set",
            axis_title="documents removed",
            color=COLORS["amber"],
            width=460,
        )
        if removed
        else None
    )
    return {
        "enabled": bool(contamination.get("enabled")),
        "removed": removed,
        "checked": _int(contamination.get("documents_checked")),
        "sets": ", ".join(str(s) for s in _sequence(contamination.get("eval_sets"))),
        "chart": chart,
    }


def _trace_index(report: Mapping[str, Any]) -> dict[str, Any]:
    """The trace index's size (report.json's trace_index) and the contamination reports made against it."""
    index = _mapping(report.get("trace_index"))
    links = [str(rel) for rel in _sequence(report.get("contamination_reports"))]
    stats = [
        (si(index.get("tokens")), "tokens indexed"),
        (count(index.get("documents")), "documents"),
        (byte_size(index.get("bytes")), "index size"),
        (f"{to_finite(index.get('bytes_per_token')):.2f} B", "per token"),
        (count(index.get("partitions")), "partitions"),
    ] if index.get("enabled") else []
    return {"enabled": bool(index.get("enabled")), "stats": stats, "path": str(index.get("path", "")),
            "engine": str(index.get("engine", "")), "seconds": to_finite(index.get("task_seconds")),
            "peak_rss_bytes": to_finite(index.get("max_peak_rss_bytes")),
            "contamination_reports": [{"href": rel, "name": rel.rsplit("/", 1)[-1].removesuffix(".html")}
                                      for rel in links]}


def _dedup(report: Mapping[str, Any]) -> dict[str, Any]:
    dedup = _mapping(report.get("dedup"))
    counts: dict[str, float] = {}
    for scope in ("within_input", "removed"):
        for reason, value in _mapping(dedup.get(scope)).items():
            counts[DEDUP_LABELS.get((scope, str(reason)), f"{reason} ({scope})")] = to_finite(value)
    total = sum(counts.values())
    url_exact = sum(v for k, v in counts.items() if not k.startswith("near"))
    stats = [
        (count(total), "documents removed as duplicates"),
        (count(url_exact), "URL / exact-text duplicates"),
        (count(total - url_exact), "near-duplicates (MinHash)"),
        (count(dedup.get("near_duplicate_groups")), "near-duplicate groups"),
        (count(dedup.get("clusters")), "duplicate clusters across inputs (URL, exact or near)"),
    ]
    chart = (
        _counts_chart(
            counts,
            title="documents removed by dedup",
            axis_title="documents removed",
            color=COLORS["purple"],
            total=total,
            label_width=300,
        )
        if total
        else None
    )
    return {"stats": stats, "chart": chart, "near_off": dedup.get("near_duplicate_enabled") is False}


def _task_groups(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per phase and kind of task: how many, how many failed, their time and memory percentiles."""
    groups = []
    for raw in _sequence(report.get("task_groups")):
        data = _mapping(raw)
        seconds, rss = _mapping(data.get("seconds")), _mapping(data.get("peak_rss_bytes"))
        tasks, listed = _int(data.get("tasks")), _int(data.get("rows_listed"))
        groups.append({
            "phase": str(data.get("phase", "")),
            "task": str(data.get("task", "")),
            "tasks": tasks,
            "errors": _int(data.get("errors")),
            "seconds": [to_finite(seconds.get(k)) for k in ("p50", "p90", "p99", "max")],
            "seconds_total": to_finite(seconds.get("total")),
            "peak_rss_bytes": [to_finite(rss.get(k)) for k in ("p50", "p90", "max")],
            "listed": "all" if listed >= tasks else f"{count(listed)} of {count(tasks)}",
        })
    return groups


def _workers(report: Mapping[str, Any]) -> dict[str, Any] | None:
    workers = [_mapping(w) for w in _sequence(report.get("workers"))]
    if not workers:
        return None
    groups = _task_groups(report)
    # inputs with an error first, then the slowest
    workers.sort(key=lambda w: (not (w.get("error") or w.get("problems")), -to_finite(w.get("seconds"))))
    slowest = max(to_finite(w.get("seconds")) for w in workers)
    peak = max(workers, key=lambda w: to_finite(w.get("peak_rss_bytes")))
    shown = [
        w for i, w in enumerate(workers) if i < MAX_WORKER_ROWS or w.get("error") or w.get("task") == "main process"
    ]
    rows = [
        {
            "phase": str(w.get("phase", "")),
            "input": str(w.get("input") or ""),
            "task": str(w.get("task", "main process")),
            "where": f" (pid {w.get('pid')} on {w.get('host')})" if w.get("pid") is not None else "",
            "seconds": to_finite(w.get("seconds")),
            "seconds_share": _ratio(to_finite(w.get("seconds")), slowest),
            "peak_rss_bytes": to_finite(w.get("peak_rss_bytes")),
            "error": str(w.get("error") or ""),
            "problems": ", ".join(f"{count(v)} {k}" for k, v in sorted(_mapping(w.get("problems")).items())),
        }
        for w in shown
    ]
    errors = sum(1 for w in workers if w.get("error"))
    note = f" (showing {len(shown)})" if len(shown) < len(workers) else ""
    if groups and any(g["listed"] != "all" for g in groups):
        what = (f"{count(sum(g['tasks'] for g in groups))} tasks, summarised per phase in the first table; a phase "
                "of many tasks lists only its failed, slowest and largest below: "
                f"{len(workers)} row(s){note}; {count(sum(g['errors'] for g in groups))} task(s) with an error")
    else:
        what = (f"{len(workers)} row(s){note}: each input's filter and tokenize task, each shard partition and each "
                f"main process per phase; {errors} input(s) with an error")
    subtitle = (
        f"{what}; slowest {duration(slowest)}; highest peak RSS {byte_size(peak.get('peak_rss_bytes'))} "
        f"({peak.get('task', '')}, {peak.get('phase', '')}). Click a column header to sort."
    )
    return {"rows": rows, "groups": groups, "subtitle": subtitle}


def _config_text(report: Mapping[str, Any]) -> str | None:
    config = report.get("config")
    if not isinstance(config, Mapping) or not config:
        return None
    return json.dumps(config, indent=1, sort_keys=True)


# --------------------------------------------------------------------------------------------------------------
# Page
# --------------------------------------------------------------------------------------------------------------


def render_report_html(report: dict) -> str:
    """Render a ``report.json`` dict as a self-contained HTML page (inline CSS, inline SVG, no external refs)."""
    report = _mapping(report)
    stages = [_stage(raw) for raw in _sequence(report.get("stages"))]
    return render(
        "lmforge.dataprep",
        "dataprep/report.html",
        title=str(report.get("title") or "lmforge data-prep report"),
        generated_by=str(report.get("generated_by", "")),
        colors=COLORS,
        summary=_summary(report),
        bad_input=_bad_input(report),
        funnel=_funnel(stages),
        drop_reasons=_drop_reasons(stages),
        steps=_steps(report),
        languages=_languages(report),
        doc_length=_doc_length(report),
        throughput=_throughput(report, stages),
        pii=_pii(_mapping(report.get("pii"))),
        contamination=_contamination(_mapping(report.get("contamination"))),
        dedup=_dedup(report),
        trace_index=_trace_index(report),
        workers=_workers(report),
        config=_config_text(report),
    )
