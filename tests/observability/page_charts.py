"""Reads back the dashboards page (lmforge.demo.dashboards_page): its panels, their charts, legends
and stat values."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser


@dataclass
class DrawnPanel:
    title: str
    requires: str
    charts: int = 0
    points: int = 0  # finite data points drawn, over every series
    paths: list[int] = field(default_factory=list)  # data points of each drawn series
    legend: list[str] = field(default_factory=list)
    no_data: bool = False
    stats: list[DrawnStat] = field(default_factory=list)


@dataclass
class DrawnStat:
    name: str = ""
    value: str = ""
    color: str = ""  # "" when uncoloured
    background: bool = False


class _Reader(HTMLParser):
    def __init__(self):
        super().__init__()
        self.panels: list[DrawnPanel] = []
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str]] = []
        self._in_legend_item = False
        self._text: list[str] = []
        self._nodata = False
        self._stat_part: str | None = None  # "name" or "value" while inside one

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        self.attributes += [(tag, name) for name in attrs]
        if tag == "section" and "panel" in attrs.get("class", ""):
            self.panels.append(DrawnPanel(attrs["data-panel"], attrs.get("data-requires", "")))
        elif tag == "svg" and self.panels:
            self.panels[-1].charts += 1
            self.panels[-1].points += int(attrs["data-points"])
        elif tag == "g" and attrs.get("class") == "series" and self.panels:
            self.panels[-1].paths.append(int(attrs["data-points"]))
        elif tag == "li" and self.panels:
            self._in_legend_item, self._text = True, []
        elif tag == "p" and attrs.get("class") == "nodata" and self.panels:
            self.panels[-1].no_data = True
        elif tag == "div" and "grafana-stat" in attrs.get("class", "").split() and self.panels:
            background = "background" in attrs["class"].split()
            self.panels[-1].stats.append(DrawnStat(color=attrs.get("data-color", ""), background=background))
        elif tag == "div" and self.panels and self.panels[-1].stats:
            part = (attrs.get("class") or "").split()[:1]
            self._stat_part = part[0] if part in (["name"], ["value"]) else None

    def handle_endtag(self, tag):
        if tag == "li" and self._in_legend_item:
            self._in_legend_item = False
            self.panels[-1].legend.append("".join(self._text).strip())
        elif tag == "div":
            self._stat_part = None

    def handle_data(self, data):
        if self._in_legend_item:
            self._text.append(data)
        elif self._stat_part:
            stat = self.panels[-1].stats[-1]
            setattr(stat, self._stat_part, getattr(stat, self._stat_part) + data)


def read_page(text: str) -> tuple[list[DrawnPanel], list[str], list[tuple[str, str]]]:
    """(panels in page order, every tag, every (tag, attribute name))."""
    reader = _Reader()
    reader.feed(text)
    return reader.panels, reader.tags, reader.attributes


def with_repeats(title: str, **values: str) -> str:
    """A panel's title as the page draws it when its repeat variable has one value here
    (Grafana draws a repeated panel once per value, the value in its title)."""
    for name, value in values.items():
        title = title.replace(f"${name}", value)
    return title
