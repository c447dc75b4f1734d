"""How the HTML pages write numbers, sizes, shares and durations (lmforge.pages.formatting, the
templates' filters): the forms the data-prep report, the training report and the dashboards page
show, and what malformed input (None, NaN, text) becomes."""

from __future__ import annotations

import math

from lmforge.pages.chart_axes import tick_digits
from lmforge.pages.formatting import byte_size, count, duration, number, percent, short_duration, si


def test_counts():
    assert count(45_000) == "45,000" and count(None) == "0" and count("x") == "0" and count(math.nan) == "0"
    assert si(4_950_000) == "4.95 M" and si(812_345) == "812 k" and si(42) == "42" and si(1500) == "1.50 k"
    assert si(2.5e9) == "2.50 B" and si(0.5) == "0.5"


def test_measurements():
    assert number(0) == "0" and number(5.234, 4) == "5.234" and number(2.5) == "2.5"
    assert number(12_500) == "12.5 k" and number(5005, 4) == "5.005 k"
    assert number(0.0003) == "3.00e-04" and number(math.inf) == "inf"


def test_shares():
    assert percent(0.057) == "5.7%" and percent(0.9) == "90%" and percent(0) == "0%" and percent(0.0004) == "<0.1%"
    assert percent(None) == "0%"


def test_sizes():
    assert byte_size(123_456_789) == "123.5 MB" and byte_size(0) == "0 B" and byte_size(512) == "512 B"
    assert byte_size(3 * 1024**2, binary=True) == "3 MiB" and byte_size(1536, binary=True) == "1.5 KiB"


def test_durations():
    assert duration(0) == "0 s" and duration(0.25) == "250 ms" and duration(12.34) == "12.3 s"
    assert duration(60) == "1 min 0 s" and duration(3725) == "1 h 2 min"
    assert short_duration(0.25) == "250 ms" and short_duration(90) == "1.5 min" and short_duration(7200) == "2 h"


def test_tick_labels_get_the_digits_that_tell_them_apart():
    assert tick_digits([0, 1, 2, 3]) == 3
    ticks = [5000, 5005, 5010, 5015]
    digits = tick_digits(ticks)
    assert digits == 4 and len({number(t, digits) for t in ticks}) == len(ticks)
