"""Every span the trace reports, its count and its documents equal a brute-force scan (lmforge.trace.brute) on small
corpora: random ones with dense repeats, and adversarial ones (long runs, a passage repeated 30 times, periodic
text, spans that would only match across a document boundary). Also pins the engine's semantics we rely on."""

import numpy as np
import pytest

from lmforge.trace import query
from lmforge.trace.brute import maximal_spans
from lmforge.trace.engine import TraceIndex
from lmforge.trace.query import trace_tokens
from tests.trace_index import build_test_index

EOS = 0
ALL = dict(max_documents=10**6, max_count=10**9, span_density=None)


def _traced(index, q, min_len, **kw):
    result = trace_tokens(index, q, min_span_tokens=min_len, **{**ALL, **kw})
    return [(s.start, s.end, s.count, frozenset(int(d.doc_id.split("-")[1]) for d in s.documents))
            for s in result.spans]


def _brute(docs, q, min_len):
    return [(s.start, s.end, s.count, s.documents) for s in maximal_spans(docs, q, min_len, eos_token_id=EOS)]


def _occurs(docs, tokens) -> bool:
    n = len(tokens)
    return any(list(d[i:i + n]) == list(tokens) for d in docs for i in range(len(d) - n + 1))


def _random_case(seed):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(3, 8))
    docs = [rng.integers(1, vocab, rng.integers(0, 50)).tolist() for _ in range(int(rng.integers(5, 15)))]
    queries = [rng.integers(0, vocab, 60).tolist()]  # random, EOS (0) included now and then
    for _ in range(3):  # pieces of documents glued together: long spans
        pieces = [docs[i][a:a + 15] for i, a in zip(rng.integers(0, len(docs), 4), rng.integers(0, 30, 4))]
        queries.append([t for piece in pieces for t in piece])
    return vocab, docs, queries


@pytest.fixture(scope="module")
def random_indexes(tmp_path_factory):
    cases = []
    for seed in range(5):
        vocab, docs, queries = _random_case(seed)
        root = build_test_index(tmp_path_factory.mktemp(f"random{seed}") / "idx", docs, vocab_size=vocab,
                                eos_token_id=EOS, partitions=1 + seed % 3)
        cases.append((TraceIndex.open(root), docs, queries))
    return cases


@pytest.mark.parametrize("seed", range(5))
def test_random_corpora_match_brute_force(random_indexes, seed):
    index, docs, queries = random_indexes[seed]
    for q in queries:
        for min_len in (1, 2, 3, 6):
            assert _traced(index, q, min_len) == _brute(docs, q, min_len), (q, min_len)


def test_every_span_is_maximal_and_occurs(random_indexes):
    for index, docs, queries in random_indexes:
        for q in queries:
            for start, end, count, holders in _traced(index, q, 1):
                assert _occurs(docs, q[start:end]) and count >= len(holders) >= 1
                assert start == 0 or q[start - 1] == EOS or not _occurs(docs, q[start - 1:end])
                assert end == len(q) or q[end] == EOS or not _occurs(docs, q[start:end + 1])


ADVERSARIAL = {
    # one token 120 times (plus a shorter run elsewhere): overlapping occurrences all counted
    "long run": ([[7] * 120, [1, 7, 7, 7, 2]], [[7] * 50, [1, 7, 7, 7, 7, 2], [2] + [7] * 119 + [7, 7]]),
    # a passage repeated 30x, in 30 documents and 30x inside one
    "repeated passage": (
        [[5, 6, 1, 2, 3, 4, 5, 6, 7, 1, 3] for _ in range(30)] + [[1, 2, 3, 4, 5, 6, 7, 1, 3] * 30],
        [[2, 1, 2, 3, 4, 5, 6, 7, 1, 3, 2], [1, 2, 3, 4, 5, 6, 7, 1, 3] * 4 + [4, 4]],
    ),
    # periodic text of periods 2 and 3
    "periodic": ([[1, 2] * 40, [1, 2, 3] * 30, [3, 1, 2] * 5],
                 [[1, 2] * 45, [2, 3, 1] * 12 + [2, 1, 2, 1], [1, 2, 3, 1, 2, 1, 2, 1, 2, 3]]),
    # doc A ends with X, doc B starts with Y: X+Y is in no document and must not match across the boundary
    "across documents": ([[4, 4, 1, 2, 3, 4, 5], [6, 7, 8, 9, 1, 1], [9, 9]],
                         [[1, 2, 3, 4, 5, 6, 7, 8, 9], [3, 4, 5, 6, 7], [5, 6], [1, 1, 9, 9, 4, 4]]),
}


@pytest.mark.parametrize("name", ADVERSARIAL)
@pytest.mark.parametrize("partitions", [1, 2])
def test_adversarial_corpora_match_brute_force(tmp_path, name, partitions):
    docs, queries = ADVERSARIAL[name]
    index = TraceIndex.open(build_test_index(tmp_path / "idx", docs, vocab_size=10, eos_token_id=EOS,
                                             partitions=partitions))
    for q in queries:
        for min_len in (1, 2, 4, 9):
            assert _traced(index, q, min_len) == _brute(docs, q, min_len), (q, min_len)
    if name == "long run":
        assert _traced(index, [7] * 50, 8) == [(0, 50, 71, frozenset({0}))]
    if name == "across documents":
        assert _traced(index, [1, 2, 3, 4, 5, 6, 7, 8, 9], 1) == [(0, 5, 1, frozenset({0})),
                                                                  (5, 9, 1, frozenset({1}))]


def test_counts_over_max_count_vanish(tmp_path):
    """infini-gram's max_cnt: a span occurring more often than it is dropped (with every sub-span ending where it
    ends), not truncated; exactly max_cnt occurrences are all returned."""
    passage = [1, 2, 3, 4, 5, 6]
    docs = [[9, 8] + passage + [7] for _ in range(50)] + [[8, 9, 9]]
    index = TraceIndex.open(build_test_index(tmp_path / "idx", docs, vocab_size=10, eos_token_id=EOS))
    q = [7, 7] + passage + [7, 7]
    assert _traced(index, q, 3, max_count=50) == [(2, 9, 50, frozenset(range(50)))]
    assert _traced(index, q, 3, max_count=49) == []
    assert _traced(index, [8, 9, 9, 7], 3, max_count=1) == [(0, 3, 1, frozenset({50}))]


def test_the_engines_rank0_miss_is_repaired(tmp_path, monkeypatch):
    """infini-gram 2.6.0's longest-prefix search never compares a query with a partition's smallest suffix when the
    query sorts before all of them: [1, 2] (the start of the smallest suffix, 1 2 3 4) is lost for query 1 2 2.
    query.py detects that case and recounts the piece exactly."""
    index = TraceIndex.open(build_test_index(tmp_path / "idx", [[1, 2, 3, 4], [5, 5]], vocab_size=10,
                                             eos_token_id=EOS))
    raw = index.engine.attribute(input_ids=[1, 2, 2], delim_ids=[], min_len=2, max_cnt=10, enforce_bow=False)
    assert raw["spans"] == []  # the engine's own answer misses [0, 2)
    assert _traced(index, [1, 2, 2], 2) == [(0, 2, 1, frozenset({0}))]
    # the exact recount alone (forced everywhere) also equals brute force
    monkeypatch.setattr(query, "_rank0_missed", lambda *a: True)
    _, docs, queries = _random_case(11)
    forced = TraceIndex.open(build_test_index(tmp_path / "forced", docs, vocab_size=8, eos_token_id=EOS,
                                              partitions=2))
    for q in queries:
        assert _traced(forced, q, 2) == _brute(docs, q, 2)


def test_spans_never_cross_eos(tmp_path):
    docs = [[1, 2, 3, 4, 5, 6, 7, 8]]
    index = TraceIndex.open(build_test_index(tmp_path / "idx", docs, vocab_size=10, eos_token_id=EOS))
    assert _traced(index, [1, 2, 3, 4, EOS, 5, 6, 7, 8], 2) == [(0, 4, 1, frozenset({0})), (5, 9, 1, frozenset({0}))]
