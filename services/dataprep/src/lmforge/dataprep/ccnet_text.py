"""CCNet's text normalization before n-gram scoring (Wenzek et al. 2019, "CCNet", section 3.3;
cc_net/text_normalizer.py `normalize`): per line, strip, lowercase, remove accents (the
combining marks of the NFD form), every digit to 0, Unicode punctuation to its ASCII form and
control characters removed. The KenLM model must be trained on text normalized the same way:
`lmforge-dataprep train-ngram` does it, and so does the perplexity step's kenlm backend."""

from __future__ import annotations

import re
import sys
import unicodedata
from functools import cache

# cc_net/text_normalizer.py UNICODE_PUNCT
UNICODE_PUNCT = {
    "，": ",", "。": ".", "、": ",", "„": '"', "”": '"', "“": '"', "«": '"', "»": '"', "」": '"', "「": '"',
    "《": '"', "》": '"', "´": "'", "∶": ":", "：": ":", "？": "?", "！": "!", "（": "(", "）": ")", "；": ";",
    "–": "-", "—": " - ", "．": ". ", "～": "~", "’": "'", "…": "...", "━": "-", "〈": "<", "〉": ">",
    "【": "[", "】": "]", "％": "%", "►": "-",
}
_NON_PRINTING = [*range(0, 32), *range(127, 160)]
_DIGIT = re.compile(r"\d")


@cache
def _punct_table() -> dict[int, str | None]:
    table: dict[int, str | None] = {ord(k): v for k, v in UNICODE_PUNCT.items()}
    table.update(dict.fromkeys(_NON_PRINTING))
    return table


@cache
def _mark_table() -> dict[int, None]:
    """Every nonspacing combining mark (category Mn), removed from the NFD form: the accents."""
    return dict.fromkeys(c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Mn")


def normalize_line(line: str) -> str:
    line = line.strip().lower()
    if not line:
        return line
    if not line.isascii():
        line = unicodedata.normalize("NFD", line).translate(_mark_table())
    line = _DIGIT.sub("0", line)
    return line.translate(_punct_table())


def normalized_lines(text: str, normalize: bool = True) -> list[str]:
    """The document's non-empty lines, normalized as CCNet does (or only stripped)."""
    lines = (normalize_line(line) if normalize else line.strip() for line in text.split("\n"))
    return [line for line in lines if line]
