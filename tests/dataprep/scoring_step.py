"""A pipeline step that lives outside lmforge (a "module:Class" step type), for the report and
`sample` tests: it scores each document's share of distinct words and drops those below a threshold."""

from __future__ import annotations

from pydantic import Field

from lmforge.dataprep.step_base import BaseFilter
from lmforge.dataprep.step_registry import StepSettings


class DistinctWordsSettings(StepSettings):
    threshold: float = Field(0.5, ge=0, le=1, description="documents with a lower share of distinct words are dropped")


class DistinctWordsFilter(BaseFilter):
    type_name = "distinct_words"
    Settings = DistinctWordsSettings

    def __init__(self, settings: DistinctWordsSettings | None = None, name: str | None = None):
        super().__init__(name)
        self.settings = settings or DistinctWordsSettings()

    def filter(self, doc) -> tuple[bool, str | None]:
        words = doc.text.split()
        share = len(set(words)) / len(words) if words else 0.0
        self.record_score(doc, "distinct_words", share)
        return (True, None) if share >= self.settings.threshold else (False, "repetitive")
