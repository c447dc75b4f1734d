"""Brute-force reference for the span search (tests and the benchmark): every maximal span of a query that
occurs verbatim inside one document, with its exact occurrence count and the documents holding it.

For each document a dynamic programme gives match[i, j] = the length of the common run of query[i:] and
document[j:] (match[i, j] = match[i+1, j+1] + 1 where the tokens agree). r(l) = l + the longest run from l over all
documents; [l, r(l)) is maximal when r(l) > r(l-1). No suffix array, no byte order, no separators: an independent
check of the engine. Quadratic (query × corpus) memory per document: small corpora only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BruteSpan:
    start: int
    end: int
    count: int
    documents: frozenset[int]  # indices into the docs list


def maximal_spans(docs: Sequence[Sequence[int]], query: Sequence[int], min_len: int,
                  eos_token_id: int | None = None) -> list[BruteSpan]:
    """Every maximal span of `query` (split at `eos_token_id` when given) of at least `min_len` tokens."""
    query = np.asarray(query, dtype=np.int64)
    spans: list[BruteSpan] = []
    cuts = [-1] + ([int(i) for i in np.flatnonzero(query == eos_token_id)] if eos_token_id is not None else [])
    for start, end in zip([c + 1 for c in cuts], cuts[1:] + [query.size]):
        spans += [BruteSpan(s.start + start, s.end + start, s.count, s.documents)
                  for s in _piece_spans(docs, query[start:end], min_len)]
    return spans


def _piece_spans(docs: Sequence[Sequence[int]], query: np.ndarray, min_len: int) -> list[BruteSpan]:
    n = query.size
    if n == 0:
        return []
    runs = [_match_runs(query, np.asarray(doc, dtype=np.int64)) for doc in docs]
    longest = np.zeros(n, dtype=np.int64)
    for run in runs:
        if run.size:
            longest = np.maximum(longest, run.max(axis=1))
    ends = np.arange(n) + longest
    spans = []
    for left in range(n):
        r = int(ends[left])
        if r - left >= min_len and (left == 0 or r > ends[left - 1]):
            count, holders = 0, set()
            for d, run in enumerate(runs):
                hits = int((run[left] >= r - left).sum()) if run.size else 0
                if hits:
                    count += hits
                    holders.add(d)
            spans.append(BruteSpan(left, r, count, frozenset(holders)))
    return spans


def _match_runs(query: np.ndarray, doc: np.ndarray) -> np.ndarray:
    """runs[i, j] = length of the common prefix of query[i:] and doc[j:]."""
    runs = np.zeros((query.size + 1, doc.size + 1), dtype=np.int64)
    for i in range(query.size - 1, -1, -1):
        runs[i, :-1] = np.where(doc == query[i], runs[i + 1, 1:] + 1, 0)
    return runs[:-1, :-1]
