"""The texts `train-classifier` and `train-ngram` read, from every kind of source, and the errors."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lmforge.common.errors import InputError
from lmforge.dataprep.text_sources import read_texts


def test_every_kind_of_source_and_folders_and_globs(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"body": "one"}) + "\n\n" + json.dumps({"body": ""}) + "\n")
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress((json.dumps({"body": "two"}) + "\n").encode()))
    pq.write_table(pa.table({"body": ["three", None]}), tmp_path / "c.parquet")
    (tmp_path / "d.txt").write_text("four\nlines")
    (tmp_path / "skipped.csv").write_text("x")
    assert list(read_texts(str(tmp_path), "body")) == ["one", "two", "three", "four\nlines"]
    assert list(read_texts(str(tmp_path / "*.jsonl*"), "body")) == ["one", "two"]


@pytest.mark.parametrize(("name", "content", "message"), [
    ("x.parquet", None, "no column 'text'"),
    ("x.jsonl", '{"body": "a"}\n', "x.jsonl:1: no text field 'text'"),
    ("x.jsonl", "not json\n", "x.jsonl:1: not a JSON object"),
    ("missing.jsonl", "", "not found: "),
    ("*.nothing", "", "no file matches"),
])
def test_bad_sources_are_one_line_input_errors(tmp_path, name, content, message):
    if name == "x.parquet":
        pq.write_table(pa.table({"body": ["a"]}), tmp_path / name)
    elif content:
        (tmp_path / name).write_text(content)
    with pytest.raises(InputError, match=message.replace("*", r"\*")):
        list(read_texts(str(tmp_path / name)))


def test_a_folder_that_is_neither_an_output_nor_holds_texts(tmp_path):
    (tmp_path / "notes.csv").write_text("x")
    with pytest.raises(InputError, match="not a data-prep output"):
        list(read_texts(str(tmp_path)))
