"""Toxicity word lists (LDNOOBW, shipped): whole-word and phrase matches per language, substring
matches for Chinese and Japanese, a threshold on the rate and on the count (C4's rule with
max_matches=0), the rate kept as a score."""

from __future__ import annotations

from collections import Counter

import pytest

from lmforge.common.errors import ConfigError
from lmforge.dataprep.config import load_dataprep_config
from lmforge.dataprep.document import Document
from lmforge.dataprep.steps.toxicity import LIST_DIR, ToxicityWordsFilter, ToxicityWordsSettings, shipped_languages

FILLER = ("The council met on Tuesday to discuss the new library, the bus timetable and the repairs "
          "to the old bridge over the river. ")  # 23 words


def _doc(text: str, language: str | None = "en") -> Document:
    return Document(0, "https://example.org/", text, {"language": language} if language else {})


def _rate(step: ToxicityWordsFilter, doc: Document) -> float:
    step.filter(doc)
    return doc.metadata["scores"]["toxicity_word_rate"]


def test_the_lists_ship_with_their_license():
    assert {"en", "de", "fr", "es", "ja", "zh"} <= set(shipped_languages())
    assert all((LIST_DIR / f"{lang}.txt").read_text(encoding="utf-8").strip() for lang in shipped_languages())
    assert "Attribution 4.0 International" in (LIST_DIR / "LICENSE").read_text()
    assert "CC-BY-4.0" in (LIST_DIR / "ATTRIBUTION.md").read_text()


def test_clean_text_passes_with_rate_zero():
    step = ToxicityWordsFilter()
    doc = _doc(FILLER * 5)
    assert step.filter(doc) == (True, None)
    assert doc.metadata["scores"]["toxicity_word_rate"] == 0.0


def test_a_word_in_passing_is_kept_and_a_dense_page_dropped():
    step = ToxicityWordsFilter()
    in_passing = _doc(FILLER * 5 + "The clinic offers sex education classes.")
    assert step.filter(in_passing) == (True, None)
    assert in_passing.metadata["scores"]["toxicity_word_rate"] == pytest.approx(1 / (5 * 23 + 6))
    dense = _doc("Hot sex and anal videos, more sex here. " + FILLER)
    assert step.filter(dense) == (False, "toxic_word_rate")
    assert step.stats.counters["docs_with_matches"] == 2


def test_matching_is_whole_words_phrases_and_case_insensitive():
    step = ToxicityWordsFilter()
    assert _rate(step, _doc("Scunthorpe and Essex are places; an assessment of classic glasses.")) == 0.0
    assert _rate(step, _doc("SEX sells.")) == pytest.approx(1 / 2)
    assert _rate(step, _doc("the 2 girls 1 cup video")) == pytest.approx(1 / 6)  # one phrase match


def test_c4_rule_any_match_drops():
    c4 = ToxicityWordsFilter(ToxicityWordsSettings(max_matches=0, max_match_rate=None))
    assert c4.filter(_doc(FILLER * 10 + "A single mention of sex.")) == (False, "toxic_word_count")
    assert c4.filter(_doc(FILLER)) == (True, None)
    lenient = ToxicityWordsFilter(ToxicityWordsSettings(max_matches=3, max_match_rate=None))
    assert lenient.filter(_doc("sex sex sex")) == (True, None)
    assert lenient.filter(_doc("sex sex sex sex")) == (False, "toxic_word_count")


def test_the_list_follows_the_document_language():
    step = ToxicityWordsFilter()
    german = "Der Arschficker stand am schönen Bahnhof."  # not ASCII: the regex tokenizer's path
    assert _rate(step, _doc(german, "de")) == pytest.approx(1 / 6)
    assert _rate(step, _doc(german, "en")) == 0.0
    assert _rate(step, _doc("sex sex", None)) == 1.0  # no language: default_language en
    assert step.stats.counters == Counter({"lang:de": 1, "lang:en": 2, "docs_with_matches": 2})


def test_languages_without_spaces_match_substrings():
    step = ToxicityWordsFilter()
    chinese = _doc("这个网站有三级片和很多别的东西", "zh")  # 15 characters, one listed entry
    assert _rate(step, chinese) == pytest.approx(1 / 15)
    assert _rate(step, _doc("性别平等是一个重要的话题", "zh")) == 0.0  # 性 is exempt, as in C4's code


def test_languages_without_a_list_or_not_selected_pass():
    step = ToxicityWordsFilter(ToxicityWordsSettings(languages=["en"], default_language=None))
    assert step.filter(_doc("sexe sexe sexe", "fr")) == (True, None)
    assert step.filter(_doc("sex sex", "el")) == (True, None)
    assert step.filter(_doc("sex sex", None)) == (True, None)
    assert step.stats.counters == Counter({"no_list:fr": 1, "no_list:el": 1, "no_list:None": 1})


def test_the_rate_histogram_has_bins_for_small_rates():
    step = ToxicityWordsFilter()
    list(step.run([_doc(FILLER * 10), _doc(FILLER * 10 + "sex"), _doc("sex " * 5)]))
    histogram = step.stats.histograms["toxicity_word_rate"]
    assert histogram["edges"][:4] == [0.0, 0.0005, 0.001, 0.002]
    assert sum(histogram["counts"]) == 3 and histogram["counts"][0] == 1 and histogram["counts"][-1] == 1


def test_bad_settings_fail_at_load_naming_the_step():
    with pytest.raises(ConfigError, match=r"steps\.toxicity_words.*no LDNOOBW list for xx"):
        load_dataprep_config(None, ["steps.toxicity_words.languages=[en,xx]"])
    with pytest.raises(ConfigError, match=r"steps\.toxicity_words.*max_match_rate"):
        load_dataprep_config(None, ["steps.toxicity_words.max_match_rate=-0.1"])
