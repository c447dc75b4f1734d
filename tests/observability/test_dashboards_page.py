"""The dashboards page's drawing, on given series: Grafana's legendFormat and units, gaps where a
value is NaN, one chart per panel with data, a stat panel as Grafana draws it (the chart's own
panel JSON: last value, unit, threshold or mapping colour), nothing fetched (no script, no
external reference). Drawn from a real Prometheus: tests/e2e/test_observability.py and
tests/e2e/test_demo.py."""

from __future__ import annotations

import math
import re

import pytest

from lmforge.demo.dashboards import load_dashboards, panel_targets, query_panels
from lmforge.demo.dashboards_page import Dashboard, Panel, Series, Target, format_value, legend, panel_of, render_page
from tests.observability.page_charts import DrawnPanel, DrawnStat, read_page

T0 = 1_700_000_000.0
# Grafana's named colours as the chart's dashboards name them.
GREEN, ORANGE, RED = "#73bf69", "#ff9830", "#f2495c"


def test_legend_follows_grafanas_legend_format():
    labels = {"__name__": "lmforge_inference_requests_total", "model_name": "good", "status": "200"}
    assert legend("{{model_name}} {{status}}", labels) == "good 200"
    assert legend("{{ model_name }} p95", labels) == "good p95"
    assert legend("{{pod}} {{model_name}}", labels) == "good"  # a label the series lacks is empty
    assert legend("", labels) == 'lmforge_inference_requests_total{model_name="good", status="200"}'
    assert legend("", {}) == "{}"


def test_values_are_written_in_the_panels_unit():
    assert format_value(0.123, "percentunit") == "12.3%"
    assert format_value(0.25, "s") == "250 ms"
    assert format_value(90, "s") == "1.5 min"
    assert format_value(3 * 1024**2, "bytes") == "3 MiB"
    assert format_value(2048, "Bps") == "2 KiB/s"
    assert format_value(12500, "short") == "12.5 k"
    assert format_value(4, "reqps") == "4 req/s"
    assert format_value(0.0003, "sci") == "3.00e-04"
    assert format_value(812.5, "tok/s") == "812 tok/s"


def test_every_dashboard_panel_has_a_unit_the_page_knows():
    known = {"none", "percentunit", "percent", "s", "bytes", "Bps", "sci", "short", "reqps"}
    custom = set()
    for dashboard in load_dashboards().values():
        for panel in query_panels(dashboard):
            unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit") or "none"
            if unit not in known:
                custom.add(unit)
            assert panel_targets(panel), panel["title"]
    assert custom <= {"tok/s"}, custom  # written as a suffix, as Grafana writes a custom unit


def _panel(title, unit, *series, requires=None, kind="timeseries"):
    return Panel(title, kind, unit, requires, [Target("some_expr", list(series))])


def test_one_chart_per_panel_with_data_and_gaps_where_values_are_nan():
    steady = Series("train", [(T0 + i, 3.0 - i / 10) for i in range(10)])
    gappy = Series("good 200", [(T0, 1.0), (T0 + 1, 2.0), (T0 + 2, math.nan), (T0 + 3, 2.5), (T0 + 4, 3.0)])
    lone = Series("baseline", [(T0 + 5, 0.9)])
    page = render_page([
        Dashboard("training", "lmforge / Training", [Panel("Loss and optimizer", "row"),
                                                     _panel("Loss", "none", steady),
                                                     _panel("Requests", "reqps", gappy),
                                                     _panel("Score", "percentunit", lone)]),
        Dashboard("inference", "lmforge / Inference", [_panel("GPU utilization", "percentunit", requires="gpu"),
                                                       _panel("Queue time", "s")]),
    ], prometheus="http://127.0.0.1:9090", start=T0, end=T0 + 10, step=1)
    panels, tags, attributes = read_page(page)
    drawn = {p.title: p for p in panels}
    assert list(drawn) == ["Loss", "Requests", "Score", "GPU utilization", "Queue time"]
    assert (drawn["Loss"].charts, drawn["Loss"].points, drawn["Loss"].paths) == (1, 10, [10])
    assert (drawn["Requests"].points, drawn["Requests"].paths) == (4, [4])
    assert re.search(r'd="M[\d.,]+ L[\d.,]+ M[\d.,]+ L[\d.,]+"', page), "the NaN must break the line"
    assert drawn["Score"].points == 1 and page.count("<circle") == 1  # a lone sample is marked
    assert drawn["Requests"].legend == ["good 200 last 3 req/s"]
    assert drawn["Score"].legend == ["baseline last 90%"]
    assert drawn["GPU utilization"].charts == 0 and drawn["GPU utilization"].requires == "gpu"
    assert drawn["Queue time"].charts == 0 and drawn["Queue time"].no_data
    assert "<h3>Loss and optimizer</h3>" in page and "3 of 4 panels have data" in page
    # Self-contained: no script, nothing loaded from anywhere.
    assert "script" not in tags and not {a for _, a in attributes} & {"src", "href"}
    assert "@import" not in page and "url(" not in page


def chart_panel(dashboard: str, title: str, *series: Series) -> Panel:
    """The chart's own panel, read from its dashboard JSON as the page reads it, with `series`."""
    spec = next(p for p in query_panels(load_dashboards()[dashboard]) if p["title"] == title)
    panel = panel_of(spec)
    panel.targets = [Target("some_expr", list(series))]
    return panel


def drawn_panel(panel: Panel) -> DrawnPanel:
    page = render_page([Dashboard("d", "lmforge / D", [panel])], prometheus="http://127.0.0.1:9090", start=T0,
                       end=T0 + 10, step=1)
    (drawn,) = read_page(page)[0]
    return drawn


@pytest.mark.parametrize("ratio,text,color", [(0.002, "0.2%", GREEN), (0.03, "3%", ORANGE), (0.2, "20%", RED)])
def test_a_stat_panel_is_its_last_value_in_its_unit_and_threshold_colour(ratio, text, color):
    """5xx error ratio: percentunit, green below 0.01, orange from 0.01, red from 0.05."""
    series = Series("5xx", [(T0, 0.5), (T0 + 1, ratio), (T0 + 2, math.nan)])  # the last non-null value
    drawn = drawn_panel(chart_panel("inference", "5xx error ratio", series))
    assert drawn.charts == 0 and drawn.legend == []  # no line chart of a lone point
    assert drawn.stats == [DrawnStat("", text, color)]


def test_stat_panels_show_mappings_names_and_colour_modes():
    verdict = chart_panel("canary", "Verdict", Series("good", [(T0, 1.0)]), Series("worse", [(T0, 0.0)]))
    assert drawn_panel(verdict).stats == [DrawnStat("good", "PASS", GREEN, background=True),
                                          DrawnStat("worse", "FAIL", RED, background=True)]
    ttft = chart_panel("inference", "TTFT p95", Series("p95", [(T0, 2.5)]))
    assert drawn_panel(ttft).stats == [DrawnStat("", "2.5 s", ORANGE)]
    queue = chart_panel("inference", "Running / waiting", Series("running", [(T0, 3.0)]),
                        Series("waiting", [(T0, 12500.0)]))
    assert drawn_panel(queue).stats == [DrawnStat("running", "3", GREEN), DrawnStat("waiting", "12.5 k", GREEN)]
    model = chart_panel("inference", "Served model", Series("good v1 step 300 on cpu", [(T0, 1.0)]))
    assert drawn_panel(model).stats == [DrawnStat("", "good v1 step 300 on cpu", "")]  # textMode name, no colour
    nothing = chart_panel("inference", "KV-cache usage", Series("kv cache", [(T0, math.nan)]))
    assert drawn_panel(nothing).no_data and not drawn_panel(nothing).stats
