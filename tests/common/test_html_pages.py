"""The HTML pages drawn from templates (lmforge.pages.html_pages): the data-prep report, the
training report and the dashboards page each load nothing from anywhere when opened, and every
chart says what its axes measure. The two reports are opened by a real browser: headless
Chromium screenshots each, and the screenshot shows the page's header and charts, not a blank."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image

from lmforge.dataprep.report_html import render_report_html
from lmforge.demo.dashboards_page import Dashboard, Panel, Series, Target, render_page
from lmforge.trainer.metrics_file import MetricsFile
from lmforge.trainer.report_html import write_report

T0 = 1_700_000_000.0
LOADING_TAGS = {
    "link",
    "img",
    "iframe",
    "frame",
    "object",
    "embed",
    "image",
    "use",
    "audio",
    "video",
    "source",
    "track",
    "base",
    "portal",
}
LOADING_ATTRIBUTES = {"src", "href", "xlink:href", "srcset", "poster", "action", "formaction", "data", "background"}
HEADER = (0x0F, 0x17, 0x2A)  # the pages' dark header band (page.css --fg)
BLUE = (0x25, 0x63, 0xEB)  # the funnel's bars; the training report's first attempt (its legend swatch)


def data_prep_report() -> dict:
    stages = [
        {
            "name": name,
            "phase": "inputs",
            "docs_in": docs_in,
            "docs_out": docs_out,
            "text_bytes_in": docs_in * 2000,
            "text_bytes_out": docs_out * 2000,
            "worker_seconds": 1.5,
            "dropped": {"language_not_kept": docs_in - docs_out} if docs_in > docs_out else {},
        }
        for name, docs_in, docs_out in (("read", 1000, 1000), ("langid", 1000, 700), ("tokenize", 700, 700))
    ]
    return {
        "title": "lmforge data-prep report",
        "generated_by": "lmforge-dataprep (test)",
        "inputs": {
            "files": 1,
            "file_bytes": 10**6,
            "gzip_file_bytes": 10**6,
            "records": 1000,
            "bad_input": {"non_utf8": 2},
        },
        "stages": stages,
        "languages": {"en": 700, "fr": 200, "de": 100},
        "doc_length_tokens": {"edges": [0, 64, 128, 256], "counts": [100, 300, 250, 50]},
        "phases": [
            {
                "name": "inputs",
                "label": "read and filter",
                "wall_seconds": 12.0,
                "cpu_seconds": 11.0,
                "processes": 1,
                "docs": 1000,
                "docs_per_second": 83.3,
            }
        ],
        "pii": {"enabled": True, "documents_touched": 3, "items_scrubbed": {"email": 4}},
        "contamination": {"enabled": False},
        "dedup": {"within_input": {"duplicate_url": 5}, "removed": {}, "clusters": 5},
        "totals": {
            "input_file_bytes": 10**6,
            "input_text_bytes": 2 * 10**6,
            "kept_docs": 700,
            "output_tokens": 300_000,
            "train_tokens": 290_000,
            "val_tokens": 10_000,
            "wall_seconds": 12.0,
            "vocab_size": 512,
        },
        "workers": [
            {
                "phase": "inputs",
                "task": "filter",
                "input": "wet/part-0.warc.wet.gz",
                "seconds": 3.0,
                "peak_rss_bytes": 2 * 10**8,
            }
        ],
        "config": {"tokenizer": {"vocab_size": 512}},
    }


def training_run(run_dir: Path) -> Path:
    """Twelve steps, an evaluation and a checkpoint at step 9: the report of that run."""
    metrics = MetricsFile(run_dir / "metrics.jsonl")
    metrics.write(
        {"kind": "start", "timestamp": T0, "resumed_from": None, "first_step": 0, "steps": 12, "world_size": 1}
    )
    for step in range(12):
        metrics.write(
            {
                "kind": "step",
                "step": step,
                "timestamp": T0 + step,
                "loss": 6.0 - 0.3 * step,
                "grad_norm": 1.0 / (step + 1),
                "lr": 1e-3,
                "tokens_per_second": 5000.0 + 40 * step,
                "mfu": None,
            }
        )
    metrics.write({"kind": "eval", "step": 9, "val_loss": 3.5})
    metrics.write({"kind": "checkpoint", "step": 9, "timestamp": T0 + 9})
    metrics.write({"kind": "end", "timestamp": T0 + 12, "status": "finished"})
    metrics.close()
    return write_report(run_dir)


def dashboards() -> str:
    latency = Series("p95", [(T0 + i, 0.05 + 0.01 * i) for i in range(10)])
    return render_page(
        [
            Dashboard(
                "inference",
                "lmforge / Inference",
                [Panel("Latency", "timeseries", "s", None, [Target("some_expr", [latency])])],
            )
        ],
        prometheus="http://127.0.0.1:9090",
        start=T0,
        end=T0 + 10,
        step=1,
    )


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pages")
    (root / "run").mkdir()
    data_prep, dashboards_page = root / "report.html", root / "dashboards.html"
    data_prep.write_text(render_report_html(data_prep_report()))
    dashboards_page.write_text(dashboards())
    return {"dataprep": data_prep, "trainer": training_run(root / "run"), "dashboards": dashboards_page}


class Tags(HTMLParser):
    """Every tag with its attributes, and the text of each chart's axis titles."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.charts: list[list[str]] = []  # per <svg class="chart">: its axis titles
        self._axis_title = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == "svg" and attrs.get("class") == "chart":
            self.charts.append([])
        self._axis_title = tag == "text" and attrs.get("class") == "axis-title"

    def handle_endtag(self, tag):
        self._axis_title = False

    def handle_data(self, data):
        if self._axis_title:
            self.charts[-1].append(data)


@pytest.mark.parametrize("name", ["dataprep", "trainer", "dashboards"])
def test_a_page_loads_nothing_from_anywhere(pages, name):
    text = pages[name].read_text()
    tags = Tags(text).tags
    assert [tag for tag, _ in tags if tag in LOADING_TAGS] == []
    assert [(tag, a) for tag, attrs in tags for a in attrs if a in LOADING_ATTRIBUTES] == []
    assert not [(tag, attrs) for tag, attrs in tags if tag == "script" and attrs]  # inline only
    assert "@import" not in text and "url(" not in text
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text, re.I)


@pytest.mark.parametrize(
    "name,titles",
    [
        ("dataprep", {"documents", "document length (tokens)", "wall-clock time (seconds)", "items scrubbed"}),
        ("trainer", {"training step", "loss (cross-entropy)", "learning rate", "tokens / second"}),
        ("dashboards", {"time (local)", "seconds"}),
    ],
)
def test_every_chart_says_what_its_axes_measure(pages, name, titles):
    charts = Tags(pages[name].read_text()).charts
    assert charts and all(chart and all(t.strip() for t in chart) for chart in charts), charts
    assert titles <= {t for chart in charts for t in chart}


def screenshot(page: Path, png: Path, profile: Path) -> None:
    chromium = shutil.which("chromium")
    assert chromium, "no chromium: `make system-packages` installs it (Debian package chromium)"
    done = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--screenshot={png}",
            "--window-size=1100,1400",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"HOME": str(profile), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0 and png.is_file(), done.stderr[-2000:]


@pytest.mark.parametrize("name", ["dataprep", "trainer"])
def test_chromium_draws_the_report(pages, name, tmp_path):
    png = tmp_path / f"{name}.png"
    screenshot(pages[name], png, tmp_path / "profile")
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size == (1100, 1400)
        pixels = image.convert("RGB")
    colours = {colour for _, colour in pixels.getcolors(maxcolors=1 << 22)}
    assert len(colours) > 50, f"a blank page: {len(colours)} colour(s)"  # text, bars and lines antialiased
    assert pixels.getpixel((40, 40)) == HEADER  # the inline stylesheet applied
    assert BLUE in colours  # a chart (the funnel's bars; the loss chart's legend) drawn
