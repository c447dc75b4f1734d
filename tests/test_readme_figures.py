"""The front page and the guide pages state no figure that goes stale: no test count, no running
time of a command in minutes or hours, and every speed-up (N× or Nx) they give is one that
docs/benchmarks.md records with its run. (benchmarks.md holds the recorded figures; scaling.md and
configuration.md are generated, each checked against what it is generated from by its own test;
planning.md, parallelism.md and design.md give the planner's and the design's arithmetic with its
source.)"""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# README.md, and the pages its former sections moved to.
GUIDE_PAGES = ["README.md", *(f"docs/{name}.md" for name in (
    "index", "getting-started", "demo", "kubernetes", "rollouts", "monitoring", "vllm", "dataprep", "trainer",
    "uploader", "inference", "canary", "pipelines", "troubleshooting"))]
BENCHMARKS = (REPO / "docs" / "benchmarks.md").read_text()
SPEED_UP = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?) ?[×x](?!\w)")
page = pytest.mark.parametrize("name", GUIDE_PAGES)


@page
def test_names_no_test_count(name):
    assert not re.findall(r"\b\d[\d,]* tests\b", (REPO / name).read_text())


@page
def test_gives_no_duration_for_make_test(name):
    duration = r"\b\d+(?:\.\d+)? ?(?:minutes?|min|hours?|h|seconds?|s)\b"
    assert not re.findall(rf"`make test`[^.`]*{duration}", (REPO / name).read_text())


@page
def test_gives_no_running_time_in_minutes_or_hours(name):
    """`make demo` or a set-up "takes N minutes" only as a recorded run can say it (docs/benchmarks.md)."""
    assert not re.findall(r"\b\d+(?:\.\d+)? ?(?:minutes?|min|hours?)\b", (REPO / name).read_text())


@page
def test_every_speed_up_is_one_docs_benchmarks_records(name):
    recorded = set(SPEED_UP.findall(BENCHMARKS))
    assert recorded  # the pattern reads the benchmarks' own figures
    assert set(SPEED_UP.findall((REPO / name).read_text())) <= recorded


def test_the_guide_pages_are_the_sites_hand_written_pages():
    """A new guide page is checked too: every page in docs/ is a guide page or one of those named above."""
    others = {"benchmarks", "scaling", "configuration", "planning", "parallelism", "design", "operations",
              "huggingface"}
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert pages == {n for n in GUIDE_PAGES if n.startswith("docs/")} | {f"docs/{n}.md" for n in others}
