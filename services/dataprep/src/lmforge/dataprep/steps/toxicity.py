"""Toxicity / NSFW word-list filter: the LDNOOBW lists ("List of Dirty, Naughty, Obscene, and
Otherwise Bad Words", CC-BY-4.0) per language, as C4 used them (Raffel et al. 2020, section 2.2).

The lists ship with lmforge (data/ldnoobw/<lang>.txt, from the npm package `naughty-words`
1.2.0; see data/ldnoobw/ATTRIBUTION.md). A model-based toxicity filter is the `classifier` step
(a fastText classifier with a toxicity label, threshold per label): put it in the pipeline
next to this one, or instead of it.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from pydantic import Field, field_validator

from lmforge.dataprep.document import Document
from lmforge.dataprep.step_base import BaseFilter
from lmforge.dataprep.step_registry import StepSettings

LIST_DIR = Path(__file__).resolve().parents[1] / "data" / "ldnoobw"
# entries C4's reference code (TFDS c4_utils) exempts: common subwords in languages without spaces
C4_ALLOWED = {"ja": ["sm", "グロ", "女の子"], "zh": ["性"]}
_WORD = re.compile(r"\w+")
# for ASCII text, one bytes.translate does what lower() + _WORD.findall do: letters lowercased,
# every other byte that is not a word character made a space, then split
_ASCII_WORDS = bytes(
    (c + 32 if 65 <= c <= 90 else c if (48 <= c <= 57 or 97 <= c <= 122 or c == 95) else 32) for c in range(256))


@cache
def shipped_languages() -> tuple[str, ...]:
    return tuple(sorted(path.stem for path in LIST_DIR.glob("*.txt")))


class ToxicityWordsSettings(StepSettings):
    languages: list[str] | None = Field(
        None, description="languages whose list applies (the LDNOOBW codes: en, de, fr, ja, zh, ...); null: all "
                          "shipped lists. A document of another language passes")
    default_language: str | None = Field(
        "en", description="the list for documents without doc.metadata['language'] (langid sets it); null: "
                          "such documents pass")
    max_matches: int | None = Field(
        None, ge=0, description="drop a document with more matches than this; 0 is C4's rule (any match drops "
                                "the page, C4 paper section 2.2); null turns it off")
    max_match_rate: float | None = Field(
        0.01, ge=0, description="drop a document with more matches per word than this; null turns it off. 0.01 (one "
                                "per 100 words) keeps pages that name a listed word in passing (health, news, "
                                "literature) and drops pages dense with them; C4's any-match rule removed many "
                                "benign pages (Dodge et al. 2021), data-juicer's flagged-word filter uses 0.045")
    substring_languages: list[str] = Field(
        default_factory=lambda: ["ja", "th", "zh"],
        description="languages written without spaces: entries match as substrings and the rate is per "
                    "non-space character (as C4's reference code matches ja, th and zh)")
    allowed_words: dict[str, list[str]] = Field(
        default_factory=lambda: {lang: list(words) for lang, words in C4_ALLOWED.items()},
        description="per language, list entries never counted (default: the exemptions of C4's reference code, "
                    "TFDS c4_utils: ja sm, グロ, 女の子; zh 性)")

    @field_validator("languages")
    @classmethod
    def _languages_shipped(cls, value: list[str] | None) -> list[str] | None:
        unknown = sorted(set(value or ()) - set(shipped_languages()))
        if unknown:
            raise ValueError(f"no LDNOOBW list for {', '.join(unknown)}; lists: {', '.join(shipped_languages())}")
        return value

    @field_validator("default_language")
    @classmethod
    def _default_shipped(cls, value: str | None) -> str | None:
        if value is not None and value not in shipped_languages():
            raise ValueError(f"no LDNOOBW list for {value}; lists: {', '.join(shipped_languages())}")
        return value


class _WordList:
    """One language's entries, matched as sequences of word tokens (\\w+ runs, lowercase), so
    "2 girls 1 cup" is four tokens and punctuation inside an entry is not required."""

    def __init__(self, entries: list[str]) -> None:
        self.single: frozenset[str] = frozenset(e[0] for e in map(_tokens, entries) if len(e) == 1)
        self.phrases: dict[str, list[tuple[str, ...]]] = {}
        for tokens in map(_tokens, entries):
            if len(tokens) > 1:
                self.phrases.setdefault(tokens[0], []).append(tuple(tokens))
        self.first_tokens = self.single | frozenset(self.phrases)

    def count(self, tokens: list[str]) -> int:
        hits = self.first_tokens.intersection(tokens)
        if not hits:
            return 0
        matches = 0
        for i, token in enumerate(tokens):
            if token not in hits:
                continue
            if token in self.single:
                matches += 1
                continue
            for phrase in self.phrases[token]:
                if tuple(tokens[i:i + len(phrase)]) == phrase:
                    matches += 1
                    break
        return matches


class _SubstringList:
    """Entries matched as substrings (each occurrence counts), for languages without spaces."""

    def __init__(self, entries: list[str]) -> None:
        self.entries = sorted({entry.lower() for entry in entries if entry.strip()})
        self.first_chars = frozenset(entry[0] for entry in self.entries)

    def count(self, text: str) -> int:
        present = self.first_chars.intersection(text)
        return sum(text.count(entry) for entry in self.entries if entry[0] in present) if present else 0


def _tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _read_list(lang: str) -> list[str]:
    return [line.strip() for line in (LIST_DIR / f"{lang}.txt").read_text(encoding="utf-8").splitlines()
            if line.strip()]


class ToxicityWordsFilter(BaseFilter):
    """Drops documents dense in listed words of their language. The language is
    doc.metadata["language"] (set by `langid`), else `default_language`. Matching is whole words
    and phrases, case-insensitive, for languages with spaces, and substrings for
    `substring_languages`. The rate (matches per word, or per non-space character) is recorded as
    the score `toxicity_word_rate`. Reasons: `toxic_word_count` (more than max_matches),
    `toxic_word_rate` (more than max_match_rate). Counters: `lang:<code>` per document checked,
    `no_list:<code>` per document passed for want of a list, `docs_with_matches`.

    Hook for a classifier: a fastText toxicity/NSFW model scores documents in the `classifier`
    step (any fastText model, a threshold per label, the score kept in the metadata); list it in
    the pipeline after or instead of `toxicity_words`.
    """

    type_name = "toxicity_words"
    Settings = ToxicityWordsSettings
    score_edges = {"toxicity_word_rate": (0.0, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 1.0)}

    def __init__(self, settings: ToxicityWordsSettings | None = None, name: str | None = None) -> None:
        super().__init__(name)
        self.settings = settings = settings or ToxicityWordsSettings()
        self._enabled = frozenset(settings.languages if settings.languages is not None else shipped_languages())
        self._lists: dict[str, _WordList | _SubstringList] = {}

    def _list_for(self, lang: str) -> _WordList | _SubstringList | None:
        found = self._lists.get(lang)
        if found is None and lang in self._enabled:
            allowed = {word.lower() for word in self.settings.allowed_words.get(lang, ())}
            entries = [entry for entry in _read_list(lang) if entry.lower() not in allowed]
            kind = _SubstringList if lang in self.settings.substring_languages else _WordList
            found = self._lists[lang] = kind(entries)
        return found

    def filter(self, doc: Document) -> tuple[bool, str | None]:
        cfg = self.settings
        lang = doc.metadata.get("language") or cfg.default_language
        word_list = self._list_for(lang) if lang else None
        if word_list is None:
            self.stats.counters[f"no_list:{lang}"] += 1
            return True, None
        self.stats.counters[f"lang:{lang}"] += 1
        text = doc.text
        if isinstance(word_list, _SubstringList):
            text = text.lower()
            matches = word_list.count(text)
            units = len(text) - sum(map(text.count, (" ", "\n", "\t", "\r", "\u3000")))
        else:
            tokens = text.encode().translate(_ASCII_WORDS).decode().split() if text.isascii() else _tokens(text)
            matches = word_list.count(tokens)
            units = len(tokens)
        rate = matches / units if units else 0.0
        self.record_score(doc, "toxicity_word_rate", rate)
        if not matches:
            return True, None
        self.stats.counters["docs_with_matches"] += 1
        if cfg.max_matches is not None and matches > cfg.max_matches:
            return False, "toxic_word_count"
        if cfg.max_match_rate is not None and rate > cfg.max_match_rate:
            return False, "toxic_word_rate"
        return True, None
