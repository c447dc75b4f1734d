"""trace_tokens / trace_text on real text: OLMoTrace's unigram filter, EOS splitting, limits, documents with their
lineage and snippets whose match offsets point at the span's text, and the JSON the /v1/trace route returns."""

import json
import math

import numpy as np
import pytest
from tokenizers import Tokenizer

from lmforge.trace.engine import TraceIndex
from lmforge.trace.query import trace_text, trace_tokens
from tests.trace_index import SENTENCES, build_test_index, doc_metadata, make_tokenizer

REPEATED = 3  # SENTENCES[REPEATED] is also in 5 more documents


@pytest.fixture(scope="module")
def text_index(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("text")
    tokenizer_json = make_tokenizer(tmp / "tokenizer.json")
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    texts = SENTENCES + [f"Note {i}: {SENTENCES[REPEATED]} That is all." for i in range(5)]
    docs = [tokenizer.encode(t, add_special_tokens=False).ids for t in texts]
    root = build_test_index(tmp / "idx", docs, vocab_size=tokenizer.get_vocab_size(), eos_token_id=0,
                            tokenizer_json=tokenizer_json, partitions=2)
    return TraceIndex.open(root), tokenizer, texts


def test_a_training_sentence_traces_to_its_document(text_index):
    index, tokenizer, texts = text_index
    text = "Yesterday I read that " + SENTENCES[1] + " Nothing else."
    result = trace_text(index, tokenizer, text, min_span_tokens=6, span_density=None)
    longest = max(result.spans, key=lambda s: s.length)
    assert SENTENCES[1].rstrip(".") in longest.text and longest.count == 1
    [doc] = longest.documents
    lineage = {k: getattr(doc, k) for k in ("doc_id", "url", "record_id", "shard", "token_offset")}
    assert lineage == doc_metadata(1)
    assert doc.snippet[doc.match_start:doc.match_end] == longest.text
    assert doc.snippet in texts[1]
    assert result.tokens == len(tokenizer.encode(text, add_special_tokens=False).ids)
    assert result.index == {"tokens": index.tokens, "documents": len(texts), "partitions": 2,
                            "engine": "infini-gram/2.6.0"}


def test_trace_text_is_trace_tokens_of_the_encoding(text_index):
    index, tokenizer, _ = text_index
    text = SENTENCES[0] + " and " + SENTENCES[5]
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    by_text = trace_text(index, tokenizer, text, min_span_tokens=4, span_density=None)
    by_ids = trace_tokens(index, ids, min_span_tokens=4, span_density=None,
                          decode=lambda part: tokenizer.decode(part, skip_special_tokens=False))
    assert by_text == by_ids and len(by_text.spans) >= 2


def test_snippets_are_windows_around_the_match(text_index):
    index, tokenizer, texts = text_index
    ids = tokenizer.encode(SENTENCES[REPEATED], add_special_tokens=False).ids
    result = trace_tokens(index, ids, min_span_tokens=4, span_density=None, snippet_tokens=2,
                          decode=tokenizer.decode)
    [span] = result.spans
    assert (span.start, span.end, span.count) == (0, len(ids), 6)
    assert {d.doc_id for d in span.documents} == {"doc-3"} | {f"doc-{10 + i}" for i in range(5)}
    for doc in span.documents:
        assert doc.snippet[doc.match_start:doc.match_end] == tokenizer.decode(ids)
        context = doc.snippet[:doc.match_start] + "|" + doc.snippet[doc.match_end:]
        assert context == ("|" if doc.doc_id == "doc-3" else ": | T")  # 2 tokens either side, within the document
    no_text = trace_tokens(index, ids, min_span_tokens=4, span_density=None).spans[0]
    assert no_text.text is None and {(d.snippet, d.match_start, d.match_end) for d in no_text.documents} == {
        (None, None, None)}


def test_max_documents_is_honoured_and_reported(text_index):
    index, tokenizer, _ = text_index
    ids = tokenizer.encode(SENTENCES[REPEATED], add_special_tokens=False).ids
    capped = trace_tokens(index, ids, min_span_tokens=4, max_documents=2, span_density=None)
    assert capped.spans[0].count == 6 and len(capped.spans[0].documents) == 2 and capped.truncated
    full = trace_tokens(index, ids, min_span_tokens=4, max_documents=6, span_density=None)
    assert len(full.spans[0].documents) == 6 and not full.truncated
    assert capped.spans[0].documents == full.spans[0].documents[:2]


def test_to_dict_is_the_route_body(text_index):
    index, tokenizer, _ = text_index
    body = json.loads(json.dumps(trace_text(index, tokenizer, SENTENCES[2], min_span_tokens=4).to_dict()))
    assert list(body) == ["tokens", "truncated", "index", "spans"]
    assert list(body["index"]) == ["tokens", "documents", "partitions", "engine"]
    [span] = body["spans"]
    assert list(span) == ["start", "end", "length", "count", "unigram_logprob", "text", "documents"]
    assert list(span["documents"][0]) == ["url", "record_id", "doc_id", "shard", "token_offset", "snippet",
                                          "match_start", "match_end"]


def test_the_unigram_filter_keeps_the_least_likely_spans(tmp_path):
    # common tokens 1..3 everywhere, rare ones 5..9: spans of rare tokens score lowest
    docs = [[1, 2, 3, 1, 2, 3, 1, 2, 3, 5, 6, 7, 8, 9, 4, 1, 2, 3] for _ in range(3)] + [[1, 2, 1, 3, 2, 1] * 5]
    index = TraceIndex.open(build_test_index(tmp_path / "idx", docs, vocab_size=12, eos_token_id=0))
    q = [1, 2, 3, 1, 11, 5, 6, 7, 11, 2, 1, 3, 2, 11, 7, 8, 9, 4, 11, 3, 1, 2, 3, 1, 11]
    every = trace_tokens(index, q, min_span_tokens=3, span_density=None).spans
    counts = np.bincount([t for d in docs for t in d], minlength=12)
    total = counts.sum() + 12
    for span in every:
        expected = sum(math.log((counts[t] + 1) / total) for t in q[span.start:span.end])
        assert span.unigram_logprob == pytest.approx(expected)
    assert len(every) == 5
    for density in (0.05, 0.1, 0.15):
        kept = trace_tokens(index, q, min_span_tokens=3, span_density=density).spans
        wanted = math.ceil(density * len(q))
        assert len(kept) == wanted and [s.start for s in kept] == sorted(s.start for s in kept)
        lowest = sorted(every, key=lambda s: s.unigram_logprob)[:wanted]
        assert sorted(kept, key=lambda s: s.start) == sorted(lowest, key=lambda s: s.start)
    assert trace_tokens(index, q, min_span_tokens=3, span_density=1.0).spans == every


def test_eos_splits_the_query(tmp_path):
    docs = [[1, 2, 3, 4, 5, 6, 7, 8, 9]]
    index = TraceIndex.open(build_test_index(tmp_path / "idx", docs, vocab_size=10, eos_token_id=4))
    result = trace_tokens(index, [1, 2, 3, 4, 5, 6, 7, 8], min_span_tokens=2, span_density=None)
    # the document holds 1..9 with the EOS id (4) inside; the query's EOS at 3 still splits it
    assert [(s.start, s.end) for s in result.spans] == [(0, 3), (4, 8)]


@pytest.mark.parametrize("ids, message", [
    ([1, 2, 10], "token id 10 is outside the index's vocabulary (0..9)"),
    ([-1, 2], "token id -1 is outside"),
    ([1.5], "token ids must be integers"),
])
def test_bad_ids_are_refused_in_one_line(tmp_path, ids, message):
    index = TraceIndex.open(build_test_index(tmp_path / "idx", [[1, 2, 3]], vocab_size=10, eos_token_id=0))
    with pytest.raises(ValueError, match="^[^\n]+$") as raised:
        trace_tokens(index, ids)
    assert message in str(raised.value)
