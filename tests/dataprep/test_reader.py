"""The WET reader: real files (the Common Crawl fixture and built ones), every bad-input kind."""

import shutil

from lmforge.dataprep.document import split_doc_id
from lmforge.dataprep.steps.reader import WetReader
from tests.dataprep.wet_records import english, gz_member, wet_record


def read(path, index=0):
    reader = WetReader()
    docs = list(reader.read(str(path), index))
    bad = {k.removeprefix("bad_input:"): v for k, v in reader.stats.counters.items() if k.startswith("bad_input:")}
    return reader, docs, bad


def test_real_common_crawl_record_plain_and_gz(shared_fixtures):
    for name in ("whirlwind.warc.wet", "whirlwind.warc.wet.gz"):
        reader, docs, bad = read(shared_fixtures / name, index=3)
        assert bad == {}
        assert [d.url for d in docs] == ["https://an.wikipedia.org/wiki/Escopete"]
        assert docs[0].text.startswith("Escopete")
        assert split_doc_id(docs[0].doc_id) == (3, 0)
        assert docs[0].metadata["warc_date"] == "2024-05-18T01:58:10Z"
        assert reader.stats.docs_in == 1 and reader.stats.docs_out == 1  # warcinfo is not a document
        assert reader.stats.counters["input_bytes"] == (shared_fixtures / name).stat().st_size


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


def test_non_utf8_body_is_dropped_not_mangled(tmp_path):
    records = [wet_record("https://u.example/ok", english(1)),
               wet_record("https://u.example/latin1", "Café crème brûlée ".encode("latin-1") * 10),
               wet_record("https://u.example/ok2", english(2))]
    path = tmp_path / "enc.wet"
    path.write_bytes(b"".join(records))
    reader, docs, bad = read(path)
    assert [d.url for d in docs] == ["https://u.example/ok", "https://u.example/ok2"]
    assert bad == {"non_utf8": 1} and reader.stats.dropped == {"non_utf8": 1}


def test_empty_and_unreadable_inputs(tmp_path):
    empty = tmp_path / "empty.wet.gz"
    empty.write_bytes(b"")
    _, docs, bad = read(empty)
    assert docs == [] and bad == {"empty_file": 1}
    _, docs, bad = read(tmp_path / "missing.wet.gz")
    assert docs == [] and bad == {"unreadable": 1}
    _, docs, bad = read("http://127.0.0.1:9/nothing-listens-here.wet.gz")
    assert docs == [] and bad == {"unreadable": 1}


def test_record_ids_are_stable_across_resync(tmp_path, shared_fixtures):
    good = tmp_path / "good.wet"
    shutil.copy(shared_fixtures / "whirlwind.warc.wet", good)
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
