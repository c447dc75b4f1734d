"""Contamination of an evaluation set: for each item, the longest span of it found verbatim in the training
data, and where.

Each item's text is tokenized with the index's tokenizer and traced with every maximal span
(span_density None) of at least `min_span_tokens` tokens. Per item the report gives the longest span (its
length in tokens and as a share of the item, its text, how often it occurs, up to `max_documents` source
documents) and the union of all spans (how much of the item occurs verbatim, in pieces). The summary counts
the items whose longest overlap reaches 13 tokens (about GPT-3's 13-gram decontamination rule, counted in
tokens here), 32 (the canary's memorization span) and 50, and those at least half covered by the union.
Spans occurring more often than `max_count` are left out by the engine (trace_tokens), so a boilerplate
phrase does not make every item look contaminated.

The report is a plain dict (JSON); lmforge.dataprep's `contamination-report` command writes it and its HTML page.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import tokenizers

from lmforge.common.spans import covered_tokens
from lmforge.trace.engine import TraceIndex
from lmforge.trace.query import trace_text

OVERLAP_THRESHOLDS = (13, 32, 50)  # tokens
HALF_COVERED = 0.5
TEXT_CHARS = 500  # an item's text as kept in the report
SNIPPET_TOKENS = 20


def _longest(result, tokens: int) -> dict | None:
    if not result.spans:
        return None
    span = max(result.spans, key=lambda s: (s.length, -s.start))  # the first of equally long ones
    return {"tokens": span.length, "share": span.length / tokens, "start": span.start, "end": span.end,
            "text": span.text, "count": span.count,
            "documents": [{"url": d.url, "record_id": d.record_id, "doc_id": d.doc_id, "snippet": d.snippet,
                           "match_start": d.match_start, "match_end": d.match_end} for d in span.documents]}


def item_report(index: TraceIndex, tokenizer: tokenizers.Tokenizer, item_id: str, text: str, *,
                min_span_tokens: int, max_documents: int, max_count: int) -> dict:
    result = trace_text(index, tokenizer, text, min_span_tokens=min_span_tokens, max_documents=max_documents,
                        span_density=None, max_count=max_count, snippet_tokens=SNIPPET_TOKENS)
    tokens = result.tokens
    covered = covered_tokens(((s.start, s.end) for s in result.spans), min_span_tokens)
    return {"id": item_id, "text": text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS] + "…",
            "tokens": tokens, "spans": len(result.spans), "covered_tokens": covered,
            "covered_share": covered / tokens if tokens else 0.0, "longest": _longest(result, tokens)}


def summarize(items: list[dict]) -> dict:
    longest = [item["longest"]["tokens"] if item["longest"] else 0 for item in items]
    return {"items": len(items),
            "overlap_at_least": {str(n): sum(length >= n for length in longest) for n in OVERLAP_THRESHOLDS},
            "half_covered": sum(item["covered_share"] >= HALF_COVERED for item in items),
            "longest_overlap": max(longest, default=0)}


def contamination_report(index: TraceIndex, tokenizer: tokenizers.Tokenizer, items: Iterable[Mapping[str, str]], *,
                         min_span_tokens: int = 8, max_documents: int = 3, max_count: int = 1000) -> dict:
    """The report of `items` ({"id", "text"} each) against `index`: {"summary", "items", "min_span_tokens",
    "index"}; see the module docstring."""
    reports = [item_report(index, tokenizer, str(item["id"]), item["text"], min_span_tokens=min_span_tokens,
                           max_documents=max_documents, max_count=max_count) for item in items]
    return {"min_span_tokens": min_span_tokens, "max_documents": max_documents, "max_count": max_count,
            "thresholds": list(OVERLAP_THRESHOLDS), "index": index.summary(), "summary": summarize(reports),
            "items": reports}
