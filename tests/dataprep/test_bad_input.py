"""A run over broken inputs finishes, counts each kind of bad input, keeps everything else."""

from __future__ import annotations

import json

from lmforge.sample_data.wet import write_sample_wet
from tests.dataprep.helpers import kept_doc_ids, run_cli
from tests.dataprep.wet_records import gz_member, wet_record

SMALL = ["--set", "tokenizer.vocab_size=600", "--set", "shards.val_fraction=0"]


def _prose_pool() -> list[bytes]:
    """Bodies of generated English prose documents (distinct, pass every filter)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        summary = write_sample_wet(Path(tmp) / "p.warc.wet", 200, 77)
        prose_urls = {r["url"] for r in summary.records if r["kind"] == "prose"}
        from warcio.archiveiterator import ArchiveIterator

        with open(Path(tmp) / "p.warc.wet", "rb") as fh:
            return [r.content_stream().read() for r in ArchiveIterator(fh)
                    if r.rec_type == "conversion" and r.rec_headers.get_header("WARC-Target-URI") in prose_urls]


PROSE = _prose_pool()


def prose(i: int) -> bytes:
    return PROSE[i]


def test_broken_inputs_are_counted_and_the_rest_processed(tmp_path, capsys):
    good = tmp_path / "good.warc.wet.gz"
    write_sample_wet(good, 120, 5)
    members = [gz_member(wet_record(f"https://cut.example/{i}", prose(i))) for i in range(4)]
    data = b"".join(members)
    (tmp_path / "truncated.warc.wet.gz").write_bytes(data[: len(data) - 40])
    (tmp_path / "empty.warc.wet.gz").write_bytes(b"")
    records = [wet_record(f"https://len.example/{i}", prose(10 + i)) for i in range(3)]
    records[1] = wet_record("https://len.example/1", prose(11), content_length=len(prose(11)) - 25)
    (tmp_path / "badlength.warc.wet").write_bytes(b"".join(records))
    (tmp_path / "encoding.warc.wet").write_bytes(
        wet_record("https://enc.example/0", "Ça coûte très cher, écoutez ".encode("latin-1") * 20)
        + wet_record("https://enc.example/1", prose(20)))
    out = tmp_path / "out"
    inputs = [str(p) for p in sorted(tmp_path.glob("*.warc.wet*"))]
    unreachable = "http://127.0.0.1:9/crawl/missing.warc.wet.gz"
    assert run_cli("run", "--input", *inputs, unreachable, "--output", out, "--workers", 1, *SMALL) == 0

    report = json.loads((out / "report.json").read_text())
    bad = report["inputs"]["bad_input"]
    assert bad["truncated_gzip"] == 1
    assert bad["empty_file"] == 1
    assert bad["bad_content_length"] == 1
    assert bad["non_utf8"] == 1
    assert bad["unreadable"] == 1
    errors = [w for w in report["workers"] if w["error"]]
    assert [w["input"] for w in errors] == [unreachable]
    lineage_urls = set()
    import pyarrow.parquet as pq

    for path in (out / "lineage").glob("*.parquet"):
        lineage_urls.update(pq.read_table(path, columns=["url"]).column("url").to_pylist())
    assert {"https://cut.example/0", "https://cut.example/1", "https://cut.example/2"} <= lineage_urls
    assert "https://cut.example/3" not in lineage_urls
    assert {"https://len.example/0", "https://len.example/2", "https://enc.example/1"} <= lineage_urls
    assert "https://len.example/1" not in lineage_urls and "https://enc.example/0" not in lineage_urls
    assert len(kept_doc_ids(out)) > 40


def test_bad_config_names_the_field(tmp_path, capsys):
    good = tmp_path / "in.warc.wet"
    good.write_bytes(wet_record("https://x.example/", prose(1)))
    code = run_cli("run", "--input", good, "--output", tmp_path / "out", "--set", "steps.langid.threshold=1.5")
    assert code == 2
    assert "steps.langid.threshold" in capsys.readouterr().err
    config = tmp_path / "c.yaml"
    config.write_text("steps:\n  gopher_quality:\n    min_doc_words: 500\n    max_doc_words: 100\n")
    assert run_cli("run", "--input", good, "--output", tmp_path / "out", "--config", config) == 2
    assert "min_doc_words" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_missing_input_pattern_is_an_error(tmp_path, capsys):
    assert run_cli("run", "--input", tmp_path / "nothing-*.wet.gz", "--output", tmp_path / "out") == 3
    assert "matched no files" in capsys.readouterr().err


def test_global_stage_before_workers_is_refused(tmp_path, capsys):
    for i in range(2):
        (tmp_path / f"in{i}.warc.wet").write_bytes(wet_record(f"https://x.example/{i}", prose(i)))
    out = tmp_path / "out"
    inputs = [tmp_path / "in0.warc.wet", tmp_path / "in1.warc.wet"]
    assert run_cli("run", "--input", *inputs, "--output", out, "--worker-index", 0, "--num-workers", 2) == 0
    assert run_cli("finalize", "--output", out, "--workers", 1) == 3
    assert "not processed yet" in capsys.readouterr().err


def test_a_literal_input_that_does_not_exist_is_an_input_error(tmp_path, capsys):
    good = tmp_path / "in.warc.wet"
    good.write_bytes(wet_record("https://x.example/", prose(1)))
    missing = tmp_path / "no" / "such" / "file.warc.wet.gz"
    assert run_cli("run", "--input", good, missing, "--output", tmp_path / "out", "--workers", 1) == 3
    err = capsys.readouterr().err
    assert err == f"lmforge-dataprep run: error: input not found: {missing}\n"
    assert not (tmp_path / "out").exists()


def test_a_run_in_which_no_input_yields_a_document_fails_and_names_the_inputs(tmp_path, capsys):
    (tmp_path / "a-text.warc.wet.gz").write_bytes(b"The quick brown fox jumps over the lazy dog.\nMore text.\n")
    (tmp_path / "b-empty.warc.wet.gz").write_bytes(b"")
    members = [gz_member(wet_record(f"https://cut.example/{i}", prose(i))) for i in range(2)]
    (tmp_path / "c-cut.warc.wet.gz").write_bytes(members[0][:30])
    out = tmp_path / "out"
    inputs = sorted(tmp_path.glob("*.warc.wet.gz"))
    assert run_cli("run", "--input", *inputs, "--output", out, "--workers", 1, *SMALL) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lmforge-dataprep run: error: no input yielded a single document: ")
    for path, problem in zip(inputs, ("not_gzip: 1", "empty_file: 1", "truncated_gzip: 1")):
        assert f"{path} ({problem}" in err
    assert not (out / "manifest.json").exists() and not (out / "shards").exists()
    # a rerun (or the global stages alone) says the same, it does not go on with nothing
    assert run_cli("finalize", "--output", out, "--workers", 1) == 3
    assert "no input yielded a single document" in capsys.readouterr().err


def test_some_bad_inputs_among_good_ones_are_counted_and_the_run_succeeds(tmp_path):
    good = tmp_path / "good.warc.wet"
    good.write_bytes(b"".join(wet_record(f"https://g.example/{i}", prose(i)) for i in range(30)))
    (tmp_path / "text.warc.wet.gz").write_bytes(b"just some notes, not an archive at all\n")
    out = tmp_path / "out"
    assert run_cli("run", "--input", good, tmp_path / "text.warc.wet.gz", "--output", out, "--workers", 1,
                   *SMALL) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["inputs"]["bad_input"]["not_gzip"] == 1
    assert report["inputs"]["reader"]["unparseable_inputs"] == 1
    assert report["inputs"]["reader"]["records_read"] == report["inputs"]["records"] == 30
