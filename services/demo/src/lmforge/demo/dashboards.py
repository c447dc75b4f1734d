"""The chart's Grafana dashboards, read as data: their panels, and their PromQL expressions made
ready for Prometheus's /api/v1/query (the conventions: helm/lmforge/templates/dashboards.yaml).

Substitution: $__rate_interval -> 30s, $__interval -> 15s, $__range -> 5m (each overridable), and
every other variable ($var, ${var}, ${var:format}) -> .* : the dashboards use variables only as
regex matchers (label=~"$var"), so `.*` selects everything, also series without that label.
A Prometheus answering these needs a scrape (and rule evaluation) interval of 15s or less, so that
a 30s window holds two samples."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from lmforge.demo.chart import CHART

DASHBOARDS = CHART / "dashboards"

MACROS = {"__rate_interval": "30s", "__interval": "15s", "__range": "5m"}
# $name, ${name} and ${name:format}; Grafana's own $__macros are in MACROS.
VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)")
# Metric names of the project (lmforge_…) and of its recording rules (lmforge:…).
METRIC_NAME = re.compile(r"\blmforge[_:][A-Za-z0-9_:]*")


def load_dashboards() -> dict[str, dict[str, Any]]:
    """{file base name: dashboard JSON} for every dashboards/*.json of the chart."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows included, also those nested in collapsed rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panels(panel)


def query_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The panels that query the data source (all but rows)."""
    return (p for p in panels(dashboard) if p.get("type") != "row")


def substitute(expr: str, **macros: str) -> str:
    """`expr` with the Grafana macros replaced by durations and every template variable by `.*`."""
    values = {**MACROS, **macros}

    def replace(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        return values.get(name, ".*")

    return VARIABLE.sub(replace, expr)


def variables_of(expr: str) -> set[str]:
    """The template variables and macros `expr` refers to (names without `$`)."""
    return {m.group(1) or m.group(2) for m in VARIABLE.finditer(expr)}


def metric_names(expr: str) -> set[str]:
    return set(METRIC_NAME.findall(expr))


# A query variable's definition: label_values(<series selector>, <label>).
LABEL_VALUES = re.compile(r"^\s*label_values\((?P<selector>.+),\s*(?P<label>\w+)\s*\)\s*$", re.S)


def repeat_of(dashboard: dict[str, Any], panel: dict[str, Any]) -> tuple[str, str, str] | None:
    """(variable, series selector, label) of a panel Grafana repeats once per value of a query
    variable defined by label_values(selector, label) (the selector's own variables substituted),
    None for a panel drawn once."""
    name = panel.get("repeat")
    variable = next((v for v in dashboard.get("templating", {}).get("list", []) if v.get("name") == name), None)
    match = LABEL_VALUES.match(variable.get("definition", "")) if name and variable else None
    return (name, substitute(match["selector"]), match["label"]) if match else None


def regex_value(value: str) -> str:
    """`value` as Grafana writes one value of a variable into a PromQL regex matcher (=~"…"):
    regex metacharacters escaped, the backslash doubled for the PromQL string."""
    return re.sub(r"[\\$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0).replace("\\", "\\\\"), value)


def requires_of(panel: dict[str, Any]) -> str | None:
    """The panel's "lmforge": {"requires": ...} ("gpu": it has data only where a GPU is present)."""
    return panel.get("lmforge", {}).get("requires")


def unit_of(panel: dict[str, Any]) -> str:
    """The panel's Grafana unit (fieldConfig.defaults.unit), "none" when it sets none."""
    return panel.get("fieldConfig", {}).get("defaults", {}).get("unit") or "none"


def panel_targets(panel: dict[str, Any], **macros: str) -> list[tuple[str, str]]:
    """(expression ready for Prometheus, legendFormat or "") of each target Grafana would query."""
    return [(substitute(t["expr"], **macros), t.get("legendFormat") or "")
            for t in panel.get("targets", []) if t.get("expr") and not t.get("hide")]


def dashboard_queries(dashboard: dict[str, Any], **macros: str) -> list[tuple[str, str, str | None]]:
    """(panel title, expression ready for Prometheus, requires) for every target of every panel;
    `requires`: requires_of(panel). `macros` overrides the substituted durations, e.g.
    dashboard_queries(d, __rate_interval="1m")."""
    return [(panel["title"], expr, requires_of(panel))
            for panel in query_panels(dashboard) for expr, _ in panel_targets(panel, **macros)]
