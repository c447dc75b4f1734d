"""Composable pipeline steps, after datatrove's contract.

A step is `run(docs, rank, world_size) -> Iterator[Document]`. Filters implement
`filter(doc) -> (keep, reason)` and transforms `transform(doc) -> doc`; the base classes
count documents and bytes in and out, drops per reason and the step's own seconds, keep a
few kept and removed examples, and hand every dropped document to the reject sink (url,
stage, reason). A step that scores documents calls `record_score`: the score goes to the
document's metadata (and the docs Parquet) and to the step's histogram.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator

from lmforge.dataprep.document import Document
from lmforge.dataprep.stats import StepStats

RejectSink = Callable[[Document, str, str], None]  # (doc, stage, reason)


def _discard(doc: Document, stage: str, reason: str) -> None:
    return None


UNIT_EDGES = tuple(i / 20 for i in range(21))  # 0, 0.05, ..., 1: a probability's histogram bins


class PipelineStep(ABC):
    type_name: str = "step"
    # score name -> histogram bin edges, for scores that are not probabilities
    score_edges: dict[str, tuple[float, ...]] = {}

    def __init__(self, name: str | None = None) -> None:
        self.name = name or self.type_name  # the step's id in the pipeline: stats, rejects, report
        self.stats = StepStats(self.name)
        self.reject_sink: RejectSink = _discard

    @abstractmethod
    def run(self, docs: Iterable[Document], rank: int = 0, world_size: int = 1) -> Iterator[Document]: ...

    def drop(self, doc: Document, reason: str) -> None:
        self.stats.dropped[reason] += 1
        self.stats.add_example("removed", doc, reason)
        self.reject_sink(doc, self.name, reason)

    def record_score(self, doc: Document, key: str, value: float) -> None:
        """Keep `value` in doc.metadata["scores"][key] and count it in the step's histogram."""
        doc.metadata.setdefault("scores", {})[key] = value
        self.stats.add_score(key, value, self.score_edges.get(key, UNIT_EDGES))

    def __call__(self, docs: Iterable[Document], rank: int = 0, world_size: int = 1) -> Iterator[Document]:
        return self.run(docs, rank, world_size)


class BaseFilter(PipelineStep):
    """Keeps or drops each document; `filter` says which and why (and may edit the text of a
    document it keeps: bytes out count the edited text)."""

    @abstractmethod
    def filter(self, doc: Document) -> tuple[bool, str | None]: ...

    def run(self, docs: Iterable[Document], rank: int = 0, world_size: int = 1) -> Iterator[Document]:
        stats = self.stats
        for doc in docs:
            text = doc.text
            nbytes = doc.nbytes
            stats.docs_in += 1
            stats.bytes_in += nbytes
            start = time.perf_counter()
            keep, reason = self.filter(doc)
            stats.seconds += time.perf_counter() - start
            if keep:
                stats.docs_out += 1
                stats.bytes_out += nbytes if doc.text is text else doc.nbytes  # a filter may edit the text (c4_quality)
                stats.add_example("kept", doc)
                yield doc
            else:
                self.drop(doc, reason or "dropped")


class BaseTransform(PipelineStep):
    """Rewrites each document (never drops)."""

    @abstractmethod
    def transform(self, doc: Document) -> Document: ...

    def run(self, docs: Iterable[Document], rank: int = 0, world_size: int = 1) -> Iterator[Document]:
        stats = self.stats
        for doc in docs:
            stats.docs_in += 1
            stats.bytes_in += doc.nbytes
            start = time.perf_counter()
            doc = self.transform(doc)
            stats.seconds += time.perf_counter() - start
            stats.docs_out += 1
            stats.bytes_out += doc.nbytes
            stats.add_example("kept", doc)
            yield doc


def chain(steps: list[PipelineStep], docs: Iterable[Document], rank: int = 0,
          world_size: int = 1) -> Iterator[Document]:
    """Compose steps lazily: each document flows through all of them before the next is read."""
    stream: Iterable[Document] = docs
    for step in steps:
        stream = step.run(stream, rank, world_size)
    return iter(stream)
