#!/usr/bin/env python3
"""datatrove's Gopher verdicts for documents, for bench/gopher_agreement.py.

Runs with the datatrove venv (bench/setup_datatrove_venv.sh):

    bench/.venv-datatrove/bin/python bench/datatrove_gopher.py DOCS.jsonl OUT.jsonl

Reads {"id", "text"} lines and writes {"id", "repetition", "quality", "quality_no_alpha", ...}:
each the reason datatrove's filter (default thresholds, the paper's) drops the document
for, or null when it keeps it. `quality_no_alpha` is GopherQualityFilter with its
alphabetic-word rule off (that rule counts punctuation tokens as words; see docs/benchmarks.md).

To tell the deviations apart, GopherRepetitionFilter also runs with one of its module's
functions swapped at a time: `repetition_whitespace_words` takes whitespace-separated words
instead of spaCy's tokens (which make every punctuation mark a word), `repetition_overlaps_once`
counts every word inside a duplicate n-gram once instead of skipping n words past each
duplicate it counts, `repetition_both` does both.
"""

from __future__ import annotations

import contextlib
import json
import sys


def whitespace_words(text: str, language: str = "en") -> list[str]:
    return text.split()


def duplicate_chars_each_once(words: list[str], n: int) -> int:
    """Characters of the words inside n-grams that repeat an earlier n-gram, each word once."""
    seen: set[tuple[str, ...]] = set()
    inside = bytearray(len(words))
    for start in range(len(words) - n + 1):
        gram = tuple(words[start : start + n])
        if gram in seen:
            inside[start : start + n] = b"\x01" * n
        else:
            seen.add(gram)
    return sum(len(word) for word, flag in zip(words, inside) if flag)


@contextlib.contextmanager
def swapped(module, **functions):
    saved = {name: getattr(module, name) for name in functions}
    for name, function in functions.items():
        setattr(module, name, function)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(module, name, function)


def verdict(step, text: str) -> str | None:
    from datatrove.data import Document

    result = step.filter(Document(text=text, id="doc"))
    if result is True:
        return None
    if isinstance(result, tuple):
        return result[1] or "dropped"
    return "dropped"


def main(docs_path: str, out_path: str) -> int:
    from datatrove.pipeline.filters import GopherQualityFilter, GopherRepetitionFilter
    from datatrove.pipeline.filters import gopher_repetition_filter as module

    repetition = GopherRepetitionFilter()
    quality = GopherQualityFilter()
    quality_no_alpha = GopherQualityFilter(max_non_alpha_words_ratio=None)
    variants = {
        "repetition_whitespace_words": {"split_into_words": whitespace_words},
        "repetition_overlaps_once": {"find_all_duplicate": duplicate_chars_each_once},
        "repetition_both": {"split_into_words": whitespace_words, "find_all_duplicate": duplicate_chars_each_once},
    }
    with open(docs_path, encoding="utf-8") as src, open(out_path, "w", encoding="utf-8") as out:
        for line in src:
            doc = json.loads(line)
            text = doc["text"]
            row = {
                "id": doc["id"],
                "repetition": verdict(repetition, text),
                "quality": verdict(quality, text),
                "quality_no_alpha": verdict(quality_no_alpha, text),
            }
            for name, functions in variants.items():
                with swapped(module, **functions):
                    row[name] = verdict(repetition, text)
            out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
