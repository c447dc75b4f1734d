"""Trace a token sequence back to the training documents: OLMoTrace's algorithm on an infini-gram index.

1. Split the query at EOS (a span never crosses it). In each piece find every *maximal* span of at least
   `min_span_tokens` tokens that occurs verbatim inside one training document: [l, r) where r = r(l) is the end
   of the longest prefix of query[l:] found in the index, and r(l) > r(l-1) (so neither [l-1, r) nor [l, r+1)
   occurs). Documents cannot be crossed: every document is preceded by the separator token, never a query token.
   The engine's `attribute` computes this (`enforce_bow=False`: word-boundary trimming needs per-tokenizer
   beginning-of-word ids, and a byte-level BPE's leading-space tokens would make span ends depend on the next
   word; spans are kept exact at token level instead). Its one miss (see engine.py: the rank-0 suffix) is
   detected per piece; such a piece is recomputed exactly with `count` calls (r(l) is monotone, so a two-pointer
   scan needs at most 2·len(piece) counts).
   A span occurring more than `max_count` times is dropped (infini-gram's `max_cnt`: the engine materializes
   every occurrence of a span, so this bounds the work; the recomputation keeps the same rule). Such a span just
   vanishes and nothing in the engine's answer tells it happened, so `truncated` cannot report it.
2. Score each span by its unigram log-probability sum (build-time counts summed over partitions, add-one
   smoothed) and, unless `span_density` is None or >= 1, keep the ⌈span_density · n_tokens⌉ lowest-scoring ones
   (the least likely under the unigram model, i.e. the most informative).
3. For each kept span, up to `max_documents` occurrences (in suffix-array order: partition, then the text that
   follows; `get_docs_by_ranks_2` on the ranks `find` gives, so both span paths share it) with the document's
   lineage and a snippet of ± `snippet_tokens` around the match, decoded as prefix + match + suffix so the match's
   char offsets are exact. `truncated` is True when some span has more occurrences than documents listed.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import tokenizers

from lmforge.trace.engine import TraceIndex


@dataclass
class TraceDocument:
    url: str | None
    record_id: str | None
    doc_id: str | None
    shard: str | None
    token_offset: int | None
    snippet: str | None
    match_start: int | None  # char offsets of the match inside snippet
    match_end: int | None


@dataclass
class TraceSpan:
    start: int
    end: int
    length: int
    count: int
    unigram_logprob: float
    text: str | None
    documents: list[TraceDocument] = field(default_factory=list)


@dataclass
class TraceResult:
    tokens: int
    spans: list[TraceSpan]
    truncated: bool
    index: dict

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "truncated": self.truncated, "index": dict(self.index),
                "spans": [asdict(span) for span in self.spans]}


def trace_tokens(index: TraceIndex, ids: Sequence[int], *, min_span_tokens: int = 8, max_documents: int = 10,
                 span_density: float | None = 0.05, max_count: int = 1000, snippet_tokens: int = 40,
                 decode: Callable[[list[int]], str] | None = None) -> TraceResult:
    ids = _checked_ids(index, ids)
    if min_span_tokens < 1 or max_documents < 0 or max_count < 1 or snippet_tokens < 0:
        raise ValueError(f"need min_span_tokens >= 1 ({min_span_tokens}), max_documents >= 0 ({max_documents}), "
                         f"max_count >= 1 ({max_count}), snippet_tokens >= 0 ({snippet_tokens})")
    if span_density is not None and span_density <= 0:
        raise ValueError(f"span_density must be positive or None, got {span_density}")
    found: list[tuple[int, int, tuple]] = []  # (start, end, segments by partition)
    if index.engine is not None:
        for offset, piece in _pieces(ids, index.eos_token_id, min_span_tokens):
            for left, r, segments in maximal_spans(index, piece, min_span_tokens, max_count):
                found.append((offset + left, offset + r, segments))
    scores = [float(index.unigram_logprobs[ids[left:r]].sum()) for left, r, _ in found]
    keep = range(len(found))
    if span_density is not None and span_density < 1:
        wanted = math.ceil(span_density * len(ids))
        keep = sorted(sorted(keep, key=lambda i: (scores[i], found[i][0]))[:wanted])
    spans, truncated = [], False
    for i in keep:
        left, r, segments = found[i]
        count = sum(end - start for start, end in segments)
        documents = _documents(index, segments, r - left, max_documents, snippet_tokens, decode)
        truncated |= len(documents) < count
        text = decode(ids[left:r]) if decode else None
        spans.append(TraceSpan(left, r, r - left, count, scores[i], text, documents))
    return TraceResult(tokens=len(ids), spans=spans, truncated=truncated, index=index.summary())


def trace_text(index: TraceIndex, tokenizer: tokenizers.Tokenizer, text: str, **kw) -> TraceResult:
    """Trace `text` as `tokenizer` encodes it (no special tokens added); snippets decoded by the same tokenizer."""
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    kw.setdefault("decode", lambda part: tokenizer.decode(part, skip_special_tokens=False))
    return trace_tokens(index, ids, **kw)


def maximal_spans(index: TraceIndex, piece: list[int], min_len: int, max_count: int) -> list[tuple[int, int, tuple]]:
    """Every maximal span [l, r) of `piece` (no EOS inside) with r - l >= min_len and 1 <= count <= max_count,
    with its suffix-array ranges per partition."""
    if _rank0_missed(index, piece, min_len):
        return _spans_by_counts(index, piece, min_len, max_count)
    result = index.engine.attribute(input_ids=piece, delim_ids=[], min_len=min_len, max_cnt=max_count,
                                    enforce_bow=False)
    if "error" in result:
        raise RuntimeError(f"trace engine refused the query: {result['error']}")
    return [(s["l"], s["r"], _segments(index, piece[s["l"]:s["r"]])) for s in result["spans"]]


def _spans_by_counts(index: TraceIndex, piece: list[int], min_len: int, max_count: int) -> list[tuple]:
    spans, r, last_r = [], 0, 0
    for left in range(len(piece)):
        r = max(r, left)
        while r < len(piece) and index.engine.count(piece[left:r + 1])["count"] > 0:
            r += 1
        if r - left >= min_len and r > last_r:
            segments = _segments(index, piece[left:r])
            if sum(end - start for start, end in segments) <= max_count:
                spans.append((left, r, segments))
                last_r = r
    return spans


def _rank0_missed(index: TraceIndex, piece: list[int], min_len: int) -> bool:
    """Whether the engine's prefix search would miss a match of >= min_len tokens with some partition's rank-0
    suffix: that happens at query position l exactly when query[l:] sorts (bytewise) before that suffix."""
    query = np.asarray(piece, dtype=np.int64)
    width = index.token_dtype.itemsize
    for rank0 in index.rank0:
        if rank0.size < min_len:
            continue
        head = np.asarray(rank0[:min_len]).astype(np.int64)
        for left in np.flatnonzero(query == head[0]):
            rest = query[left:]
            if rest.size < min_len or not np.array_equal(rest[:min_len], head):
                continue
            other = np.asarray(rank0[:rest.size]).astype(np.int64)
            differ = np.flatnonzero(rest[:other.size] != other)
            if differ.size == 0:
                continue  # query[l:] is a prefix of the suffix (found whole) or the suffix ends first (smaller)
            k = differ[0]
            if _byte_key(rest[k], width) < _byte_key(other[k], width):
                return True
    return False


def _byte_key(token: int, width: int) -> int:
    """A token's rank in the index's byte order (tokens are stored little-endian, compared bytewise)."""
    return int.from_bytes(int(token).to_bytes(width, "little"), "big")


def _segments(index: TraceIndex, span: list[int]) -> tuple:
    return tuple(tuple(segment) for segment in index.engine.find(span)["segment_by_shard"])


def _documents(index: TraceIndex, segments: tuple, length: int, max_documents: int, snippet_tokens: int,
               decode: Callable[[list[int]], str] | None) -> list[TraceDocument]:
    requests = []
    for s, (start, end) in enumerate(segments):
        for rank in range(start, min(end, start + max_documents - len(requests))):
            requests.append((s, rank, length, snippet_tokens))
    if not requests:
        return []
    results = index.engine.get_docs_by_ranks_2(requests)
    if isinstance(results, dict):
        raise RuntimeError(f"trace engine refused a document lookup: {results.get('error')}")
    documents = []
    for doc in results:
        meta = json.loads(doc["metadata"]) if doc["metadata"] else {}
        snippet = match_start = match_end = None
        if decode is not None:
            tokens = [int(t) for t in doc["token_ids"]]
            at = doc["needle_offset"]
            before, match, after = decode(tokens[:at]), decode(tokens[at:at + length]), decode(tokens[at + length:])
            snippet, match_start, match_end = before + match + after, len(before), len(before) + len(match)
        documents.append(TraceDocument(url=meta.get("url"), record_id=meta.get("record_id"),
                                       doc_id=meta.get("doc_id"), shard=meta.get("shard"),
                                       token_offset=meta.get("token_offset"), snippet=snippet,
                                       match_start=match_start, match_end=match_end))
    return documents


def _pieces(ids: list[int], eos: int, min_len: int) -> Iterator[tuple[int, list[int]]]:
    start = 0
    for end in [i for i, t in enumerate(ids) if t == eos] + [len(ids)]:
        if end - start >= min_len:
            yield start, ids[start:end]
        start = end + 1


def _checked_ids(index: TraceIndex, ids: Sequence[int]) -> list[int]:
    try:
        ids = [operator.index(t) for t in ids]
    except TypeError:
        raise ValueError("token ids must be integers") from None
    bad = next((t for t in ids if not 0 <= t < index.vocab_size), None)
    if bad is not None:
        raise ValueError(f"token id {bad} is outside the index's vocabulary (0..{index.vocab_size - 1})")
    return ids
