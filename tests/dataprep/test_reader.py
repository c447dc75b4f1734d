"""The WET reader: real files (the Common Crawl fixture and built ones), every bad-input kind."""

import shutil

from lmforge.dataprep.config import ReaderConfig
from lmforge.dataprep.document import split_doc_id
from lmforge.dataprep.steps.reader import WetReader
from tests.dataprep.wet_records import english, gz_member, wet_record


def read(path, index=0, config=None):
    reader = WetReader(config)
    docs = list(reader.read(str(path), index))
    bad = {k.removeprefix("bad_input:"): v for k, v in reader.stats.counters.items() if k.startswith("bad_input:")}
    return reader, docs, bad


def test_real_common_crawl_record_plain_and_gz(fixtures_dir):
    for name in ("whirlwind.warc.wet", "whirlwind.warc.wet.gz"):
        reader, docs, bad = read(fixtures_dir / name, index=3)
        assert bad == {}
        assert [d.url for d in docs] == ["https://an.wikipedia.org/wiki/Escopete"]
        assert docs[0].text.startswith("Escopete")
        assert split_doc_id(docs[0].doc_id) == (3, 0)
        assert docs[0].metadata["warc_date"] == "2024-05-18T01:58:10Z"
        assert reader.stats.docs_in == 1 and reader.stats.docs_out == 1  # warcinfo is not a document
        assert reader.stats.counters["input_bytes"] == (fixtures_dir / name).stat().st_size


def test_wrong_content_length_drops_that_record_and_keeps_the_rest(tmp_path):
    for delta in (-40, +40):
        records = [wet_record(f"https://a.example/{i}", english(i)) for i in range(4)]
        records[1] = wet_record("https://a.example/1", english(1), content_length=len(english(1)) + delta)
        for gz in (False, True):
            path = tmp_path / (f"bad{delta}.wet" + (".gz" if gz else ""))
            path.write_bytes(b"".join(gz_member(r) if gz else r for r in records))
            reader, docs, bad = read(path)
            urls = [d.url for d in docs]
            assert "https://a.example/1" not in urls, (delta, gz)
            assert {"https://a.example/0", "https://a.example/2", "https://a.example/3"} <= set(urls), (delta, gz)
            assert bad.get("bad_content_length", 0) >= 1
            assert all(d.text == english(int(d.url[-1])).decode().strip() for d in docs)


def test_truncated_gzip_keeps_complete_records(tmp_path):
    members = [gz_member(wet_record(f"https://t.example/{i}", english(i))) for i in range(3)]
    data = b"".join(members)
    path = tmp_path / "cut.wet.gz"
    path.write_bytes(data[: len(data) - len(members[-1]) // 2])
    reader, docs, bad = read(path)
    assert [d.url for d in docs] == ["https://t.example/0", "https://t.example/1"]
    assert bad == {"truncated_gzip": 1}
    assert reader.stats.dropped == {"truncated": 1}
    assert accounted(reader)["docs_in"] == 3


def test_non_utf8_body_is_dropped_not_mangled(tmp_path):
    records = [wet_record("https://u.example/ok", english(1)),
               wet_record("https://u.example/latin1", "Café crème brûlée ".encode("latin-1") * 10),
               wet_record("https://u.example/ok2", english(2))]
    path = tmp_path / "enc.wet"
    path.write_bytes(b"".join(records))
    reader, docs, bad = read(path)
    assert [d.url for d in docs] == ["https://u.example/ok", "https://u.example/ok2"]
    assert bad == {"non_utf8": 1} and reader.stats.dropped == {"non_utf8": 1}
    assert accounted(reader)["docs_in"] == 3


def test_empty_and_unreadable_inputs(tmp_path):
    empty = tmp_path / "empty.wet.gz"
    empty.write_bytes(b"")
    _, docs, bad = read(empty)
    assert docs == [] and bad == {"empty_file": 1}
    _, docs, bad = read(tmp_path / "missing.wet.gz")
    assert docs == [] and bad == {"unreadable": 1}
    _, docs, bad = read("http://127.0.0.1:9/nothing-listens-here.wet.gz")
    assert docs == [] and bad == {"unreadable": 1}


def test_record_ids_are_stable_across_resync(tmp_path, fixtures_dir):
    good = tmp_path / "good.wet"
    shutil.copy(fixtures_dir / "whirlwind.warc.wet", good)
    _, docs_a, _ = read(good)
    _, docs_b, _ = read(good)
    assert [d.doc_id for d in docs_a] == [d.doc_id for d in docs_b]


def test_reject_sink_receives_drops(tmp_path):
    path = tmp_path / "enc.wet"
    path.write_bytes(wet_record("https://u.example/bad", b"\xff\xfe bad bytes"))
    reader = WetReader()
    seen = []
    reader.reject_sink = lambda doc, stage, reason: seen.append((doc.url, stage, reason))
    assert list(reader.read(str(path), 0)) == []
    assert seen == [("https://u.example/bad", "read", "non_utf8")]


def test_a_dropped_record_keeps_its_doc_id(tmp_path):
    from lmforge.dataprep.document import make_doc_id

    records = [wet_record(f"https://a.example/{i}", english(i)) for i in range(3)]
    records[1] = wet_record("https://a.example/1", english(1), content_length=len(english(1)) - 30)
    path = tmp_path / "bad.wet"
    path.write_bytes(b"".join(records))
    reader = WetReader()
    seen = []
    reader.reject_sink = lambda doc, stage, reason: seen.append((doc.doc_id, doc.url, reason))
    list(reader.read(str(path), 7))
    assert seen == [(make_doc_id(7, 1), "https://a.example/1", "bad_content_length")]


def accounted(reader) -> dict:
    """The read step's accounting, checked to add up: every conversion record met is kept or
    rejected for a reason, every WARC record is a conversion record or counted as another type."""
    stats = reader.stats
    assert stats.docs_in == stats.docs_out + sum(stats.dropped.values())
    assert stats.counters["records_read"] == stats.docs_in + stats.counters["records_not_conversion"]
    return {"records_read": stats.counters["records_read"], "docs_in": stats.docs_in, "docs_out": stats.docs_out,
            "dropped": dict(stats.dropped), "not_conversion": stats.counters["records_not_conversion"],
            "unparseable_inputs": stats.counters["unparseable_inputs"]}


def test_text_that_is_not_gzip_or_not_warc_is_unparseable_not_clean(tmp_path):
    # warcio takes a line of five words for an old ARC record header and reads the file "cleanly"
    text = b"hello there my dear friend\nThe quick brown fox jumps over the lazy dog.\n"
    for name, kind in (("notes.warc.wet.gz", "not_gzip"), ("notes.warc.wet", "not_warc")):
        (tmp_path / name).write_bytes(text)
        reader, docs, bad = read(tmp_path / name)
        assert docs == [] and bad == {kind: 1}, name
        assert accounted(reader) == {"records_read": 0, "docs_in": 0, "docs_out": 0, "dropped": {},
                                     "not_conversion": 0, "unparseable_inputs": 1}
    html = b"<html><head><title>403 Forbidden</title></head><body>AccessDenied</body></html>\n"
    (tmp_path / "denied.warc.wet.gz").write_bytes(html)
    _, docs, bad = read(tmp_path / "denied.warc.wet.gz")
    assert docs == [] and bad == {"not_gzip": 1}


def test_records_dropped_while_resynchronising_are_counted_in(tmp_path):
    for delta in (-25, +40):
        records = [wet_record(f"https://a.example/{i}", english(i)) for i in range(3)]
        records[1] = wet_record("https://a.example/1", english(1), content_length=len(english(1)) + delta)
        for gz in (False, True):
            path = tmp_path / (f"len{delta}.wet" + (".gz" if gz else ""))
            path.write_bytes(b"".join(gz_member(r) if gz else r for r in records))
            reader, docs, bad = read(path)
            assert [d.url for d in docs] == ["https://a.example/0", "https://a.example/2"], (delta, gz)
            assert accounted(reader) == {"records_read": 3, "docs_in": 3, "docs_out": 2,
                                         "dropped": {"bad_content_length": 1}, "not_conversion": 0,
                                         "unparseable_inputs": 0}, (delta, gz)
            assert bad == {"bad_content_length": 1}


def test_garbage_after_a_non_document_record_is_counted_once_and_nothing_is_read_twice(tmp_path):
    records = [wet_record(f"https://a.example/{i}", english(i)) for i in range(2)]
    records += [wet_record("https://info.example/", b"software: crawler", rec_type="warcinfo"),
                b"this is not a warc record at all\r\n\r\n" * 3]
    for gz in (False, True):
        path = tmp_path / ("tail.wet" + (".gz" if gz else ""))
        path.write_bytes(b"".join(gz_member(r) if gz else r for r in records))
        reader, docs, bad = read(path)
        assert [d.url for d in docs] == ["https://a.example/0", "https://a.example/1"], gz
        assert bad == {"corrupt_record": 1}, gz
        assert accounted(reader) == {"records_read": 3, "docs_in": 2, "docs_out": 2, "dropped": {},
                                     "not_conversion": 1, "unparseable_inputs": 0}, gz


def test_a_clean_file_accounts_for_every_record(fixtures_dir):
    reader, docs, bad = read(fixtures_dir / "whirlwind.warc.wet.gz")
    assert bad == {} and len(docs) == 1
    assert accounted(reader) == {"records_read": 2, "docs_in": 1, "docs_out": 1, "dropped": {},
                                 "not_conversion": 1, "unparseable_inputs": 0}


def test_a_content_length_that_is_not_a_number_drops_that_record_only(tmp_path):
    records = [wet_record(f"https://n.example/{i}", english(i)) for i in range(3)]
    records[0] = records[0].replace(b"Content-Length: ", b"Content-Length: 12x", 1)
    for gz in (False, True):
        path = tmp_path / ("nan.wet" + (".gz" if gz else ""))
        path.write_bytes(b"".join(gz_member(r) if gz else r for r in records))
        reader, docs, bad = read(path)
        assert [d.url for d in docs] == ["https://n.example/1", "https://n.example/2"], gz
        assert bad == {"bad_content_length": 1}
        assert accounted(reader) == {"records_read": 3, "docs_in": 3, "docs_out": 2,
                                     "dropped": {"bad_content_length": 1}, "not_conversion": 0,
                                     "unparseable_inputs": 0}, gz


def test_a_record_over_max_record_bytes_is_rejected_with_its_reason_and_the_rest_read(tmp_path):
    records = [wet_record(f"https://s.example/{i}", english(i)) for i in range(3)]
    records[1] = wet_record("https://s.example/1", b"x" * 5000 + b"\n")
    for gz in (False, True):
        path = tmp_path / ("big.wet" + (".gz" if gz else ""))
        path.write_bytes(b"".join(gz_member(r) if gz else r for r in records))
        reader, docs, _ = read(path, config=ReaderConfig(max_record_bytes=5000))
        assert [d.url for d in docs] == ["https://s.example/0", "https://s.example/2"], gz
        assert accounted(reader) == {"records_read": 3, "docs_in": 3, "docs_out": 2,
                                     "dropped": {"record_too_large": 1}, "not_conversion": 0,
                                     "unparseable_inputs": 0}, gz
        assert reader.stats.bytes_in == len(english(0)) + 5001 + len(english(2)), gz
    # one that is also cut short is the truncated record it is
    cut = wet_record("https://s.example/3", b"y" * 6000 + b"\n", content_length=9000)
    (tmp_path / "cut.wet").write_bytes(records[0] + cut)
    reader, docs, bad = read(tmp_path / "cut.wet", config=ReaderConfig(max_record_bytes=5000))
    assert [d.url for d in docs] == ["https://s.example/0"]
    assert reader.stats.dropped == {"truncated": 1} and bad == {"truncated_record": 1}
