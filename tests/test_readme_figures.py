"""README states no figure that goes stale: no test count, no running time of a command in
minutes or hours, and every speed-up (N× or Nx) it gives is one that docs/benchmarks.md records
with its run."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
BENCHMARKS = (REPO / "docs" / "benchmarks.md").read_text()
SPEED_UP = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?) ?[×x](?!\w)")


def test_readme_names_no_test_count():
    assert not re.findall(r"\b\d[\d,]* tests\b", README)


def test_readme_gives_no_duration_for_make_test():
    duration = r"\b\d+(?:\.\d+)? ?(?:minutes?|min|hours?|h|seconds?|s)\b"
    assert not re.findall(rf"`make test`[^.`]*{duration}", README)


def test_readme_gives_no_running_time_in_minutes_or_hours():
    """`make demo` or a set-up "takes N minutes" only as a recorded run can say it (docs/benchmarks.md)."""
    assert not re.findall(r"\b\d+(?:\.\d+)? ?(?:minutes?|min|hours?)\b", README)


def test_every_speed_up_in_readme_is_one_docs_benchmarks_records():
    recorded = set(SPEED_UP.findall(BENCHMARKS))
    assert recorded  # the pattern reads the benchmarks' own figures
    assert set(SPEED_UP.findall(README)) <= recorded
