"""Gopher quality and repetition filters: good prose passes, each rule drops the document
built to break it (with that rule's reason), and each threshold comes from the config."""

from __future__ import annotations

import itertools
import string
from collections import Counter

import pytest

from lmforge.common.errors import ConfigError
from lmforge.dataprep.document import Document
from lmforge.dataprep.steps.quality import (
    GopherQualityConfig,
    GopherQualityFilter,
    GopherRepetitionConfig,
    GopherRepetitionFilter,
)

PROSE = """The Lighthouse Keepers of the Northern Coast

For more than two centuries, the lighthouses along the northern coast were tended by families who \
lived beside them all year round. A keeper’s day began before dawn, when the great lamp had to be \
extinguished, its lens polished and its wick trimmed so that it would burn cleanly again at dusk. \
The work was repetitive, but it was never trivial: a single smoky night could leave a passing ship \
without a reference point on one of the most dangerous stretches of water in Europe.

Most stations were built on bare rock, and supplies arrived by boat only when the weather allowed. \
Keepers learned to bake their own bread, to mend their own boots and to keep careful records of the \
wind, the tides and every vessel that passed. Those logbooks, many of which survive in regional \
archives, are now read by historians and climate scientists alike. They describe storms that lasted \
for weeks, winters when the sea froze close to the shore, and summers so calm that sailing ships \
drifted for days within sight of the tower.

Children who grew up at a light often remembered it fondly. They were taught at home, usually by a \
parent, and they learned early how to read a barometer and how to recognise the silhouette of a \
fishing boat at night. Visitors were rare, so the arrival of the supply tender was a small festival: \
letters, newspapers and fresh fruit were shared out, and news from the mainland was discussed for \
days afterwards.

Automation changed everything. Between the nineteen sixties and the late nineteen nineties, electric \
lamps, remote monitoring and solar panels replaced the resident crews one station at a time. The \
last keepers left with mixed feelings — relief at an easier life, and sadness that a long tradition \
had quietly ended. Today several of the old towers are museums, where guides explain how the \
lenses worked and visitors can climb the narrow stairs to look out over the same restless sea.
"""


def keep(step, text: str) -> tuple[bool, str | None]:
    return step.filter(Document(0, "https://example.com/doc", text))


def quality(**overrides) -> GopherQualityFilter:
    return GopherQualityFilter(GopherQualityConfig(**overrides))


def repetition(**overrides) -> GopherRepetitionFilter:
    return GopherRepetitionFilter(GopherRepetitionConfig(**overrides))


def prose_sentences() -> list[str]:
    flat = " ".join(PROSE.split()[7:])  # without the title
    return [sentence.strip() + "." for sentence in flat.split(".") if len(sentence.split()) > 8]


def _names():
    """Distinct lowercase six-letter words that no test phrase uses."""
    for letters in itertools.product(string.ascii_lowercase, repeat=4):
        yield "zq" + "".join(letters)


def filler(count: int, names=None) -> list[str]:
    return list(itertools.islice(names or _names(), count))


def unique_lines(count: int, words_per_line: int = 10) -> list[str]:
    names = _names()
    return [" ".join(filler(words_per_line, names)) for _ in range(count)]


def scatter(phrases: list[list[str]], n_filler: int) -> list[str]:
    """The `phrases` in order, separated (and surrounded) by `n_filler` distinct filler words in total."""
    names = _names()
    gaps = len(phrases) + 1
    words: list[str] = []
    for gap in range(gaps):
        words += filler(n_filler // gaps + (1 if gap < n_filler % gaps else 0), names)
        if gap < len(phrases):
            words += phrases[gap]
    return words


def spread(phrase: list[str], times: int, n_filler: int) -> list[str]:
    """`phrase` `times` times, separated (and surrounded) by `n_filler` distinct filler words in total."""
    return scatter([phrase] * times, n_filler)


def char_ratio(words: list[str], chars: int) -> float:
    """`chars` over the characters of the document the words make (" ".join(words))."""
    return chars / len(" ".join(words))


def distinct_phrases(count: int, n: int, letters: int = 10) -> list[list[str]]:
    """`count` phrases of `n` distinct words of `letters` letters (no filler word has that length)."""
    pairs = ("".join(pair) for pair in itertools.product("bcdfghjkmnpqrstvwx", repeat=2))
    return [[(next(pairs) * letters)[:letters] for _ in range(n)] for _ in range(count)]


def filler_for(ratio: float, repeated_chars: int, phrase_words: list[list[str]]) -> int:
    """Filler words (6 letters each) that put `repeated_chars` at `ratio` of the characters of
    scatter(phrase_words, filler)."""
    phrase_chars = sum(len(word) for phrase in phrase_words for word in phrase)
    n_phrase_words = sum(map(len, phrase_words))
    # total = phrase_chars + 6 * filler + (n_phrase_words + filler - 1) spaces
    return round((repeated_chars / ratio - phrase_chars - n_phrase_words + 1) / 7)


def test_good_prose_is_kept_by_both_filters():
    assert len(PROSE.split()) > 300
    assert keep(GopherQualityFilter(), PROSE) == (True, None)
    assert keep(GopherRepetitionFilter(), PROSE) == (True, None)


# ---------------------------------------------------------------- quality: one document per rule

SHORT_WORDS = " ".join(
    ["I am at the zoo and he is at the bay. We go to it as we can, so do you. It is a big day for us all."] * 4
)
LONG_WORDS = " ".join(
    [
        "The internationalization of telecommunications infrastructure accelerated considerably, "
        "transforming administrative responsibilities, characteristically straightforward procurement "
        "arrangements, and comprehensive interoperability requirements throughout institutionalized "
        "establishments with extraordinarily sophisticated decentralization methodologies."
    ]
    * 3
)
NO_STOP_WORDS = (
    "Fresh bread remains a daily pleasure for many families across this town. Bakers rise early, mixing "
    "flour, water, salt, yeast inside large wooden troughs. Dough rests for hours, rising slowly while ovens "
    "heat. Loaves come out golden, crisp outside, soft inside. Customers queue before sunrise, greeting "
    "friends, buying rolls, pastries, rye loaves, sweet buns. Nothing beats warm bread eaten outdoors "
    "during spring mornings."
)


def bullet_doc(bullet: str) -> str:
    return "\n".join(f"{bullet} {sentence}" for sentence in prose_sentences())


def ellipsis_lines_doc(ellipsis: str) -> str:
    return "\n".join(sentence.rstrip(".") + ellipsis for sentence in prose_sentences())


def hashtag_doc() -> str:
    tags = " ".join(f"#topic{name}" for name in itertools.islice(_names(), 60))
    return PROSE + "\n" + tags


def mid_line_ellipsis_doc() -> str:
    words = PROSE.split()
    # an ellipsis inside every sixth word: many ellipses, none at a line end
    return " ".join(word + "..." if i % 6 == 3 else word for i, word in enumerate(words))


def numbers_doc() -> str:
    numbers = " ".join(str(1900 + i) for i in range(120))
    return PROSE + "\n" + numbers


def symbol_tokens_doc() -> str:
    # 45 words plus 10 tokens made only of symbols: 45 words, not 55
    words = " ".join(PROSE.split()[7:52])
    return words + " - | • — * & - | • —"


CASES = [
    # (reason, document, the config change that lets the same document through)
    ("too_few_words", " ".join(PROSE.split()[7:37]), {"min_doc_words": 20}),
    ("too_few_words", symbol_tokens_doc(), {"min_doc_words": 45}),
    ("too_many_words", PROSE, {"max_doc_words": 100}),
    ("avg_word_length_too_short", SHORT_WORDS, {"min_avg_word_length": 2.0}),
    ("avg_word_length_too_long", LONG_WORDS, {"max_avg_word_length": 20.0}),
    ("too_many_symbols", hashtag_doc(), {"max_symbol_word_ratio": 0.5}),
    ("too_many_symbols", mid_line_ellipsis_doc(), {"max_symbol_word_ratio": 0.5}),
    ("too_many_bullet_lines", bullet_doc("•"), {"max_bullet_lines_ratio": 1.0}),
    ("too_many_bullet_lines", bullet_doc("-"), {"max_bullet_lines_ratio": 1.0}),
    ("too_many_bullet_lines", bullet_doc("*"), {"max_bullet_lines_ratio": 1.0}),
    ("too_many_bullet_lines", bullet_doc("‣"), {"max_bullet_lines_ratio": 1.0}),
    ("too_many_ellipsis_lines", ellipsis_lines_doc("..."), {"max_ellipsis_lines_ratio": 1.0}),
    ("too_many_ellipsis_lines", ellipsis_lines_doc("…"), {"max_ellipsis_lines_ratio": 1.0}),
    ("too_few_alpha_words", numbers_doc(), {"min_alpha_words_ratio": 0.5}),
    ("too_few_stop_words", NO_STOP_WORDS, {"min_stop_words": 0}),
]


@pytest.mark.parametrize(("reason", "text", "relaxed"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_quality_rule_drops_with_its_reason_and_its_threshold_decides(reason, text, relaxed):
    if reason == "too_many_words":
        assert keep(GopherQualityFilter(), text) == (True, None)
        assert keep(quality(**relaxed), text) == (False, reason)
        return
    assert keep(GopherQualityFilter(), text) == (False, reason)
    # only this rule's threshold changed: the same document passes, so no other rule fails
    assert keep(quality(**relaxed), text) == (True, None)


def test_too_many_words_at_the_default_limit():
    sentences = prose_sentences()
    text = "\n".join(itertools.islice(itertools.cycle(sentences), 4200))
    assert len(text.split()) > 100_000
    assert keep(GopherQualityFilter(), text) == (False, "too_many_words")
    assert keep(quality(max_doc_words=200_000), text) == (True, None)


def test_word_count_limits_are_inclusive():
    text = " ".join(PROSE.split()[7:67])  # 60 words
    assert keep(quality(min_doc_words=60, max_doc_words=60), text) == (True, None)
    assert keep(quality(min_doc_words=61), text) == (False, "too_few_words")
    assert keep(quality(max_doc_words=59), text) == (False, "too_many_words")


def test_first_failing_rule_is_the_reason():
    # too few words AND no stop words: word count is checked first
    assert keep(GopherQualityFilter(), "Bread rises slowly overnight.") == (False, "too_few_words")
    # bullets and too few stop words: bullets first
    bullets = "\n".join(f"• {word}" for word in NO_STOP_WORDS.split())
    assert keep(GopherQualityFilter(), bullets) == (False, "too_many_bullet_lines")


def test_empty_and_whitespace_documents_have_too_few_words():
    assert keep(GopherQualityFilter(), "") == (False, "too_few_words")
    assert keep(quality(min_doc_words=0), " \n\t ") == (False, "too_few_words")


def test_stop_words_are_counted_case_insensitively_and_through_punctuation():
    # "The" is matched as written, "of," and "(with" only after stripping punctuation
    assert keep(GopherQualityFilter(), NO_STOP_WORDS + " The end.") == (False, "too_few_stop_words")
    assert keep(GopherQualityFilter(), NO_STOP_WORDS + " The end of, (with") == (True, None)
    assert keep(quality(min_stop_words=3), NO_STOP_WORDS + " The end of,") == (False, "too_few_stop_words")


def test_stop_word_list_is_configurable():
    french = quality(stop_words=["le", "la", "les", "et", "de"])
    assert keep(french, PROSE) == (False, "too_few_stop_words")
    assert keep(quality(stop_words=["bread", "flour"]), NO_STOP_WORDS) == (True, None)


def test_bullet_and_ellipsis_ratios_count_non_blank_lines():
    # half the non-blank lines are bullets (blank lines in between do not dilute)
    sentences = prose_sentences()
    text = "\n\n".join(f"• {s}" if i % 2 else s for i, s in enumerate(sentences))
    assert keep(quality(max_bullet_lines_ratio=0.6), text) == (True, None)
    assert keep(quality(max_bullet_lines_ratio=0.4), text) == (False, "too_many_bullet_lines")


def test_quality_counters_match_the_drops():
    step = GopherQualityFilter()
    texts = [PROSE, PROSE, SHORT_WORDS, bullet_doc("•"), NO_STOP_WORDS, numbers_doc(), "too short"]
    docs = [Document(i, f"https://example.com/{i}", text) for i, text in enumerate(texts)]
    rejected: list[tuple[int, str, str]] = []
    step.reject_sink = lambda doc, stage, reason: rejected.append((doc.doc_id, stage, reason))
    kept = list(step.run(docs))
    assert [doc.doc_id for doc in kept] == [0, 1]
    expected = Counter(
        {
            "avg_word_length_too_short": 1,
            "too_many_bullet_lines": 1,
            "too_few_stop_words": 1,
            "too_few_alpha_words": 1,
            "too_few_words": 1,
        }
    )
    assert step.stats.dropped == expected
    assert step.stats.docs_in == 7 and step.stats.docs_out == 2
    assert {(stage, reason) for _, stage, reason in rejected} == {("gopher_quality", r) for r in expected}


# ---------------------------------------------------------------- repetition


def test_dup_line_ratio():
    lines = unique_lines(10)
    for position in (0, 2, 4, 6, 8, 10):
        lines.insert(position, "Share this")
    text = "\n".join(lines)  # 5 repeats out of 16 lines
    assert keep(GopherRepetitionFilter(), text) == (False, "dup_line_ratio")
    assert keep(repetition(max_dup_line_ratio=0.35), text) == (True, None)


def test_dup_para_ratio():
    text = "\n".join(unique_lines(10)) + "\n\nRead more\n\n  \nRead more\n"  # 1 repeat out of 3 paragraphs
    assert keep(GopherRepetitionFilter(), text) == (False, "dup_para_ratio")
    assert keep(repetition(max_dup_para_ratio=0.34), text) == (True, None)


def test_dup_line_char_ratio():
    token = "a" * 300  # a one-word line (a long URL, say): repeated, it adds no repeated n-gram
    lines = unique_lines(10)
    lines.insert(3, token)
    lines.insert(9, token)
    text = "\n".join(lines)
    assert keep(GopherRepetitionFilter(), text) == (False, "dup_line_char_ratio")
    assert keep(repetition(max_dup_line_char_ratio=0.5), text) == (True, None)


def test_dup_para_char_ratio():
    # 27 one-line paragraphs of 2 characters, then a paragraph of 20 one-letter lines, twice: the
    # repeated lines are 11% of the document's characters, the repeated paragraph (newlines
    # included) 21%; 20 of 67 lines repeat (30%), 1 of 29 paragraphs
    names = ("".join(t) for t in itertools.product("bcdfghjkmnp", repeat=2))
    singles = [next(names) for _ in range(27)]
    block = "\n".join(string.ascii_lowercase[:20])
    text = "\n\n".join([*singles, block, block])
    assert 20 / len(text) <= 0.2 < len(block) / len(text)
    assert keep(GopherRepetitionFilter(), text) == (False, "dup_para_char_ratio")
    # a repeated paragraph always repeats its word n-grams too, so those rules must be relaxed as well
    relaxed = repetition(max_dup_para_char_ratio=0.3, dup_ngram_max_char_ratio={})
    assert keep(relaxed, text) == (True, None)
    assert keep(repetition(max_dup_para_char_ratio=0.3), text) == (False, "dup_10gram_char_ratio")


def test_top_2gram_char_ratio():
    words = spread(["quantum", "leap"], times=20, n_filler=41)
    text = " ".join(words)
    assert char_ratio(words, 20 * 11) > 0.2
    assert keep(GopherRepetitionFilter(), text) == (False, "top_2gram_char_ratio")
    assert keep(repetition(top_ngram_max_char_ratio={2: 0.5, 3: 0.18, 4: 0.16}), text) == (True, None)


def test_top_3gram_char_ratio():
    words = spread(["a", "watermelon", "lighthouse"], times=10, n_filler=120)
    text = " ".join(words)
    # the top 2-gram ("watermelon lighthouse", 20 letters) stays under 0.20, the 3-gram goes over 0.18
    assert char_ratio(words, 10 * 20) <= 0.2 and char_ratio(words, 10 * 21) > 0.18
    assert keep(GopherRepetitionFilter(), text) == (False, "top_3gram_char_ratio")
    assert keep(repetition(top_ngram_max_char_ratio={2: 0.2, 3: 0.25, 4: 0.16}), text) == (True, None)


def test_top_4gram_char_ratio():
    words = spread(["a", "x", "electromagnetic", "crystallization"], times=10, n_filler=215)
    text = " ".join(words)
    assert char_ratio(words, 10 * 30) <= 0.2 and char_ratio(words, 10 * 31) <= 0.18
    assert char_ratio(words, 10 * 32) > 0.16
    assert keep(GopherRepetitionFilter(), text) == (False, "top_4gram_char_ratio")
    assert keep(repetition(top_ngram_max_char_ratio={2: 0.2, 3: 0.18, 4: 0.25}), text) == (True, None)


def test_top_ngram_ties_count_the_longest():
    # two 2-grams occur 10 times each; the long one decides
    short_and_long = ["x", "y", "zq", "elephantine", "marmalades"]
    words = spread(short_and_long, times=10, n_filler=60)
    assert char_ratio(words, 10 * 21) > 0.2 and char_ratio(words, 10 * 3) < 0.2
    assert keep(GopherRepetitionFilter(), " ".join(words)) == (False, "top_2gram_char_ratio")


DUP_LIMITS = GopherRepetitionConfig().dup_ngram_max_char_ratio


@pytest.mark.parametrize("n", sorted(DUP_LIMITS))
def test_dup_ngram_char_ratio(n: int):
    # three n-word phrases of 10-letter words, each twice: their second copies are the only
    # duplicate text, at a share between this size's limit and the next smaller size's
    phrases = distinct_phrases(3, n)
    upper = DUP_LIMITS.get(n - 1, 0.2)
    repeated = 3 * n * 10
    words = scatter(phrases + phrases, filler_for((DUP_LIMITS[n] + upper) / 2, repeated, phrases + phrases))
    assert DUP_LIMITS[n] < char_ratio(words, repeated) <= upper
    text = " ".join(words)
    assert keep(GopherRepetitionFilter(), text) == (False, f"dup_{n}gram_char_ratio")
    assert keep(repetition(dup_ngram_max_char_ratio={**DUP_LIMITS, n: 0.3}), text) == (True, None)


def test_the_first_occurrence_of_a_repeated_ngram_is_not_a_duplicate():
    # As a repeated line is one duplicate line, a phrase written twice is one duplicate: its
    # repeats are 10% of the characters (kept), where counting both copies would make 20%
    phrases = distinct_phrases(3, 5)
    words = scatter(phrases + phrases, filler_for(0.10, 3 * 5 * 10, phrases + phrases))
    assert char_ratio(words, 3 * 5 * 10) == pytest.approx(0.10, abs=0.002)
    assert char_ratio(words, 2 * 3 * 5 * 10) > DUP_LIMITS[5]
    assert keep(GopherRepetitionFilter(), " ".join(words)) == (True, None)
    assert keep(repetition(dup_ngram_max_char_ratio={5: 0.09}), " ".join(words)) == (False, "dup_5gram_char_ratio")


def test_overlapping_duplicate_ngrams_count_each_word_once():
    # "b c d f g h" twice: the second copy holds two duplicate 5-grams that overlap in 4 words;
    # the duplicate characters are its 6 words once, not 2 x 5 words
    phrase = [c * 3 for c in "bcdfgh"]
    words = spread(phrase, times=2, n_filler=30)
    covered = char_ratio(words, 6 * 3)
    assert keep(repetition(dup_ngram_max_char_ratio={5: covered - 0.001}), " ".join(words)) == (
        False,
        "dup_5gram_char_ratio",
    )
    assert keep(repetition(dup_ngram_max_char_ratio={5: covered + 0.001}), " ".join(words)) == (True, None)


def test_every_word_of_a_repeated_run_is_inside_a_duplicate_ngram():
    # Three 7-word phrases, each twice. Every word of a second copy lies inside a duplicate
    # 5-gram (3 of them overlap each copy), so all 7 count: 17% of the characters, over the
    # 15% limit. datatrove skips n words past each duplicate it counts and so counts 5 of the
    # 7 (12%) and keeps the document (docs/benchmarks.md).
    phrases = distinct_phrases(3, 7)
    words = scatter(phrases + phrases, filler_for(0.17, 3 * 7 * 10, phrases + phrases))
    assert char_ratio(words, 3 * 7 * 10) > DUP_LIMITS[5] > char_ratio(words, 3 * 5 * 10)
    assert keep(GopherRepetitionFilter(), " ".join(words)) == (False, "dup_5gram_char_ratio")


def test_punctuation_stays_part_of_its_word():
    # "the wide-character class" ten times is three words ten times (kept). Tokenized so that
    # punctuation marks are words of their own, as datatrove's spaCy word list is, the same
    # text repeats the five "words" "the wide - character class" and the duplicated-5-gram
    # rule drops it (docs/benchmarks.md)
    words = spread(["the", "wide-character", "class"], times=10, n_filler=144)
    text = " ".join(words)
    assert keep(GopherRepetitionFilter(), text) == (True, None)
    spaced = text.replace("wide-character", "wide - character")
    assert keep(GopherRepetitionFilter(), spaced) == (False, "dup_5gram_char_ratio")


def test_lines_are_compared_without_their_indentation():
    # a navigation link rendered at two indentations is the same line: 3 duplicates of 9 lines
    text = "\n".join([*unique_lines(5, words_per_line=4), "Next", "   Next", "Next  ", "\tNext"])
    assert keep(GopherRepetitionFilter(), text) == (False, "dup_line_ratio")


def test_character_ratios_are_over_the_whole_document():
    # the same repeated lines weigh less in a document with more characters around them (here:
    # indentation, as in a rendered manual page), since a ratio's denominator is len(text)
    lines = unique_lines(8, words_per_line=3)
    lines.insert(3, "x" * 60)
    lines.insert(6, "x" * 60)
    flat = "\n".join(lines)
    indented = "\n".join(" " * 12 + line for line in lines)
    assert 60 / len(flat) > 0.2 >= 60 / len(indented)
    assert keep(GopherRepetitionFilter(), flat) == (False, "dup_line_char_ratio")
    assert keep(GopherRepetitionFilter(), indented) == (True, None)


def test_repeated_text_is_dropped_with_the_first_failing_rule():
    assert keep(GopherRepetitionFilter(), PROSE + "\n" + PROSE) == (False, "dup_line_ratio")
    one_line = " ".join(PROSE.split())
    assert keep(GopherRepetitionFilter(), one_line + " " + one_line) == (False, "dup_5gram_char_ratio")


def test_empty_document_is_not_repetitive():
    assert keep(GopherRepetitionFilter(), "") == (True, None)
    assert keep(GopherRepetitionFilter(), "one") == (True, None)


def test_ngram_sizes_below_one_are_rejected():
    with pytest.raises(ConfigError):
        repetition(top_ngram_max_char_ratio={0: 0.2})


def test_repetition_counters_match_the_drops():
    step = GopherRepetitionFilter()
    texts = [PROSE, PROSE + "\n" + PROSE, " ".join(spread(["quantum", "leap"], times=20, n_filler=41)), PROSE]
    kept = list(step.run(Document(i, "", text) for i, text in enumerate(texts)))
    assert [doc.doc_id for doc in kept] == [0, 3]
    assert step.stats.dropped == Counter({"dup_line_ratio": 1, "top_2gram_char_ratio": 1})
    assert step.stats.docs_in == 4 and step.stats.docs_out == 2
