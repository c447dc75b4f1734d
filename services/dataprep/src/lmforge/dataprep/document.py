"""The unit that flows through the pipeline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

RECORD_BITS = 32


def make_doc_id(input_index: int, record_index: int) -> int:
    """A global, deterministic id: the input's position in the sorted input list, then the
    record's position in that input. Lower ids come first in input order, which makes
    "keep the lowest id" a deterministic choice of duplicate survivor."""
    return (input_index << RECORD_BITS) | record_index


def split_doc_id(doc_id: int) -> tuple[int, int]:
    return doc_id >> RECORD_BITS, doc_id & ((1 << RECORD_BITS) - 1)


def format_doc_id(doc_id: int) -> str:
    input_index, record_index = split_doc_id(doc_id)
    return f"{input_index:06d}-{record_index:08d}"


@dataclass(slots=True)
class Document:
    doc_id: int
    url: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return len(self.text.encode("utf-8"))
