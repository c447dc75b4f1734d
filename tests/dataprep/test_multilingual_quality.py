"""Gopher rules per language: the langid step's language picks the stop words and the word
splitting (CJK characters as words in Chinese and Japanese), so a pipeline keeping
[en, de, zh, ja] keeps the prose of each and drops their boilerplate for the right reason."""

from __future__ import annotations

import pytest

from lmforge.common.errors import ConfigError
from lmforge.dataprep.config import load_dataprep_config
from lmforge.dataprep.document import Document
from lmforge.dataprep.step_registry import build_step
from lmforge.dataprep.steps.languages import LANGUAGE_DEFAULTS, split_words
from lmforge.dataprep.steps.quality import (
    GopherLanguageRules,
    GopherQualityConfig,
    GopherQualityFilter,
    GopherRepetitionConfig,
    GopherRepetitionFilter,
)
from tests.dataprep.multilingual_texts import (
    CHINESE_MENU,
    CHINESE_PROSE,
    CHINESE_SPAM,
    GERMAN_MENU,
    GERMAN_PROSE,
    JAPANESE_MENU,
    JAPANESE_PROSE,
    JAPANESE_SPAM,
)
from tests.dataprep.test_quality import PROSE

LANGUAGES = ["en", "de", "zh", "ja"]


@pytest.fixture(scope="module")
def steps():
    """langid -> gopher_repetition -> gopher_quality, built from a config as a user writes it."""
    config = load_dataprep_config(overrides=[f"steps.langid.languages=[{','.join(LANGUAGES)}]"])
    return [build_step(step_id, config.step_settings(step_id))
            for step_id in ("langid", "gopher_repetition", "gopher_quality")]


def verdict(steps, text: str) -> tuple[str | None, str | None, str]:
    """(step that dropped the document or None, its reason, the language langid found)."""
    doc = Document(0, "https://example.com/page", text)
    for step in steps:
        keep, reason = step.filter(doc)
        if not keep:
            return step.name, reason, doc.metadata["language"]
    return None, None, doc.metadata["language"]


@pytest.mark.parametrize("text, language", [(PROSE, "en"), (GERMAN_PROSE, "de"), (CHINESE_PROSE, "zh"),
                                            (JAPANESE_PROSE, "ja")], ids=["en", "de", "zh", "ja"])
def test_prose_of_each_language_is_kept(steps, text, language):
    assert verdict(steps, text) == (None, None, language)


def test_without_its_language_rules_cjk_prose_is_too_few_words_and_german_has_no_stop_words():
    # what the English rules alone made of them: a line of Chinese is one whitespace "word"
    english_rules = GopherQualityFilter()
    for text, reason in ((CHINESE_PROSE, "too_few_words"), (JAPANESE_PROSE, "too_few_words"),
                         (GERMAN_PROSE, "too_few_stop_words")):
        assert english_rules.filter(Document(0, "u", text)) == (False, reason)


@pytest.mark.parametrize("text, language, step, reason", [
    (CHINESE_MENU, "zh", "gopher_quality", "too_few_stop_words"),
    (JAPANESE_MENU, "ja", "gopher_quality", "too_few_stop_words"),
    (CHINESE_SPAM, "zh", "gopher_repetition", "top_2gram_char_ratio"),
    (JAPANESE_SPAM, "ja", "gopher_repetition", "dup_line_ratio"),
    (GERMAN_MENU, "de", "gopher_repetition", "dup_line_ratio"),
], ids=["zh-menu", "ja-menu", "zh-spam", "ja-spam", "de-menu"])
def test_boilerplate_and_spam_are_dropped_with_their_reason(steps, text, language, step, reason):
    langid, repetition, quality = steps
    doc = Document(0, "https://example.com/page", text)
    langid.filter(doc)
    assert doc.metadata["language"] == language
    judged_by = {"gopher_repetition": repetition, "gopher_quality": quality}[step]
    assert judged_by.filter(doc) == (False, reason)


def test_german_is_judged_with_german_stop_words():
    quality = GopherQualityFilter()
    german = Document(0, "u", GERMAN_PROSE, metadata={"language": "de"})
    assert quality.filter(german) == (True, None)
    # the same words without the German function words are no longer prose
    function_words = set(LANGUAGE_DEFAULTS["de"]["stop_words"])
    stripped = " ".join(word for word in GERMAN_PROSE.split() if word.strip(",.:").lower() not in function_words)
    assert quality.filter(Document(0, "u", stripped, metadata={"language": "de"})) == (False, "too_few_stop_words")
    # and a user's German list replaces the built-in one
    own = GopherQualityFilter(GopherQualityConfig(per_language={"de": GopherLanguageRules(stop_words=["kein"])}))
    assert own.filter(german) == (False, "too_few_stop_words")


def test_an_unknown_or_missing_language_gets_the_default_rules():
    quality = GopherQualityFilter()
    for metadata in ({"language": "xx"}, {"language": "unknown"}, {}):
        assert quality.filter(Document(0, "u", PROSE, metadata=dict(metadata))) == (True, None)
        assert quality.filter(Document(0, "u", CHINESE_PROSE, metadata=dict(metadata))) == (False, "too_few_words")
        assert quality.filter(Document(0, "u", GERMAN_PROSE, metadata=dict(metadata))) == (
            False, "too_few_stop_words")
    assert GopherQualityConfig().for_language("xx") == GopherQualityConfig()


def test_cjk_characters_are_words_and_punctuation_is_not():
    assert split_words("灯塔守护人，用 git 命令。", "cjk_chars") == [
        "灯", "塔", "守", "护", "人", "，", "用", "git", "命", "令", "。"]
    assert split_words("北の海岸のsize_t型", "cjk_chars") == ["北", "の", "海", "岸", "の", "size_t", "型"]
    quality = GopherQualityFilter()
    short = CHINESE_PROSE[:90]  # 90 characters, some of them punctuation: under 100 character-words
    assert quality.filter(Document(0, "u", short, metadata={"language": "zh"})) == (False, "too_few_words")
    relaxed = GopherQualityFilter(GopherQualityConfig(per_language={"zh": GopherLanguageRules(min_doc_words=50)}))
    assert relaxed.filter(Document(0, "u", short, metadata={"language": "zh"}))[1] != "too_few_words"


def test_cjk_word_length_bounds_are_per_language():
    latin_heavy = CHINESE_PROSE + "\n" + " ".join(["configuration_management_subsystem"] * 100)
    doc = Document(0, "u", latin_heavy, metadata={"language": "zh"})
    assert GopherQualityFilter().filter(doc) == (False, "avg_word_length_too_long")
    loose = GopherQualityConfig(per_language={"zh": GopherLanguageRules(max_avg_word_length=20)})
    assert GopherQualityFilter(loose).filter(doc) == (True, None)


def test_repetition_ngrams_of_cjk_text_are_character_ngrams():
    # a 12-character phrase repeated: whitespace splitting sees one long "word" per line, no n-grams
    repeated = "\n".join(f"第{i}段：" + "今天天气很好我们去公园散步" * 3 for i in range(8))
    doc = Document(0, "u", repeated, metadata={"language": "zh"})
    assert GopherRepetitionFilter().filter(doc) == (False, "top_2gram_char_ratio")
    whitespace = GopherRepetitionFilter(GopherRepetitionConfig(word_split={"zh": "whitespace"}))
    assert whitespace.filter(doc) == (True, None)
    assert GopherRepetitionFilter().filter(Document(0, "u", repeated)) == (True, None)  # no language: whitespace


def test_per_language_settings_are_validated_at_load():
    with pytest.raises(ConfigError, match="per_language.zh: min_avg_word_length must not exceed"):
        load_dataprep_config(overrides=["steps.gopher_quality.per_language.zh.min_avg_word_length=5"])
    with pytest.raises(ConfigError, match="word_split"):
        load_dataprep_config(overrides=["steps.gopher_quality.per_language.th.word_split=thai"])
    config = load_dataprep_config(overrides=["steps.gopher_quality.per_language.ja.min_doc_words=300"])
    rules = config.step_settings("gopher_quality").for_language("ja")
    assert rules.min_doc_words == 300 and rules.word_split == "cjk_chars"  # the rest stays built in
