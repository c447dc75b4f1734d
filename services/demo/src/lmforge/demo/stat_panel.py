"""Grafana's stat panel, as the dashboards page draws it: one value per series, its last non-null
one (the chart's dashboards all reduce with lastNotNull), written large in the panel's unit; its
colour that of the value mapping that matches it, else of the threshold step it falls in
(fieldConfig.defaults.mappings and .thresholds), on the text or as the background (options.colorMode)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Grafana's named colours (its palette's main shades); any other colour is CSS already (#hex).
NAMED_COLORS = {
    "green": "#73bf69",
    "red": "#f2495c",
    "orange": "#ff9830",
    "yellow": "#fade2a",
    "blue": "#5794f2",
    "purple": "#b877d9",
}


def css_color(name: str) -> str:
    return NAMED_COLORS.get(name, name)


@dataclass(frozen=True)
class StatStyle:
    """A stat panel's colouring and text, with Grafana's defaults for what the panel leaves out."""

    steps: tuple[tuple[float, str], ...] = ((-math.inf, "green"),)  # (from value, colour), ascending
    mappings: tuple[tuple[float, str | None, str | None], ...] = ()  # (value, text, colour)
    color_mode: str = "value"  # value | background | none
    text_mode: str = "auto"  # auto | value | name | value_and_name | none

    @classmethod
    def of(cls, panel: dict[str, Any]) -> StatStyle:
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        options = panel.get("options", {})
        steps = tuple(
            (-math.inf if step.get("value") is None else float(step["value"]), step["color"])
            for step in defaults.get("thresholds", {}).get("steps", [])
        )
        mappings = tuple(
            (float(value), result.get("text"), result.get("color"))
            for mapping in defaults.get("mappings", [])
            if mapping.get("type") == "value"
            for value, result in mapping.get("options", {}).items()
        )
        return cls(
            steps or cls.steps,
            mappings,
            options.get("colorMode", cls.color_mode),
            options.get("textMode", cls.text_mode),
        )

    def mapped(self, value: float) -> tuple[str | None, str | None]:
        """(text, colour) of the value mapping that matches `value`; (None, None) when none does."""
        for mapped_value, text, color in self.mappings:
            if value == mapped_value:
                return text, color
        return None, None

    def threshold_color(self, value: float) -> str:
        """The colour of the last step whose start `value` reaches (Grafana's active threshold)."""
        color = self.steps[0][1]
        for start, step_color in self.steps:
            if value < start:
                break
            color = step_color
        return color


@dataclass(frozen=True)
class StatValue:
    name: str  # the series' legend above the value; "" where the text mode leaves it out
    text: str  # the value in the panel's unit, or its mapping's text (text mode name: the series' name)
    color: str | None  # CSS colour; None: colour mode none
    background: bool  # the colour fills the value's box (else it colours the text)


def stat_values(series: list[tuple[str, float]], style: StatStyle, unit: Callable[[float], str]) -> list[StatValue]:
    """One StatValue per (legend, last value) of `series`; `unit` writes a value in the panel's unit."""
    name_above = style.text_mode == "value_and_name" or (style.text_mode == "auto" and len(series) > 1)
    values = []
    for name, value in series:
        mapped_text, mapped_color = style.mapped(value)
        color = None if style.color_mode == "none" else css_color(mapped_color or style.threshold_color(value))
        if style.text_mode == "name":  # the series' name in the value's place
            text = name
        elif style.text_mode == "none":
            text = ""
        else:
            text = mapped_text or unit(value)
        values.append(StatValue(name if name_above else "", text, color, style.color_mode == "background"))
    return values
