"""The HTML report: well-formed, self-contained, escaped, and robust to empty data."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from lmforge.dataprep.report_html import fmt_bytes, fmt_si, render_report_html

STAGE_NAMES = [
    "read",
    "url_dedup",
    "exact_dedup",
    "langid",
    "gopher_repetition",
    "gopher_quality",
    "pii",
    "contamination",
    "minhash",
    "global_dedup",
    "tokenize",
    "shards",
]

EVIL = "<script>alert('x')</script>"
EVIL_URL = "https://evil.example/<script>steal()</script>.warc.wet.gz"

DROPS = {
    "url_dedup": {"duplicate_url": 300},
    "exact_dedup": {"duplicate_content": 1000},
    "langid": {"language_not_kept": 2500, "language_score_too_low": 500},
    "gopher_repetition": {"top_2gram_ratio": 400, "dup_line_fraction": 350, EVIL: 7},
    "gopher_quality": {"too_few_words": 900, "mean_word_length": 120, "symbol_to_word_ratio": 60},
    "contamination": {"eval_overlap": 4},
    "global_dedup": {"near_duplicate": 270},
}

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def _stages() -> list[dict]:
    stages, docs, size = [], 45_000, 123_456_789
    for name in STAGE_NAMES:
        dropped = DROPS.get(name, {})
        out = docs - sum(dropped.values())
        out_size = int(size * out / docs)
        seconds = 0.5 + len(name) / 4
        stages.append(
            {
                "name": name,
                "docs_in": docs,
                "docs_out": out,
                "bytes_in": size,
                "bytes_out": out_size,
                "seconds": seconds,
                "cpu_seconds": seconds * 0.9,
                "dropped": dropped,
                "counters": {"lang:en": 30_000, "lang:fr": 3_000} if name == "langid" else {},
                "drop_rate": (docs - out) / docs,
                "docs_per_second": docs / seconds,
                "mb_per_second": size / 1e6 / seconds,
            }
        )
        docs, size = out, out_size
    return stages


def sample_report() -> dict:
    languages = {f"l{i:02d}": 1000 - 40 * i for i in range(20)}
    languages.update({"en": 30_000, "fr": 3_000, "de": 2_000, "<b>xx</b>": 5})
    return {
        "title": "lmforge data-prep report",
        "output": f"/data/out/{EVIL}",
        "generated_by": "lmforge-dataprep 0.1.0",
        "inputs": {
            "files": 3,
            "bytes": 123_456_789,
            "records": 45_000,
            "bad_input": {
                "truncated_gzip": 1,
                "bad_content_length": 2,
                "non_utf8": 5,
                "empty_file": 1,
                "unreadable": 0,
            },
        },
        "stages": _stages(),
        "languages": languages,
        "doc_length_tokens": {
            "edges": [0, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
            "counts": [300, 1200, 4100, 9800, 12000, 8000, 3500, 1200, 300, 40],
        },
        "pii": {"email": 12, "phone": 3, "ipv4": 1, "credit_card": 2},
        "contamination": {"eval:hellaswag": 4, EVIL: 1},
        "dedup": {"clusters": 40, "removed": {"duplicate_url": 300, "duplicate_content": 1000, "near_duplicate": 270}},
        "totals": {
            "input_bytes": 123_456_789,
            "kept_docs": 5000,
            "kept_bytes": 20_000_000,
            "output_tokens": 5_000_000,
            "train_tokens": 4_950_000,
            "val_tokens": 50_000,
            "train_shards": 1,
            "val_shards": 1,
            "tokens_per_input_byte": 0.04,
            "wall_seconds": 60.0,
            "vocab_size": 8192,
        },
        "workers": [
            {"input": "CC-MAIN-2024-10/segment-00001.warc.wet.gz", "seconds": 3.2, "peak_rss_bytes": 300_000_000},
            {"input": "CC-MAIN-2024-10/segment-00002.warc.wet.gz", "seconds": 4.1, "peak_rss_bytes": 310_000_000},
            {"input": EVIL_URL, "seconds": 2.7, "peak_rss_bytes": 280_000_000},
        ],
    }


def empty_report() -> dict:
    return {
        "title": "lmforge data-prep report",
        "output": "",
        "generated_by": "lmforge-dataprep 0.1.0",
        "inputs": {"files": 0, "bytes": 0, "records": 0, "bad_input": {}},
        "stages": [
            {
                "name": name,
                "docs_in": 0,
                "docs_out": 0,
                "bytes_in": 0,
                "bytes_out": 0,
                "seconds": 0.0,
                "cpu_seconds": 0.0,
                "dropped": {},
                "counters": {},
                "drop_rate": 0.0,
                "docs_per_second": 0.0,
                "mb_per_second": 0.0,
            }
            for name in STAGE_NAMES
        ],
        "languages": {},
        "doc_length_tokens": {"edges": [], "counts": []},
        "pii": {},
        "contamination": {},
        "dedup": {"clusters": 0, "removed": {}},
        "totals": {
            "input_bytes": 0,
            "kept_docs": 0,
            "kept_bytes": 0,
            "output_tokens": 0,
            "train_tokens": 0,
            "val_tokens": 0,
            "train_shards": 0,
            "val_shards": 0,
            "tokens_per_input_byte": 0.0,
            "wall_seconds": 0.0,
            "vocab_size": 0,
        },
        "workers": [],
    }


class StrictChecker(HTMLParser):
    """Parses the page and records nesting errors, tags, attributes and text (script bodies excluded)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str, str]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend((tag, name, value or "") for name, value in attrs)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend((tag, name, value or "") for name, value in attrs)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data):
        if not self.stack or self.stack[-1] not in ("script", "style"):
            self.text.append(data)


def parse(page: str) -> StrictChecker:
    checker = StrictChecker()
    checker.feed(page)
    checker.close()
    return checker


def section(page: str, section_id: str) -> str:
    match = re.search(rf'<(section|header) id="{section_id}">(.*?)</\1>', page, re.S)
    assert match, f"section {section_id} missing"
    return match.group(2)


@pytest.fixture(scope="module")
def page() -> str:
    return render_report_html(sample_report())


def test_page_is_well_formed(page):
    checker = parse(page)
    assert page.startswith("<!DOCTYPE html>")
    assert checker.errors == []
    assert checker.stack == []
    assert checker.tags[0] == "html"


def test_every_chart_section_has_an_svg(page):
    for section_id in ("funnel", "languages", "doc-length", "throughput", "pii", "dedup"):
        assert "<svg" in section(page, section_id), section_id
    throughput = section(page, "throughput")
    for heading in ("wall seconds", "documents / second", "MB / second"):
        assert f'class="head">{heading}</text>' in throughput


def test_sections_in_required_order(page):
    ids = ["summary", "bad-input", "funnel", "drop-reasons", "languages", "doc-length", "throughput", "pii", "dedup"]
    positions = [page.index(f'id="{section_id}"') for section_id in ids + ["workers"]]
    assert positions == sorted(positions)


def test_header_shows_totals_in_human_units(page):
    header = section(page, "summary")
    assert "123.5 MB" in header
    assert "5,000" in header
    assert "5.00 M tokens" in header
    assert "4.95 M" in header


def test_stage_names_and_drop_reasons_appear(page):
    text = " ".join(parse(page).text)
    for name in STAGE_NAMES:
        assert name in section(page, "funnel")
        assert name in section(page, "throughput")
    reasons = section(page, "drop-reasons")
    for dropped in DROPS.values():
        for reason in dropped:
            assert reason in text
            if reason != EVIL:
                assert reason in reasons
    # 2500 of the 45000 - 300 - 1000 = 43700 documents entering langid
    assert "5.7%" in reasons


def test_bad_input_nonzero_highlighted(page):
    bad = section(page, "bad-input")
    assert re.search(r'class="chip bad"><b>5</b> non_utf8', bad)
    assert re.search(r'class="chip"><b>0</b> unreadable', bad)


def test_languages_top_15_plus_other(page):
    langs = section(page, "languages")
    assert "en" in langs and "l00" in langs
    assert "other (9)" in langs
    assert "&lt;b&gt;xx&lt;/b&gt;" not in langs  # 5 documents: folded into "other"
    assert langs.count('class="lbl"') == 16


def test_histogram_has_a_bar_per_bucket(page):
    hist = section(page, "doc-length")
    assert hist.count("<rect") == 10
    assert "64\u2013128" in hist
    assert "\u226516k" in hist


def test_data_is_escaped(page):
    checker = parse(page)
    assert checker.tags.count("script") == 1  # only the page's own sorting script
    assert "<script>alert" not in page
    assert "<script>steal" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    text = " ".join(checker.text)
    assert EVIL in text  # shown to the reader as text
    assert EVIL_URL in text


def test_no_external_references(page):
    checker = parse(page)
    for tag, name, value in checker.attrs:
        if name in ("src", "href", "xlink:href", "action", "srcset", "poster", "data"):
            pytest.fail(f"<{tag} {name}={value!r}> references a resource")
        assert not re.search(r"url\(", value), (tag, name, value)
    for tag in ("link", "img", "iframe", "object", "embed", "image", "use"):
        assert tag not in checker.tags
    assert not re.search(r"url\(", page)
    assert not re.search(r"@import", page)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)


def test_workers_table_sorted_slowest_first(page):
    workers = section(page, "workers")
    assert workers.index("segment-00002") < workers.index("segment-00001")
    assert "310.0 MB" in workers


def test_empty_report_renders_no_data():
    page = render_report_html(empty_report())
    checker = parse(page)
    assert checker.errors == []
    for section_id in ("funnel", "languages", "doc-length", "workers"):
        assert "no data" in section(page, section_id), section_id
    assert "no timings recorded" in section(page, "throughput")
    assert "no PII found" in page and "no contamination found" in page
    assert not re.search(r"\bNaN\b|\binf\b", page)


@pytest.mark.parametrize(
    "report",
    [
        {},
        {"stages": [], "workers": [], "languages": {}, "doc_length_tokens": {}},
        {"stages": [{"name": "read"}], "doc_length_tokens": {"edges": [0, 10], "counts": [0, 0]}},
        {"stages": [{"name": "read", "docs_in": 0, "docs_out": 5, "seconds": 0}], "inputs": {"bad_input": None}},
    ],
)
def test_sparse_reports_render(report):
    page = render_report_html(report)
    assert parse(page).errors == []


def test_units():
    assert fmt_bytes(123_456_789) == "123.5 MB"
    assert fmt_bytes(0) == "0 B"
    assert fmt_si(4_950_000) == "4.95 M"
    assert fmt_si(812_345) == "812 k"
    assert fmt_si(42) == "42"
