"""WARC input: HTML responses decoded and their main text extracted, everything else skipped
and counted; the real CLI end to end on a WARC; the default extractor on the evaluation pages."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from lmforge.dataprep.config import ReaderConfig
from lmforge.dataprep.html_text import decode_html, make_extractor, token_scores
from lmforge.dataprep.steps.reader import WetReader
from tests.dataprep.helpers import manifest, run_cli
from tests.dataprep.wet_records import english, gz_member, wet_record

EVAL_PAGES = Path(__file__).resolve().parents[1] / "fixtures" / "html_extraction"
DATE = "2024-05-18T01:58:10Z"
MAIN = ("The garden needs water every morning in summer, and the roses want a little shade "
        "in the afternoon when the sun is at its strongest.")


def warc_record(rec_type: str, url: str, block: bytes, content_type: str = "application/http; msgtype=response",
                extra: tuple[str, ...] = ()) -> bytes:
    headers = ["WARC/1.0", f"WARC-Type: {rec_type}", f"WARC-Target-URI: {url}", f"WARC-Date: {DATE}",
               f"WARC-Record-ID: <urn:uuid:{abs(hash((rec_type, url))) % 10**12:012d}-0000-0000-0000-000000000000>",
               f"Content-Type: {content_type}", *extra, f"Content-Length: {len(block)}"]
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + block + b"\r\n\r\n"


def response(url: str, payload: bytes, content_type: str | None = "text/html", status: str = "200 OK",
             http_headers: tuple[str, ...] = ()) -> bytes:
    lines = [f"HTTP/1.1 {status}", *([f"Content-Type: {content_type}"] if content_type else []), *http_headers,
             f"Content-Length: {len(payload)}"]
    return warc_record("response", url, ("\r\n".join(lines) + "\r\n\r\n").encode() + payload)


def page(body: str, head: str = "") -> str:
    return (f"<html><head>{head}<title>t</title></head><body><nav><a href='/'>Home</a> <a href='/shop'>Shop</a></nav>"
            f"<main><h1>Garden notes</h1>{body}</main><footer>Copyright 2024 Example Ltd. All rights reserved.</footer>"
            "</body></html>")


RUSSIAN = "Сад требует полива каждое утро летом, а розам нужна тень после полудня."
FRENCH = "Le jardin a besoin d'eau chaque matin en été, et les rosiers veulent un peu d'ombre à midi."
GERMAN = "Der Garten braucht im Sommer jeden Morgen Wasser, und die Rosen wollen mittags etwas Schatten."


def html_records() -> list[tuple[str, bytes]]:
    """(url, record) of one WARC with every case, in order."""
    return [
        ("warcinfo", warc_record("warcinfo", "", b"software: test\r\n", "application/warc-fields")),
        ("request", warc_record("request", "https://a.example/utf8", b"GET /utf8 HTTP/1.1\r\nHost: a.example\r\n\r\n",
                                "application/http; msgtype=request")),
        ("https://a.example/utf8", response("https://a.example/utf8", page(f"<p>{MAIN}</p><pre>x = 1</pre>").encode(),
                                            "text/html; charset=utf-8")),
        ("https://a.example/cp1251", response(
            "https://a.example/cp1251", page(f"<p>{RUSSIAN}</p>", "<meta charset='windows-1251'>").encode("cp1251"))),
        ("https://a.example/latin1", response(
            "https://a.example/latin1",
            page(f"<p>{FRENCH}</p>", '<meta http-equiv="Content-Type" content="text/html; charset=iso-8859-1">')
            .encode("latin-1"))),
        ("https://a.example/nocharset",
         response("https://a.example/nocharset", page(f"<p>{GERMAN}</p>").encode(), None)),
        ("https://a.example/gzip", response("https://a.example/gzip", gzip.compress(page(f"<p>{MAIN}</p>").encode()),
                                            "text/html", http_headers=("Content-Encoding: gzip",))),
        ("image", response("https://a.example/logo.png", b"\x89PNG\r\n\x1a\n" + bytes(200), "image/png")),
        ("notfound", response("https://a.example/gone", page("<p>Not found</p>").encode(), status="404 Not Found")),
        ("garbage", response("https://a.example/garbage", b"<html><body><p>" + bytes(range(128, 256)) * 30,
                             "text/html; charset=utf-8")),
        ("metadata",
         warc_record("metadata", "https://a.example/utf8", b"fetchTimeMs: 12\r\n", "application/warc-fields")),
        ("https://a.example/last", response("https://a.example/last", page(f"<p>{MAIN}</p>").encode())),
    ]


@pytest.fixture(scope="module")
def warc_gz(tmp_path_factory) -> Path:
    """A gzip-per-record WARC whose last member is cut in half."""
    members = [gz_member(record) for _, record in html_records()]
    data = b"".join(members)
    path = tmp_path_factory.mktemp("warc") / "crawl.warc.gz"
    path.write_bytes(data[: len(data) - len(members[-1]) // 2])
    return path


def test_warc_html_responses_become_documents_and_the_rest_is_counted(warc_gz):
    reader = WetReader()
    docs = {d.url: d for d in reader.read(str(warc_gz), 0)}
    assert list(docs) == ["https://a.example/utf8", "https://a.example/cp1251", "https://a.example/latin1",
                          "https://a.example/nocharset", "https://a.example/gzip"]
    utf8 = docs["https://a.example/utf8"]
    assert utf8.text == f"Garden notes\n\n{MAIN}\n\nx = 1"  # no menu, no footer; the code block kept
    assert utf8.metadata["warc_date"] == DATE and utf8.metadata["charset"] == "utf-8"
    assert utf8.metadata["content_type"] == "text/html; charset=utf-8"
    cp1251 = docs["https://a.example/cp1251"]
    assert RUSSIAN in cp1251.text and cp1251.metadata["charset"] == "cp1251"
    assert FRENCH in docs["https://a.example/latin1"].text
    assert GERMAN in docs["https://a.example/nocharset"].text
    assert MAIN in docs["https://a.example/gzip"].text
    counters = reader.stats.counters
    assert counters["skipped:warcinfo"] == 1 and counters["skipped:request"] == 1 and counters["skipped:metadata"] == 1
    assert counters["skipped:non_html"] == 1 and counters["skipped:http_status"] == 1
    assert counters["charset_from:http"] == 1 and counters["charset_from:meta"] == 2
    assert counters["charset_from:detected"] == 2  # no charset declared: the plain and the gzip page
    assert counters["html:undecodable_html"] == 1
    assert counters["bad_input:truncated_gzip"] == 1
    assert reader.stats.dropped == {"undecodable_html": 1, "truncated": 1}
    assert reader.stats.docs_in == 7 and reader.stats.docs_out == 5


def test_format_picks_the_record_types_read(tmp_path, warc_gz, fixtures_dir):
    assert list(WetReader(ReaderConfig(format="wet")).read(str(warc_gz), 0)) == []
    wet = fixtures_dir / "whirlwind.warc.wet.gz"
    assert list(WetReader(ReaderConfig(format="warc")).read(str(wet), 0)) == []
    assert [d.url for d in WetReader().read(str(wet), 0)] == ["https://an.wikipedia.org/wiki/Escopete"]
    # One input may even hold both kinds.
    mixed = tmp_path / "mixed.warc"
    mixed.write_bytes(wet_record("https://w.example/", english(1)) + html_records()[2][1])
    assert [d.url for d in WetReader().read(str(mixed), 0)] == ["https://w.example/", "https://a.example/utf8"]


def test_oversized_html_is_dropped_before_parsing(tmp_path):
    path = tmp_path / "big.warc"
    path.write_bytes(response("https://a.example/big", page("<p>" + " ".join([MAIN] * 40) + "</p>").encode()))
    reader = WetReader(ReaderConfig(max_html_bytes=2048))
    assert list(reader.read(str(path), 0)) == []
    assert reader.stats.dropped == {"html_too_large": 1}


def test_trafilatura_extractor_reads_the_same_pages(warc_gz):
    docs = {d.url: d for d in WetReader(ReaderConfig(extractor="trafilatura")).read(str(warc_gz), 0)}
    assert MAIN in docs["https://a.example/utf8"].text
    assert "Copyright" not in docs["https://a.example/utf8"].text


def test_undecodable_bytes_are_refused_not_mangled():
    assert decode_html(b"<p>" + bytes(range(128, 256)) * 30, "text/html; charset=utf-8") is None
    decoded = decode_html("<p>café</p>".encode("cp1252"), "text/html; charset=ISO-8859-1")
    assert decoded.html == "<p>café</p>" and decoded.charset == "cp1252"  # latin-1 means windows-1252 (WHATWG)


def eval_pages() -> list[tuple[str, str, str]]:
    return [(p.stem, p.read_text(encoding="utf-8"), p.with_suffix(".txt").read_text(encoding="utf-8"))
            for p in sorted(EVAL_PAGES.glob("*.html"))]


def test_default_extractor_meets_the_quality_goal_on_the_evaluation_pages():
    """Real documentation text in six site templates (bench/html_eval_build.py): pooled token
    precision >= 0.95 and F1 >= 0.90; every page of the five documentation-site templates (they
    mark their main element) at F1 >= 0.90. The news template marks nothing and is left to
    resiliparse's heuristic (its worst page: F1 0.72, bench/html_extraction.py)."""
    config = ReaderConfig()
    extract = make_extractor(config.extractor, main_content=config.main_content,
                             prune_boilerplate=config.prune_boilerplate, trafilatura_mode=config.trafilatura_mode)
    pages = eval_pages()
    assert len(pages) >= 30 and len({name.split("-")[1] for name, _, _ in pages}) == 6
    common = got = want = 0
    for name, html, reference in pages:
        c, g, w = token_scores(extract(html), reference)
        common, got, want = common + c, got + g, want + w
        if name.split("-")[1] != "news":
            assert 2 * c / (g + w) >= 0.90, name
    precision, recall = common / got, common / want
    assert precision >= 0.95
    assert 2 * precision * recall / (precision + recall) >= 0.90


def test_run_on_a_warc_writes_shards(tmp_path):
    """`lmforge-dataprep run` on a WARC of the evaluation pages: the same pipeline as WET."""
    records = [warc_record("warcinfo", "", b"software: test\r\n", "application/warc-fields")]
    for name, html, _ in eval_pages()[::3]:
        records.append(response(f"https://docs.example/{name}", html.encode("utf-8"), "text/html; charset=utf-8"))
    records.append(response("https://docs.example/logo.png", b"\x89PNG" + bytes(64), "image/png"))
    warc = tmp_path / "docs.warc.gz"
    warc.write_bytes(b"".join(gz_member(r) for r in records))
    out = tmp_path / "out"
    assert run_cli("run", "--input", warc, "--output", out, "--workers", 1, "--set", "tokenizer.vocab_size=600",
                   "--set", "shards.val_fraction=0") == 0
    assert manifest(out)["shards"]
    kept = pq.read_table(out / "work" / "docs" / "000000.parquet").to_pylist()
    assert len(kept) >= 5 and all(row["url"].startswith("https://docs.example/") for row in kept)
    assert all(row["warc_date"] == DATE for row in kept)
    assert "Prev" not in " ".join(row["text"] for row in kept)  # pgdocs' navigation tables are gone
    inputs = json.loads((out / "report.json").read_text())["inputs"]
    assert inputs["records"] == 10
    assert inputs["reader"]["skipped:non_html"] == 1 and inputs["reader"]["charset_from:http"] == 10
