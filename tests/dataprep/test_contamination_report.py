"""`lmforge-dataprep contamination-report`: a real trace index (tests/trace_index.py, the real builder) over
documents tokenized by a real byte-level BPE tokenizer, and an eval set with an item copied verbatim from a
training document, one sharing only a few words with another document, and a novel one."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from lmforge.trace.contamination import contamination_report
from lmforge.trace.engine import TraceIndex
from tests.dataprep.helpers import run_cli
from tests.trace_index import SENTENCES, build_test_index, make_tokenizer

URLS = ["https://facts.example/fox", "https://facts.example/week", "https://facts.example/garden"]
DOCS = [" ".join(SENTENCES[0:3]), " ".join(SENTENCES[3:6]), " ".join(SENTENCES[6:10])]
COPIED = DOCS[1]  # a whole training document
SHORT = "Ask anyone: plus two is four, and so on, for <ever> & ever."  # " plus two is four, and" is in DOCS[2]
NOVEL = "Zebras quietly juggle xylophones."


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    """A data-prep output holding just its trace index (with the tokenizer), and the eval set beside it."""
    root = tmp_path_factory.mktemp("contamination")
    tokenizer_json = make_tokenizer(root / "tokenizer.json")
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    docs = [tokenizer.encode(text, add_special_tokens=False).ids for text in DOCS]
    build_test_index(root / "out" / "trace-index", docs, vocab_size=tokenizer.get_vocab_size(), eos_token_id=0,
                     urls=URLS, tokenizer_json=tokenizer_json)
    eval_set = root / "mini-eval.jsonl"
    items = [{"id": "copied", "text": COPIED}, {"id": "short", "text": SHORT}, {"text": NOVEL}]
    eval_set.write_text("".join(json.dumps(item) + "\n" for item in items))
    return root / "out", eval_set, tokenizer


def _tokens(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


def test_longest_overlap_per_item(output):
    out, _, tokenizer = output
    index = TraceIndex.open(out / "trace-index")
    items = [{"id": "copied", "text": COPIED}, {"id": "short", "text": SHORT}, {"id": "novel", "text": NOVEL}]
    report = contamination_report(index, tokenizer, items)  # spans of >= 8 tokens
    copied, short, novel = report["items"]
    assert copied["tokens"] == _tokens(tokenizer, COPIED) >= 40
    assert copied["longest"]["tokens"] == copied["tokens"] and copied["longest"]["share"] == 1.0
    assert copied["longest"]["count"] == 1 and copied["covered_share"] == 1.0
    assert [d["url"] for d in copied["longest"]["documents"]] == [URLS[1]]
    assert copied["longest"]["documents"][0]["record_id"] == "<urn:uuid:00000001>"
    assert copied["longest"]["text"] == COPIED
    # The short overlap is exactly the shared words, found in the garden document.
    shared = " plus two is four, and"
    assert short["longest"]["text"] == shared and short["longest"]["tokens"] == _tokens(tokenizer, shared) < 13
    assert [d["url"] for d in short["longest"]["documents"]] == [URLS[2]]
    assert novel["longest"] is None and novel["covered_tokens"] == 0
    assert report["summary"] == {"items": 3, "overlap_at_least": {"13": 1, "32": 1, "50": 1}, "half_covered": 1,
                                 "longest_overlap": copied["tokens"]}


def test_cli_writes_the_json_and_the_html(output):
    out, eval_set, tokenizer = output
    assert run_cli("contamination-report", "--output", out, "--eval-set", eval_set, "--min-span-tokens", 8) == 0
    report = json.loads((out / "reports" / "contamination-mini-eval.json").read_text())
    assert report["eval_set"] == {"name": "mini-eval", "path": str(eval_set)}
    assert report["index_uri"] == f"{out}/trace-index" and report["min_span_tokens"] == 8
    assert [item["id"] for item in report["items"]] == ["copied", "short", "line 3"]
    assert report["items"][0]["longest"]["tokens"] == _tokens(tokenizer, COPIED)
    assert report["summary"]["overlap_at_least"]["50"] == 1
    page = (out / "reports" / "contamination-mini-eval.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "Contamination of mini-eval" in page
    assert f'href="{URLS[1]}"' in page and "&lt;urn:uuid:00000001&gt;" in page
    assert "&lt;ever&gt; &amp; ever" in page and "<ever>" not in page  # item text is escaped


def test_missing_index_is_an_input_error(tmp_path, output, capsys):
    _, eval_set, _ = output
    empty = tmp_path / "run-without-index"
    empty.mkdir()
    assert run_cli("contamination-report", "--output", empty, "--eval-set", eval_set) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lmforge-dataprep contamination-report: error: ")
    assert f"{empty}/trace-index" in err
    assert not (empty / "reports").exists()
