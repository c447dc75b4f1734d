"""Per-language word splitting and Gopher-rule defaults (stop words, word-count and word-length bounds).

Two ways to split words:
- `whitespace`: whitespace-separated tokens, punctuation attached ("end." is one word), as the
  Gopher paper counts English words; used for every language written with spaces;
- `cjk_chars`: for Chinese and Japanese, written without spaces, every character of a CJK
  script (Han ideographs, hiragana, katakana) is one word, every run of other non-space
  characters is one token ("git", "size_t", "，", "2024"). A segmenter would give real words,
  at the price of a dictionary dependency per language and, for jieba and fugashi+unidic, 10-30x
  the CPU (rjieba is about as fast, for Chinese only; docs/benchmarks.md); counting characters
  needs neither, and the thresholds below are set for it (word counts are character counts).

The built-in defaults (LANGUAGE_DEFAULTS) override the Gopher quality filter's own settings
(the paper's English rules) for the documents of their language (doc.metadata["language"],
set by the langid step); `steps.gopher_quality.per_language.<lang>` overrides both; a language
without an entry (or a document without a language) gets the filter's own settings. The
stop-word lists are the most frequent function words of each language, written for lmforge
(the Gopher paper gives only the English list; datatrove and FineWeb-2 also use per-language
lists with a minimum of 2 occurrences).

| language | words | words per doc | mean word length | stop words (at least) |
|---|---|---|---|---|
| en, and any language not below | whitespace | 50 – 100,000 | 3 – 10 | 2 of the, be, to, of, and, that, have, with |
| de fr es it pt nl ru | whitespace | 50 – 100,000 | 3 – 10 | 2 of the language's 20 below |
| zh ja | CJK characters | 100 – 200,000 | 1 – 4 | 2, and 3 (zh) or 5 (ja) per 100 words, of the 20 below (substrings) |

Why the zh/ja bounds (measured on real documentation, bench/debian_docs.py; docs/benchmarks.md):
Chinese and Japanese prose runs at 10-30 stop-word occurrences per 100 characters, navigation
menus at under 3 (single-character function words also occur inside compounds: 在线, 所有),
hence a density; 99% of the Chinese (Japanese) man pages have a mean word length under 4.4
(3.6): their Latin option names and commands lengthen it. The repetition filter splits words
the same way and takes an n-gram of n words as 2n characters (cjk_chars_per_word).
"""

from __future__ import annotations

import re
from typing import Literal

WordSplit = Literal["whitespace", "cjk_chars"]

# Han ideographs (with extension A and the compatibility block), hiragana, katakana (with the
# phonetic extension and half-width forms), and the iteration marks 々 〆 〇
_CJK = "\u3005-\u3007\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
_CJK_TOKEN = re.compile(rf"[{_CJK}]|[^\s{_CJK}]+")


def split_words(text: str, word_split: WordSplit) -> list[str]:
    """The words of `text` (see the module docstring)."""
    if word_split == "whitespace":
        return text.split()
    return _CJK_TOKEN.findall(text)


# Rules of the CJK languages, whose words are characters: the paper's 50..100,000 words of English are
# about 100..200,000 characters of Chinese or Japanese; a word is one character, so the mean
# length is 1 plus what Latin tokens (commands, names, numbers) add
_CJK_RULES = {
    "word_split": "cjk_chars",
    "min_doc_words": 100,
    "max_doc_words": 200_000,
    "min_avg_word_length": 1.0,
    "max_avg_word_length": 4.0,
    "min_stop_word_ratio": 0.05,
}

# language (lid.176 label) -> settings of GopherQualityConfig that differ from the paper's English ones
LANGUAGE_DEFAULTS: dict[str, dict] = {
    "de": {"stop_words": ["der", "die", "das", "und", "ist", "nicht", "mit", "den", "von", "zu", "ein", "eine",
                          "sich", "auf", "für", "es", "im", "dem", "des", "wird"]},
    "fr": {"stop_words": ["le", "la", "les", "de", "des", "et", "est", "un", "une", "du", "en", "que", "qui",
                          "dans", "pour", "pas", "sur", "au", "il", "sont"]},
    "es": {"stop_words": ["el", "la", "los", "las", "de", "del", "que", "y", "en", "un", "una", "es", "por",
                          "con", "para", "se", "no", "al", "lo", "su"]},
    "it": {"stop_words": ["il", "la", "le", "di", "che", "e", "è", "un", "una", "per", "non", "del", "della",
                          "in", "con", "si", "sono", "da", "gli", "lo"]},
    "pt": {"stop_words": ["o", "a", "os", "as", "de", "do", "da", "que", "e", "em", "um", "uma", "é", "para",
                          "com", "não", "no", "na", "se", "por"]},
    "nl": {"stop_words": ["de", "het", "een", "en", "van", "is", "dat", "niet", "in", "op", "te", "met", "voor",
                          "zijn", "er", "die", "ook", "wordt", "aan", "als"]},
    "ru": {"stop_words": ["и", "в", "не", "на", "что", "с", "по", "это", "как", "к", "для", "он", "а", "из",
                          "то", "от", "так", "о", "но", "при"]},
    # CJK stop words are counted as substrings of the text (they may span several character-words)
    "zh": {**_CJK_RULES, "min_stop_word_ratio": 0.03,
           "stop_words": ["的", "了", "是", "在", "和", "有", "不", "这", "也", "就", "都", "与", "或", "而", "及",
                          "为", "以", "对", "我们", "可以"]},
    "ja": {**_CJK_RULES,
           "stop_words": ["の", "に", "は", "を", "が", "で", "て", "と", "た", "も", "な", "です", "ます", "する",
                          "ある", "いる", "から", "こと", "れる", "ない"]},
}


def default_word_split(language: str | None) -> WordSplit:
    return LANGUAGE_DEFAULTS.get(language or "", {}).get("word_split", "whitespace")
