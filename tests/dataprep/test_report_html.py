"""The report: report.html well-formed, self-contained, escaped and robust to empty data; and
what report.json and report.html say about a real run is true (wall-clock per phase, labelled
sizes, paths that survive moving the output, checks that were off, the config used)."""

from __future__ import annotations

import json
import re
import time
from html.parser import HTMLParser

import pytest

from lmforge.common.local_store import LocalStore
from lmforge.dataprep.report import redact_uri, shown_config
from lmforge.dataprep.report_html import render_report_html
from lmforge.dataprep.timings import PHASES, union_seconds
from lmforge.pages.formatting import byte_size, si
from lmforge.sample_data.wet import write_sample_wet
from tests.dataprep.helpers import run_cli
from tests.dataprep.wet_records import gz_member, wet_record

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
                "phase": {"global_dedup": "dedup", "tokenize": "tokenize", "shards": "shards"}.get(name, "inputs"),
                "docs_in": docs,
                "docs_out": out,
                "text_bytes_in": size,
                "text_bytes_out": out_size,
                "worker_seconds": seconds,
                "dropped": dropped,
                "counters": {"lang:en": 30_000, "lang:fr": 3_000} if name == "langid" else {},
                "drop_rate": (docs - out) / docs,
            }
        )
        docs, size = out, out_size
    return stages


JS_URL = "javascript:alert(document.cookie)//<img src=x onerror=alert(3)>"
STEPS = [
    {"id": "url_dedup", "type": "url_dedup", "phase": "inputs", "docs_in": 45_000, "docs_out": 44_700,
     "bytes_in": 123_456_789, "bytes_out": 122_000_000, "seconds": 1.5, "dropped": {"duplicate_url": 300},
     "counters": {}, "histograms": {},
     "examples": {"removed": [{"doc_id": 1, "url": "https://a.example/dup", "reason": "duplicate_url",
                               "preview": "a page seen twice"}],
                  "kept": [{"doc_id": 2, "url": "https://a.example/first", "reason": None, "preview": "first time"}]}},
    {"id": "quality_clf", "type": "fasttext_classifier", "phase": "inputs", "docs_in": 44_700, "docs_out": 40_000,
     "bytes_in": 122_000_000, "bytes_out": 100_000_000, "seconds": 9.0, "dropped": {"low_quality": 4_700, EVIL: 1},
     "counters": {"label:hq": 40_000},
     "histograms": {"hq_prob": {"edges": [i / 20 for i in range(21)], "counts": [4_700] + [0] * 18 + [40_000]},
                    "perplexity": {"edges": [0, 100, 1000, 10_000], "counts": [5, 30_000, 14_695]}},
     "examples": {"removed": [{"doc_id": 3, "url": JS_URL, "reason": "low_quality", "preview": f"{EVIL} spam\nmore"},
                              {"doc_id": 4, "url": "https://b.example/x", "reason": EVIL, "preview": "</pre></div>"}],
                  "kept": [{"doc_id": 5, "url": EVIL_URL, "reason": None, "preview": '"><script>kept()</script>'}]}},
]


def sample_report() -> dict:
    languages = {f"l{i:02d}": 1000 - 40 * i for i in range(20)}
    languages.update({"en": 30_000, "fr": 3_000, "de": 2_000, "<b>xx</b>": 5})
    return {
        "title": "lmforge data-prep report",
        "output": f"/data/out/{EVIL}",
        "generated_by": "lmforge-dataprep 0.1.0",
        "inputs": {
            "files": 3,
            "file_bytes": 30_000_000,
            "gzip_file_bytes": 30_000_000,
            "text_bytes": 123_456_789,
            "records": 45_000,
            "bad_input": {
                "truncated_gzip": 1,
                "bad_content_length": 2,
                "non_utf8": 5,
                "empty_file": 1,
                "unreadable": 0,
            },
        },
        "phases": PHASE_ROWS,
        "stages": _stages(),
        "languages": languages,
        "doc_length_tokens": {
            "edges": [0, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
            "counts": [300, 1200, 4100, 9800, 12000, 8000, 3500, 1200, 300, 40],
        },
        "pii": {"enabled": True, "documents_touched": 11,
                "items_scrubbed": {"email": 12, "phone": 3, "ipv4": 1, "credit_card": 2}},
        "contamination": {"enabled": True, "eval_sets": ["evals/hellaswag.jsonl", EVIL], "documents_checked": 40_000,
                          "documents_removed": 4, "documents_per_eval_set": {"hellaswag": 4, EVIL: 1}},
        "dedup": {"within_input": {"duplicate_url": 300, "duplicate_content": 1000},
                  "removed": {"duplicate_url": 7, "duplicate_content": 9, "near_duplicate": 270},
                  "clusters": 250, "near_duplicate_groups": 240, "near_duplicate_enabled": True},
        "totals": {
            "input_file_bytes": 30_000_000,
            "input_text_bytes": 123_456_789,
            "kept_docs": 5000,
            "kept_text_bytes": 20_000_000,
            "output_tokens": 5_000_000,
            "train_tokens": 4_950_000,
            "val_tokens": 50_000,
            "train_shards": 1,
            "val_shards": 1,
            "tokens_per_kept_text_byte": 0.25,
            "wall_seconds": 60.0,
            "vocab_size": 8192,
        },
        "steps": STEPS,
        "workers": [
            {"phase": "inputs", "task": "filter", "input": "CC-MAIN-2024-10/segment-00001.warc.wet.gz",
             "seconds": 3.2, "peak_rss_bytes": 300_000_000},
            {"phase": "inputs", "task": "filter", "input": "CC-MAIN-2024-10/segment-00002.warc.wet.gz",
             "seconds": 4.1, "peak_rss_bytes": 310_000_000},
            {"phase": "inputs", "task": "filter", "input": EVIL_URL, "seconds": 2.7, "peak_rss_bytes": 280_000_000},
            {"phase": "inputs", "task": "filter", "input": "s3://crawl/missing.warc.wet.gz", "seconds": 0.1,
             "peak_rss_bytes": 90_000_000, "error": "cannot open input s3://crawl/missing.warc.wet.gz: NoSuchKey",
             "problems": {"unreadable": 1}},
            {"phase": "tokenize", "task": "tokenize", "input": "CC-MAIN-2024-10/segment-00001.warc.wet.gz",
             "seconds": 1.5, "peak_rss_bytes": 200_000_000},
            {"phase": "dedup", "task": "main process", "input": None, "host": "pod-0", "pid": 7, "seconds": 9.0,
             "peak_rss_bytes": 900_000_000},
        ],
        "config": {"tokenizer": {"vocab_size": 8192, "path": None}, "contamination": {"eval_sets": [EVIL]}},
    }


PHASE_ROWS = [
    {"name": "inputs", "label": PHASES["inputs"], "wall_seconds": 30.0, "cpu_seconds": 55.0, "processes": 2,
     "peak_rss_bytes": 120_000_000, "docs": 45_000, "docs_per_second": 1500.0, "text_bytes": 123_456_789,
     "text_mb_per_second": 4.115, "file_bytes": 30_000_000, "file_mb_per_second": 1.0},
    {"name": "dedup", "label": PHASES["dedup"], "wall_seconds": 9.0, "cpu_seconds": 12.0, "processes": 1,
     "peak_rss_bytes": 900_000_000, "docs": 30_000, "docs_per_second": 3333.3, "text_bytes": 27_000_000,
     "text_mb_per_second": 3.0},
    {"name": "tokenizer", "label": PHASES["tokenizer"], "wall_seconds": 12.0, "cpu_seconds": 12.0, "processes": 1,
     "peak_rss_bytes": 500_000_000, "docs": 0, "docs_per_second": 0.0, "text_bytes": 20_000_000,
     "text_mb_per_second": 1.667},
    {"name": "tokenize", "label": PHASES["tokenize"], "wall_seconds": 6.0, "cpu_seconds": 11.0, "processes": 1,
     "peak_rss_bytes": 300_000_000, "docs": 5000, "docs_per_second": 833.3, "text_bytes": 20_000_000,
     "text_mb_per_second": 3.333, "tokens": 5_000_000, "tokens_per_second": 833_333.3},
    {"name": "shards", "label": PHASES["shards"], "wall_seconds": 3.0, "cpu_seconds": 3.0, "processes": 1,
     "peak_rss_bytes": 350_000_000, "docs": 5000, "docs_per_second": 1666.7, "text_bytes": 0,
     "text_mb_per_second": 0.0, "tokens": 5_000_000, "tokens_per_second": 1_666_666.7},
]


def empty_report() -> dict:
    return {
        "title": "lmforge data-prep report",
        "output": "",
        "generated_by": "lmforge-dataprep 0.1.0",
        "inputs": {"files": 0, "file_bytes": 0, "text_bytes": 0, "records": 0, "bad_input": {}},
        "phases": [{"name": name, "wall_seconds": 0.0, "processes": 0} for name in PHASES],
        "stages": [
            {
                "name": name,
                "docs_in": 0,
                "docs_out": 0,
                "text_bytes_in": 0,
                "text_bytes_out": 0,
                "worker_seconds": 0.0,
                "dropped": {},
                "counters": {},
                "drop_rate": 0.0,
            }
            for name in STAGE_NAMES
        ],
        "languages": {},
        "doc_length_tokens": {"edges": [], "counts": []},
        "pii": {"enabled": True, "documents_touched": 0, "items_scrubbed": {}},
        "contamination": {"enabled": True, "eval_sets": ["evals/x.jsonl"], "documents_checked": 0,
                          "documents_removed": 0, "documents_per_eval_set": {}},
        "dedup": {"clusters": 0, "removed": {}, "within_input": {}},
        "totals": {
            "input_file_bytes": 0,
            "input_text_bytes": 0,
            "kept_docs": 0,
            "kept_text_bytes": 0,
            "output_tokens": 0,
            "train_tokens": 0,
            "val_tokens": 0,
            "train_shards": 0,
            "val_shards": 0,
            "tokens_per_kept_text_byte": 0.0,
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


def test_sections_in_required_order(page):
    ids = ["summary", "bad-input", "funnel", "drop-reasons", "steps", "languages", "doc-length", "throughput", "pii",
           "dedup", "workers", "config"]
    positions = [page.index(f'id="{section_id}"') for section_id in ids]
    assert positions == sorted(positions)


def test_header_shows_totals_in_human_units(page):
    header = text_of(section(page, "summary"))
    assert "30.0 MB compressed input (gzip files)" in header
    assert "123.5 MB input text (uncompressed)" in header
    assert "20.0 MB kept text (uncompressed)" in header
    assert "1 min 0 s wall time (sum of phases)" in header
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


def test_every_step_has_counts_reasons_histograms_and_examples_side_by_side(page):
    steps = section(page, "steps")
    first, second = re.split(r'<div class="step" id="step-2">', steps)
    assert "url_dedup" in first and "duplicate_url" in first and "<svg" not in first  # no score: no histogram
    text = text_of(second)
    assert "2. quality_clf (fasttext_classifier)" in text
    assert "44,700 docs in → 40,000 out (10.5% dropped)" in text and "122.0 MB in → 100.0 MB out" in text
    assert "low_quality 4,700" in text and "label:hq" in text
    assert second.count("<svg") == 2 and "score: hq_prob" in text and "score: perplexity" in text
    assert "0.95\u20131" in second and "1000\u20131e+04" in second  # one column per bin
    removed, kept = re.findall(r'<div class="panel"><h4>(removed|kept)', second)
    assert (removed, kept) == ("removed", "kept")
    assert "removed (2 shown of 4,700)" in text and "kept (1 shown of 40,000)" in text
    assert text.index(JS_URL) < text.index("kept (1 shown") < text.index(EVIL_URL)


def test_step_examples_are_escaped(page):
    steps = section(page, "steps")
    checker = parse(steps)
    assert checker.errors == [] and checker.stack == []  # "</pre></div>" in a preview closes nothing
    assert "script" not in checker.tags and "img" not in checker.tags
    assert not [name for _, name, _ in checker.attrs if name.startswith("on") or name in ("href", "src")]
    text = " ".join(checker.text)
    assert JS_URL in text and f"{EVIL} spam" in text and '"><script>kept()</script>' in text
    assert "&lt;img src=x onerror=alert(3)&gt;" in steps


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
    assert "&lt;script&gt;alert(" in page
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
        {"steps": [None, {"id": 3, "histograms": {"s": {"edges": [0], "counts": [1, 2]}, "t": None},
                          "examples": {"removed": [None, {"url": None}], "kept": "x"}}]},
    ],
)
def test_sparse_reports_render(report):
    page = render_report_html(report)
    assert parse(page).errors == []


def test_units():
    assert byte_size(123_456_789) == "123.5 MB"
    assert byte_size(0) == "0 B"
    assert si(4_950_000) == "4.95 M"
    assert si(812_345) == "812 k"
    assert si(42) == "42"


def text_of(html: str) -> str:
    """The visible text of an HTML fragment, whitespace collapsed."""
    return re.sub(r"\s+", " ", " ".join(parse(html).text)).strip()


def test_time_is_wall_clock_per_phase_and_stage_time_says_what_it_is(page):
    throughput = section(page, "throughput")
    text = text_of(throughput)
    assert "Wall-clock by phase" in text and "1 min 0 s of wall-clock over the phases" in text
    for phase in PHASE_ROWS:
        assert phase["label"] in text
    # throughput over each phase's own wall-clock, each rate saying what it measures
    assert "1.0 MB/s input files · 4.1 MB/s text · 1.50 k docs/s" in text
    assert "1.7 MB/s text" in text  # tokenizer training: its sample over its wall-clock
    assert "Time inside each stage (summed over worker processes)" in text and "Not wall-clock" in text
    assert "wall seconds" not in text


def test_contamination_says_when_the_check_was_off():
    report = sample_report()
    report["contamination"] = {"enabled": False, "eval_sets": [], "documents_checked": 0, "documents_removed": 0,
                               "documents_per_eval_set": {}}
    pii = text_of(section(render_report_html(report), "pii"))
    assert "Contamination: check off" in pii and "no eval set configured (contamination.eval_sets)" in pii
    assert "no contamination found" not in pii
    on = text_of(section(render_report_html(sample_report()), "pii"))
    assert "Contamination: 4 documents removed" in on and "40,000 documents checked against" in on


def test_pii_documents_and_items_are_counted_apart(page):
    pii = text_of(section(page, "pii"))
    assert "PII: 11 documents touched, 18 items scrubbed" in pii
    report = sample_report()
    report["pii"] = {"enabled": False, "documents_touched": 0, "items_scrubbed": {}}
    assert "PII: check off" in text_of(section(render_report_html(report), "pii"))


def test_dedup_shows_url_exact_and_near_duplicates_apart(page):
    dedup = text_of(section(page, "dedup"))
    for label in ("same URL, within an input", "exact same text, within an input", "same URL, across inputs",
                  "exact same text, across inputs", "near-duplicate (MinHash), across inputs"):
        assert label in dedup
    assert "1,586 documents removed as duplicates" in dedup
    assert "1,316 URL / exact-text duplicates" in dedup and "270 near-duplicates (MinHash)" in dedup
    assert "240 near-duplicate groups" in dedup
    assert "250 duplicate clusters across inputs (URL, exact or near)" in dedup


def test_workers_table_has_main_process_tokenize_and_input_errors(page):
    workers = section(page, "workers")
    text = text_of(workers)
    assert "cannot open input s3://crawl/missing.warc.wet.gz: NoSuchKey" in text
    assert workers.index("missing.warc.wet.gz") < workers.index("segment-00002")  # errors first
    assert "main process (pid 7 on pod-0)" in text and "900.0 MB" in text
    assert "tokenize" in [cells[0] for cells in table_rows(workers)]


def test_config_is_shown(page):
    config = section(page, "config")
    assert '"vocab_size": 8192' in text_of(config)
    assert "&lt;script&gt;" in config and "<script>" not in config


def table_rows(html: str) -> list[list[str]]:
    rows = []
    for row in re.findall(r"<tr>(.*?)</tr>", html, re.S):
        rows.append([text_of(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)])
    return [r for r in rows if r]


def test_credentials_are_redacted(tmp_path):
    assert redact_uri("https://bob:hunter2@host/a.gz?X-Amz-Signature=abc&X-Amz-Security-Token=t&part=1") == (
        "https://***@host/a.gz?X-Amz-Signature=***&X-Amz-Security-Token=***&part=1")
    store = LocalStore(tmp_path / "out")
    shown = shown_config({"tokenizer": {"path": str(tmp_path / "out" / "tok.json"), "eot_token": "<|eot|>"},
                          "s3": {"secret_access_key": "xyz", "endpoint": "http://u:p@minio:9000"}}, store)
    assert shown == {"tokenizer": {"path": "tok.json", "eot_token": "<|eot|>"},
                     "s3": {"secret_access_key": "***", "endpoint": "http://***@minio:9000"}}


def test_union_of_phase_intervals_counts_overlap_once():
    # two pods side by side (0-10, 2-12), then a rerun after a crash (20-25)
    assert union_seconds([(2.0, 12.0), (0.0, 10.0), (20.0, 25.0)]) == pytest.approx(17.0)
    assert union_seconds([]) == 0.0


# ------------------------------------------------------------------ a real run, as the demo runs it

SECRET_INPUT = "http://reader:hunter2@127.0.0.1:9/crawl/missing.warc.wet.gz?X-Amz-Signature=s3cr3t"


@pytest.fixture(scope="module")
def moved_run(tmp_path_factory):
    """Two Indexed-Job workers and `finalize` (the data pipeline's steps), written into a staging
    directory that is then moved into place, as the demo does. Returns (final dir, seconds taken)."""
    workdir = tmp_path_factory.mktemp("demo")
    staging = workdir / ".staging" / "data" / "data"
    (staging / "wet").mkdir(parents=True)
    for seed in (0, 1):
        write_sample_wet(staging / "wet" / f"part-{seed}.warc.wet.gz", 120, seed)
    small = ["--set", "tokenizer.vocab_size=512", "--set", "shards.shard_tokens=20000",
             "--set", "reader.open_attempts=1"]
    started = time.perf_counter()
    for index in (0, 1):
        assert run_cli("run", "--input", str(staging / "wet" / "*.warc.wet.gz"), SECRET_INPUT,
                       "--output", staging, "--worker-index", index, "--num-workers", 2, "--workers", 1, *small) == 0
    assert run_cli("finalize", "--output", staging, "--workers", 1) == 0
    elapsed = time.perf_counter() - started
    final = workdir / "data"
    staging.rename(final)
    return final, elapsed


@pytest.fixture(scope="module")
def moved_report(moved_run):
    final, _ = moved_run
    return json.loads((final / "report.json").read_text()), (final / "report.html").read_text()


def test_wall_time_is_the_sum_of_recorded_phases(moved_run, moved_report):
    _, elapsed = moved_run
    report, page = moved_report
    wall = report["totals"]["wall_seconds"]
    assert wall is not None and wall > 0  # the finalize path used to leave it None ("0 s")
    phases = {p["name"]: p for p in report["phases"]}
    assert list(phases) == [name for name in PHASES if name != "trace-index"]  # the trace index is off here
    assert all(p["wall_seconds"] > 0 and p["processes"] >= 1 for p in phases.values()), phases
    assert phases["inputs"]["processes"] == 2  # both workers recorded their part
    assert wall == pytest.approx(sum(p["wall_seconds"] for p in phases.values()), abs=0.01)
    assert 0.5 * elapsed < wall <= elapsed + 0.01
    for p in phases.values():
        if p["text_bytes"]:
            assert p["text_mb_per_second"] == pytest.approx(p["text_bytes"] / 1e6 / p["wall_seconds"], rel=0.01)
    assert "not recorded" not in text_of(section(page, "summary"))


def test_moved_report_shows_no_staging_path(moved_run, moved_report):
    final, _ = moved_run
    report, page = moved_report
    assert ".staging" not in json.dumps(report) and ".staging" not in page
    assert report["output"] == "."
    local = [w["input"] for w in report["workers"] if w["input"] and "://" not in w["input"]]
    assert sorted(set(local)) == ["wet/part-0.warc.wet.gz", "wet/part-1.warc.wet.gz"]
    assert all((final / path).is_file() for path in local)


def test_real_report_labels_sizes_and_counts_apart(moved_report):
    report, page = moved_report
    inputs, totals = report["inputs"], report["totals"]
    assert inputs["file_bytes"] < inputs["text_bytes"]  # gzip files vs the text in them
    header = text_of(section(page, "summary"))
    assert f"{byte_size(inputs['file_bytes'])} compressed input (gzip files)" in header
    assert f"{byte_size(totals['input_text_bytes'])} input text (uncompressed)" in header
    assert inputs["reader"]["input_bytes"] == inputs["file_bytes"] and inputs["reader"]["input_files"] == 3
    reader = text_of(section(page, "bad-input"))
    assert f"input file bytes (as stored: compressed for .gz) {byte_size(inputs['file_bytes'])}" in reader
    stages = {s["name"]: s for s in report["stages"]}
    pii = report["pii"]
    assert 0 < pii["documents_touched"] < sum(pii["items_scrubbed"].values())
    assert pii["documents_touched"] <= stages["pii"]["docs_in"]
    assert (f"PII: {pii['documents_touched']} documents touched, {sum(pii['items_scrubbed'].values())} items "
            "scrubbed") in text_of(section(page, "pii"))
    assert report["contamination"]["enabled"] is False
    assert "Contamination: check off" in text_of(section(page, "pii"))
    dedup = report["dedup"]
    assert dedup["within_input"].get("duplicate_url", 0) == stages["url_dedup"]["dropped"].get("duplicate_url", 0)
    assert sum(dedup["within_input"].values()) > 0
    assert "same URL, within an input" in text_of(section(page, "dedup"))


def test_real_report_workers_config_and_secrets(moved_report):
    report, page = moved_report
    rows = report["workers"]
    mains = {w["phase"] for w in rows if w["task"] == "main process"}
    assert mains == set(PHASES) - {"trace-index"}  # the trace index is off here: the stage had nothing to do
    assert all(w["peak_rss_bytes"] > 0 for w in rows)
    assert sum(1 for w in rows if w["phase"] == "tokenize" and w["task"] == "tokenize") == 3
    [failed] = [w for w in rows if w["error"]]
    assert failed["problems"] == {"unreadable": 1}
    workers = text_of(section(page, "workers"))
    assert failed["error"] in workers and "main process (pid" in workers
    assert report["config"]["tokenizer"]["vocab_size"] == 512
    assert '"vocab_size": 512' in text_of(section(page, "config"))
    for secret in ("hunter2", "s3cr3t"):
        assert secret not in json.dumps(report) and secret not in page


# ------------------------------------------------------------------ markup from the crawl, in a real run

MARKUP = "<script>alert(1)</script>"
ATTRIBUTE_BREAK = '"onmouseover="alert(2)'  # no space: a URL cannot hold one


def test_markup_from_the_crawl_is_written_as_text_in_a_real_run(tmp_path):
    """What the crawl brings reaches the page as an input's name (a WET file named after its
    URL) and an unreadable input's error; a document whose text, URL and file name carry a
    script and attribute-breaking quotes must come out as visible text: the page's own script
    stays the only one, and no attribute of the markup appears."""
    wet = tmp_path / "out" / "wet" / f"{MARKUP}{ATTRIBUTE_BREAK}.warc.wet.gz"  # the / of </script>: a folder
    wet.parent.mkdir(parents=True)
    write_sample_wet(wet, 40, 7)
    body = f"{MARKUP} {ATTRIBUTE_BREAK} and 'single' quotes in a crawled page. ".encode() * 20
    with wet.open("ab") as fh:
        fh.write(gz_member(wet_record(f"https://evil.example/{MARKUP}{ATTRIBUTE_BREAK}", body)))
    unreadable = f"http://127.0.0.1:9/crawl/{MARKUP}{ATTRIBUTE_BREAK}.warc.wet.gz"
    small = [arg for setting in ("tokenizer.vocab_size=300", "reader.open_attempts=1") for arg in ("--set", setting)]
    assert run_cli("run", "--input", str(wet), unreadable, "--output", tmp_path / "out", "--workers", 1, *small) == 0
    page = (tmp_path / "out" / "report.html").read_text()
    checker = parse(page)
    assert checker.errors == [] and checker.tags.count("script") == 1
    assert not [name for _, name, _ in checker.attrs if name.startswith("on")]
    assert MARKUP not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    text = " ".join(checker.text)
    assert f"{MARKUP}{ATTRIBUTE_BREAK}.warc.wet.gz" in text  # the input's name, as text
    assert f"cannot open input {unreadable}" in text or unreadable in text
