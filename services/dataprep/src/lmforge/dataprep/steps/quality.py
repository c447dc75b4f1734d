"""Gopher quality and repetition filters (Rae et al. 2021, Appendix A, Table A1).

Both run on every document of a crawl, so each splits the text into words once, works on
whole-text C-level operations (str.count, compiled regexes, set and Counter construction)
rather than per-character Python loops, and checks the cheap rules first.

Words are whitespace-separated tokens, punctuation attached ("end." is one word), except in
the languages written without spaces (Chinese, Japanese), where each CJK character is a word:
the document's language (doc.metadata["language"], from the langid step) picks the word
splitting and the quality rules' per-language defaults (steps/languages.py).
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from itertools import compress, islice
from operator import ne

from pydantic import Field, model_validator

from lmforge.common.config import StrictModel
from lmforge.common.errors import ConfigError
from lmforge.dataprep.document import Document
from lmforge.dataprep.step_base import BaseFilter
from lmforge.dataprep.step_registry import StepSettings
from lmforge.dataprep.steps.languages import LANGUAGE_DEFAULTS, WordSplit, default_word_split, split_words

_PER_LANGUAGE_FIELDS = ("word_split", "min_doc_words", "max_doc_words", "min_avg_word_length",
                        "max_avg_word_length", "min_alpha_words_ratio", "min_stop_words", "min_stop_word_ratio",
                        "stop_words")


class GopherLanguageRules(StrictModel):
    """The quality rules of one language; a field left out keeps the language's built-in default
    (steps/languages.py) or else the filter's own setting."""

    word_split: WordSplit | None = Field(
        None, description="whitespace: whitespace-separated words; cjk_chars: each CJK character is a word")
    min_doc_words: int | None = Field(None, ge=0)
    max_doc_words: int | None = Field(None, ge=1)
    min_avg_word_length: float | None = Field(None, ge=0)
    max_avg_word_length: float | None = Field(None, ge=0)
    min_alpha_words_ratio: float | None = Field(None, ge=0, le=1)
    min_stop_words: int | None = Field(None, ge=0)
    min_stop_word_ratio: float | None = Field(None, ge=0, le=1)
    stop_words: list[str] | None = None


class GopherQualityConfig(StepSettings):
    min_doc_words: int = Field(50, ge=0)
    max_doc_words: int = Field(100_000, ge=1)
    min_avg_word_length: float = Field(3.0, ge=0)
    max_avg_word_length: float = Field(10.0, ge=0)
    max_symbol_word_ratio: float = Field(0.1, ge=0, description="'#' and ellipses per word")
    max_bullet_lines_ratio: float = Field(0.9, ge=0, le=1)
    max_ellipsis_lines_ratio: float = Field(0.3, ge=0, le=1)
    min_alpha_words_ratio: float = Field(0.8, ge=0, le=1, description="share of words with an alphabetic character")
    min_stop_words: int = Field(2, ge=0)
    min_stop_word_ratio: float = Field(
        0.0, ge=0, le=1,
        description="stop-word occurrences per word, at least (0 = off, as in the paper; zh and ja count stop "
                    "words inside character runs, where a density tells prose from menus)")
    stop_words: list[str] = Field(default_factory=lambda: ["the", "be", "to", "of", "and", "that", "have", "with"])
    word_split: WordSplit = Field(
        "whitespace", description="word splitting of the languages without rules of their own (steps/languages.py)")
    per_language: dict[str, GopherLanguageRules] = Field(
        default_factory=dict,
        description="rules of a language (lid.176 label, e.g. zh), over its built-in defaults (de, fr, es, it, pt, "
                    "nl, ru: stop words; zh, ja: CJK characters as words, stop words and word bounds: the table in "
                    "steps/languages.py; after FineWeb-2's per-language Gopher rules); the settings above are the "
                    "paper's English rules and apply to every language without rules")

    @model_validator(mode="after")
    def _ranges(self) -> GopherQualityConfig:
        for language in (None, *sorted(set(LANGUAGE_DEFAULTS) | set(self.per_language))):
            rules = self.for_language(language) if language else self
            where = f"per_language.{language}: " if language else ""
            if rules.min_doc_words > rules.max_doc_words:
                raise ValueError(f"{where}min_doc_words must not exceed max_doc_words")
            if rules.min_avg_word_length > rules.max_avg_word_length:
                raise ValueError(f"{where}min_avg_word_length must not exceed max_avg_word_length")
        return self

    def for_language(self, language: str | None) -> GopherQualityConfig:
        """These settings with the built-in defaults and then `per_language` of `language` applied."""
        update = dict(LANGUAGE_DEFAULTS.get(language or "", {}))
        if language in self.per_language:
            update.update(self.per_language[language].model_dump(exclude_none=True))
        if not update:
            return self
        return self.model_copy(update={key: update[key] for key in _PER_LANGUAGE_FIELDS if key in update})


class GopherRepetitionConfig(StepSettings):
    max_dup_line_ratio: float = Field(0.30, ge=0, le=1)
    max_dup_para_ratio: float = Field(0.30, ge=0, le=1)
    max_dup_line_char_ratio: float = Field(0.20, ge=0, le=1)
    max_dup_para_char_ratio: float = Field(0.20, ge=0, le=1)
    # n -> max share of characters covered by the most frequent n-gram
    top_ngram_max_char_ratio: dict[int, float] = Field(default_factory=lambda: {2: 0.20, 3: 0.18, 4: 0.16})
    # n -> max share of characters covered by duplicated n-grams
    dup_ngram_max_char_ratio: dict[int, float] = Field(
        default_factory=lambda: {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}
    )
    word_split: dict[str, WordSplit] = Field(
        default_factory=dict,
        description="word splitting of the n-gram rules per language (lid.176 label), over the built-in "
                    "(zh, ja: each CJK character is a word; any other: whitespace), as the quality filter's")
    cjk_chars_per_word: int = Field(
        2, ge=1,
        description="where words are CJK characters, an n-gram of the n-gram rules spans n x this many characters "
                    "(a Chinese or Japanese word is about two characters; measured on Japanese man pages, n-grams "
                    "of single characters dropped 36% on dup_5gram_char_ratio, against 3% of English man pages)")


# a whitespace-delimited token without a letter ("2024", "-", "|", "$5"), in text padded with spaces
_NON_ALPHA_TOKEN = re.compile(r"\s((?:[^\w\s]|[\d_])+)(?=\s)")
_WORD_CHAR = re.compile(r"\w")
_NOT_ALPHA_WORD = re.compile(r"(?:[^\w]|[\d_])+")  # a token without a letter
_BULLETS = ("•", "‣", "○", "◦", "●", "▪", "■", "□", "►", "▶", "➢", "➤", "⁃", "∙", "·", "-", "–", "—", "*")
_ELLIPSES = ("...", "…")
_WORD_EDGE_CHARS = string.punctuation + "“”‘’«»„…–—"
_BLANK_LINES = re.compile(r"\n[ \t\r\f\v]*\n\s*")
# _AT_LEAST[c] maps a byte to 1 when it is >= c, else 0 (for bytes.translate)
_AT_LEAST = [bytes(int(value >= threshold) for value in range(256)) for threshold in range(256)]


def _shape_reason(cfg: GopherQualityConfig, text: str, n_words: int, word_chars: int) -> str | None:
    """The rules on words, symbols and lines, whatever the language's word splitting: the reason
    to drop, or None."""
    if n_words < cfg.min_doc_words or n_words == 0:
        return "too_few_words"
    if n_words > cfg.max_doc_words:
        return "too_many_words"
    avg_word_length = word_chars / n_words
    if avg_word_length < cfg.min_avg_word_length:
        return "avg_word_length_too_short"
    if avg_word_length > cfg.max_avg_word_length:
        return "avg_word_length_too_long"
    n_ellipses = text.count("...") + text.count("…")
    max_symbols = cfg.max_symbol_word_ratio * n_words
    if text.count("#") > max_symbols or n_ellipses > max_symbols:
        return "too_many_symbols"
    lines = [line for line in map(str.strip, text.splitlines()) if line]
    n_lines = len(lines)
    if sum(1 for line in lines if line.startswith(_BULLETS)) > cfg.max_bullet_lines_ratio * n_lines:
        return "too_many_bullet_lines"
    if n_ellipses and sum(1 for line in lines if line.endswith(_ELLIPSES)) > cfg.max_ellipsis_lines_ratio * n_lines:
        return "too_many_ellipsis_lines"
    return None


class GopherQualityFilter(BaseFilter):
    """Drops documents that do not look like natural-language prose.

    Rules, in the order checked (the first failure is the reason):
    - `too_few_words` / `too_many_words`: words outside [min_doc_words, max_doc_words];
      tokens made only of symbols ("-", "•", "|") are not words;
    - `avg_word_length_too_short` / `_too_long`: mean word length outside the range;
    - `too_many_symbols`: '#' per word, or ellipses ("..." and "…") per word, above
      max_symbol_word_ratio (the paper applies the ratio to each symbol separately);
    - `too_many_bullet_lines`: share of non-blank lines that start with a bullet;
    - `too_many_ellipsis_lines`: share of non-blank lines that end with an ellipsis;
    - `too_few_alpha_words`: share of words (whitespace-separated tokens) holding an
      alphabetic character: the paper's "80% of words in a document contain at least one
      alphabetic character". datatrove divides by spaCy tokens, every punctuation mark one,
      and drops most documentation pages on this rule (docs/benchmarks.md);
    - `too_few_stop_words`: occurrences of stop words (case-insensitive, surrounding
      punctuation ignored) below min_stop_words, or below min_stop_word_ratio per word.

    Per language (doc.metadata["language"], set by the langid step): the settings are the
    paper's English rules, overridden for a language by its built-in defaults
    (steps/languages.py: stop words of de, fr, es, it, pt, nl, ru; for zh and ja each CJK
    character is a word, with word bounds to match) and then by `per_language.<lang>`; a
    document of another language, or with no language, gets the settings as they are. With
    CJK characters as words, punctuation marks are not words, the alphabetic-word share is
    over words, and stop words are counted as substrings of the text.
    """

    type_name = "gopher_quality"
    Settings = GopherQualityConfig

    def __init__(self, config: GopherQualityConfig | None = None, name: str | None = None) -> None:
        super().__init__(name)
        self.config = config or GopherQualityConfig()
        self._default_rules = _LanguageRules(self.config)
        self._rules = {language: _LanguageRules(self.config.for_language(language))
                       for language in set(LANGUAGE_DEFAULTS) | set(self.config.per_language)}

    def filter(self, doc: Document) -> tuple[bool, str | None]:
        rules = self._rules.get(doc.metadata.get("language"), self._default_rules)
        if rules.config.word_split == "whitespace":
            return self._filter_whitespace_words(doc.text, rules)
        return self._filter_cjk_chars(doc.text, rules)

    def _filter_whitespace_words(self, text: str, rules: _LanguageRules) -> tuple[bool, str | None]:
        cfg = rules.config
        tokens = text.split()
        n_tokens = len(tokens)
        # tokens without a letter are rare in prose: one regex pass finds them, and the
        # symbol-only ones (no letter nor digit) are picked out of that short list
        non_alpha_tokens = _NON_ALPHA_TOKEN.findall(f" {text} ") if n_tokens else []
        symbol_tokens = [token for token in non_alpha_tokens if not _WORD_CHAR.search(token)]
        n_words = n_tokens - len(symbol_tokens)

        word_chars = (sum(map(len, tokens)) - sum(map(len, symbol_tokens))) if n_words > 0 else 0
        reason = _shape_reason(cfg, text, n_words, word_chars)
        if reason:
            return False, reason

        if n_tokens - len(non_alpha_tokens) < cfg.min_alpha_words_ratio * n_tokens:
            return False, "too_few_alpha_words"

        if not rules.has_stop_words(tokens, max(cfg.min_stop_words, math.ceil(cfg.min_stop_word_ratio * n_words))):
            return False, "too_few_stop_words"
        return True, None

    def _filter_cjk_chars(self, text: str, rules: _LanguageRules) -> tuple[bool, str | None]:
        """The same rules with each CJK character a word; punctuation marks ("，", "。") are tokens
        of their own, not words, so the alphabetic-word share is over words, not tokens."""
        cfg = rules.config
        words = [token for token in split_words(text, "cjk_chars") if _WORD_CHAR.search(token)]
        n_words = len(words)
        reason = _shape_reason(cfg, text, n_words, sum(map(len, words)))
        if reason:
            return False, reason
        if sum(1 for word in words if _NOT_ALPHA_WORD.fullmatch(word)) > (1 - cfg.min_alpha_words_ratio) * n_words:
            return False, "too_few_alpha_words"
        if sum(map(text.count, rules.stop_words)) < max(cfg.min_stop_words, cfg.min_stop_word_ratio * n_words):
            return False, "too_few_stop_words"
        return True, None


class _LanguageRules:
    """One language's quality settings and its stop-word sets."""

    def __init__(self, config: GopherQualityConfig) -> None:
        self.config = config
        self.stop_words = frozenset(word.lower() for word in config.stop_words)
        # exact tokens that certainly are stop words: matching them is a cheap lower bound on the count
        self._stop_word_forms = frozenset(
            form for word in self.stop_words for form in (word, word.capitalize(), word.upper())
        )

    def has_stop_words(self, tokens: list[str], need: int) -> bool:
        if need <= 0:
            return True
        # the exact forms ("the", "The") settle almost every prose document within its first sentences
        if next(islice(filter(self._stop_word_forms.__contains__, tokens), need - 1, None), None) is not None:
            return True
        stop_words = self.stop_words
        return sum(1 for token in tokens if token.strip(_WORD_EDGE_CHARS).lower() in stop_words) >= need


class GopherRepetitionFilter(BaseFilter):
    """Drops documents with too much repeated content.

    Lines are the non-blank lines, paragraphs the blocks between blank lines (both
    stripped); words are whitespace-separated tokens (in zh and ja, CJK characters: the
    quality filter's word splitting, steps/languages.py), n-grams runs of n words. A duplicate
    is an element equal to an earlier one: the first occurrence of a repeated line,
    paragraph or n-gram is not a duplicate, its repeats are. Every character ratio is over
    the document's characters (`len(text)`); an n-gram's characters are its words'.
    - `dup_line_ratio` / `dup_para_ratio`: duplicates over lines (paragraphs);
    - `dup_line_char_ratio` / `dup_para_char_ratio`: the duplicates' characters;
    - `top_<n>gram_char_ratio`: occurrences x characters of the most frequent n-gram, if it
      occurs more than once (ties: the longest);
    - `dup_<n>gram_char_ratio`: characters of the words inside duplicate n-grams, each word
      counted once however many duplicate n-grams overlap it (the paper: "taking care not to
      count characters that occur in overlapping n-grams more than once").

    Where this differs from datatrove's GopherRepetitionFilter, see docs/benchmarks.md.
    """

    type_name = "gopher_repetition"
    Settings = GopherRepetitionConfig

    def __init__(self, config: GopherRepetitionConfig | None = None, name: str | None = None) -> None:
        super().__init__(name)
        self.config = config or GopherRepetitionConfig()
        self._top_ngram_limits = sorted(self.config.top_ngram_max_char_ratio.items())
        self._dup_ngram_limits = sorted(self.config.dup_ngram_max_char_ratio.items())
        bad = [n for n, _ in self._top_ngram_limits + self._dup_ngram_limits if n < 1]
        if bad:
            raise ConfigError(f"repetition n-gram sizes must be at least 1, got {bad}")
        self._word_split = self.config.word_split
        # (n-gram size in words, max ratio, the n its reason names), per word splitting: in CJK text an
        # n-gram of n words is one of n x cjk_chars_per_word characters
        self._limits = {
            word_split: ([(n * scale, r, n) for n, r in self._top_ngram_limits],
                         [(n * scale, r, n) for n, r in self._dup_ngram_limits])
            for word_split, scale in (("whitespace", 1), ("cjk_chars", self.config.cjk_chars_per_word))
        }

    def filter(self, doc: Document) -> tuple[bool, str | None]:
        cfg = self.config
        text = doc.text
        lines = [line for line in map(str.strip, text.splitlines()) if line]
        if not lines:
            return True, None
        total_chars = len(text)
        dup_lines, dup_line_chars = _duplicates(lines)
        if dup_lines > cfg.max_dup_line_ratio * len(lines):
            return False, "dup_line_ratio"
        paragraphs = [paragraph for paragraph in map(str.strip, _BLANK_LINES.split(text)) if paragraph]
        dup_paras, dup_para_chars = _duplicates(paragraphs)
        if dup_paras > cfg.max_dup_para_ratio * len(paragraphs):
            return False, "dup_para_ratio"
        if dup_line_chars > cfg.max_dup_line_char_ratio * total_chars:
            return False, "dup_line_char_ratio"
        if dup_para_chars > cfg.max_dup_para_char_ratio * total_chars:
            return False, "dup_para_char_ratio"
        language = doc.metadata.get("language")
        word_split = self._word_split.get(language) or default_word_split(language)
        top_limits, dup_limits = self._limits[word_split]
        return self._check_ngrams(split_words(text, word_split), total_chars, top_limits, dup_limits)

    @staticmethod
    def _check_ngrams(words: list[str], total_chars: int, top_limits: list[tuple[int, float, int]],
                      dup_limits: list[tuple[int, float, int]]) -> tuple[bool, str | None]:
        if len(words) < 2:
            return True, None
        grams = _NgramIndex(words)
        if not grams.any_pair_repeats and not any(n == 1 for n, _, _ in top_limits + dup_limits):
            return True, None  # no repeated pair, so no repeated n-gram of any size n >= 2
        word_lengths = list(map(len, words))

        if top_limits:
            longest_word = max(word_lengths)
            for n, max_ratio, label in top_limits:
                limit = max_ratio * total_chars
                # occurrences x characters > limit needs more than limit / (n x the longest word) occurrences
                min_count = max(2, int(limit / (n * longest_word)) + 1)
                if grams.top_chars(n, min_count) > limit:
                    return False, f"top_{label}gram_char_ratio"

        for n, max_ratio, label in dup_limits:
            starts = grams.duplicate_starts(n)
            if not starts:
                break  # no n-gram repeats, so no longer one does either
            if _covered_chars(word_lengths, starts, n) > max_ratio * total_chars:
                return False, f"dup_{label}gram_char_ratio"
        return True, None


def _duplicates(items: list[str]) -> tuple[int, int]:
    """(number of items equal to an earlier item, their total characters)."""
    unique = set(items)
    return len(items) - len(unique), sum(map(len, items)) - sum(map(len, unique))


class _NgramIndex:
    """Counts of word n-grams without counting every n-gram of every size.

    Every word pair inside an n-gram occurs at least as often as the n-gram, so an
    n-gram can occur `c` times only where the n-1 pairs starting at its position each occur
    at least `c` times. One Counter over the pairs, then per size only the few positions
    that pass that test are turned into tuples and counted.
    """

    def __init__(self, words: list[str]) -> None:
        self.words = words
        pairs = list(zip(words, words[1:]))
        pair_counts = Counter(pairs)
        self.any_pair_repeats = len(pair_counts) < len(pairs)
        self._pair_count_at = list(map(pair_counts.__getitem__, pairs))
        # the same counts, capped at 255, one byte per position: a threshold is then one translate()
        try:
            self._pair_count_bytes = bytes(self._pair_count_at)
        except ValueError:
            self._pair_count_bytes = bytes(min(count, 255) for count in self._pair_count_at)

    def candidate_starts(self, n: int, min_count: int) -> list[int] | range:
        """Positions where an n-gram occurring at least `min_count` times may start."""
        if n == 1:
            return range(len(self.words))
        n_starts = len(self._pair_count_at) - (n - 2)
        if n_starts <= 0:
            return []
        if min_count <= 255:
            flags = self._pair_count_bytes.translate(_AT_LEAST[min_count])
        else:
            flags = bytes(count >= min_count for count in self._pair_count_at)
        # one byte per position in a big int: AND-ing shifted copies tests n-1 pairs at once
        mask = int.from_bytes(flags, "little")
        run = mask
        for shift in range(1, n - 1):
            run &= mask >> (8 * shift)
        if not run:
            return []
        return list(compress(range(n_starts), run.to_bytes(len(flags), "little")))

    def counted(self, n: int, min_count: int) -> tuple[list[int] | range, list[tuple[str, ...]], Counter]:
        starts = self.candidate_starts(n, min_count)
        words = self.words
        grams = [tuple(words[i : i + n]) for i in starts]
        return starts, grams, Counter(grams)

    def top_chars(self, n: int, min_count: int) -> int:
        """Occurrences x characters of the most frequent n-gram when it occurs at least
        `min_count` times (ties: the longest), else 0."""
        _, _, counts = self.counted(n, min_count)
        if not counts:
            return 0
        top = max(counts.values())
        if top < min_count:
            return 0
        top_grams = compress(counts.keys(), map(top.__eq__, counts.values()))
        return top * max(sum(map(len, gram)) for gram in top_grams)

    def duplicate_starts(self, n: int) -> list[int]:
        """Start positions of the n-gram occurrences that repeat an earlier occurrence."""
        starts = self.candidate_starts(n, 2)
        words = self.words
        grams = [tuple(words[i : i + n]) for i in starts]
        # each n-gram's first start: the dict keeps the last value written, so write in reverse
        first = dict(zip(reversed(grams), reversed(starts)))
        if len(first) == len(grams):
            return []
        return list(compress(starts, map(ne, map(first.__getitem__, grams), starts)))


def _covered_chars(word_lengths: list[int], starts: list[int], n: int) -> int:
    covered = bytearray(len(word_lengths))
    span = b"\x01" * n
    for start in starts:
        covered[start : start + n] = span
    return sum(compress(word_lengths, covered))
