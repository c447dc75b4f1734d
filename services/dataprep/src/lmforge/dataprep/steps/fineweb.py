"""FineWeb's custom quality filters (Penedo et al. 2024, "The FineWeb Datasets", section 3.3;
datatrove's FineWebQualityFilter, which built FineWeb).

Definitions, on the document's non-blank lines (split on "\\n"; datatrove's current code also
leaves blank lines out):
- line punctuation ratio: share of lines ending in terminal punctuation;
- short line ratio: share of lines of at most `short_line_length` characters;
- duplicated-line character ratio: characters of every repeat of a line already seen (the
  first occurrence is not counted), over the characters of the text without its newlines;
- newline ratio: newlines per word (list-like documents have few words per line). Words are
  whitespace-separated tokens; datatrove counts word-tokenizer tokens, punctuation apart, so
  its ratio is a little lower on the same text.
"""

from __future__ import annotations

from itertools import repeat

from pydantic import Field

from lmforge.dataprep.document import Document
from lmforge.dataprep.step_base import BaseFilter
from lmforge.dataprep.step_registry import StepSettings


class FineWebQualitySettings(StepSettings):
    line_punct_thr: float | None = Field(
        0.12, ge=0, le=1,
        description="drop if the share of lines ending in terminal punctuation is ≤ this; null turns the rule off "
                    "(source: FineWeb paper section 3.3, datatrove FineWebQualityFilter line_punct_thr=0.12)")
    line_punct_exclude_zero: bool = Field(
        False, description="keep documents with no line ending in punctuation (datatrove's line_punct_exclude_zero)")
    terminal_punctuation: list[str] = Field(
        default_factory=lambda: [".", "'", '"', "!", "?"],
        description="line endings that count as terminal punctuation (the stop characters FineWeb was built with; "
                    "add e.g. '。' for other scripts)")
    short_line_thr: float | None = Field(
        0.67, ge=0, le=1,
        description="drop if the share of lines of at most short_line_length characters is ≥ this; null turns "
                    "the rule off (source: FineWeb paper section 3.3, datatrove short_line_thr=0.67)")
    short_line_length: int = Field(
        30, ge=0, description="a line this long or shorter is short (source: FineWeb paper, datatrove: 30)")
    char_duplicates_ratio: float | None = Field(
        0.01, ge=0, le=1,
        description="drop if characters in repeated lines over all characters are ≥ this; null turns the rule off "
                    "(source: datatrove FineWebQualityFilter default 0.01, the code FineWeb was built with; the "
                    "paper's text gives 0.1)")
    new_line_ratio: float | None = Field(
        0.3, ge=0,
        description="drop list-like documents with more than this many newlines per word; null turns the rule off "
                    "(source: datatrove FineWebQualityFilter new_line_ratio=0.3)")


class FineWebQualityFilter(BaseFilter):
    """Drops documents on FineWeb's line rules; the first rule that trips is the reason:
    `empty` (no non-blank line), `line_punct_ratio`, `short_line_ratio`, `char_dup_ratio`,
    `list_ratio` (datatrove's reason names). Each rule is off when its threshold is null.
    """

    type_name = "fineweb_quality"
    Settings = FineWebQualitySettings

    def __init__(self, settings: FineWebQualitySettings | None = None, name: str | None = None) -> None:
        super().__init__(name)
        self.settings = settings or FineWebQualitySettings()
        self._stop_chars = tuple(self.settings.terminal_punctuation)

    def filter(self, doc: Document) -> tuple[bool, str | None]:
        cfg = self.settings
        text = doc.text
        lines = [line for line in text.split("\n") if line and not line.isspace()]
        n_lines = len(lines)
        if not n_lines:
            return False, "empty"

        if cfg.line_punct_thr is not None:
            ratio = sum(map(str.endswith, lines, repeat(self._stop_chars, n_lines))) / n_lines
            if ratio <= cfg.line_punct_thr and not (ratio == 0 and cfg.line_punct_exclude_zero):
                return False, "line_punct_ratio"

        if cfg.short_line_thr is not None:
            max_length = cfg.short_line_length
            if sum(1 for line in lines if len(line) <= max_length) / n_lines >= cfg.short_line_thr:
                return False, "short_line_ratio"

        if cfg.char_duplicates_ratio is not None:
            unique = set(lines)
            if len(unique) < n_lines:  # some line repeats: count the characters of every repeat
                dup_chars = sum(map(len, lines)) - sum(map(len, unique))
                if dup_chars / max(len(text) - text.count("\n"), 1) >= cfg.char_duplicates_ratio:
                    return False, "char_dup_ratio"

        if cfg.new_line_ratio is not None:
            n_words = len(text.split())
            if text.count("\n") > cfg.new_line_ratio * n_words:
                return False, "list_ratio"
        return True, None
