"""Language ID with the official lid.176 model on real text."""

import pytest

from lmforge.common.errors import ConfigError
from lmforge.dataprep.config import LangIdConfig
from lmforge.dataprep.document import Document
from lmforge.dataprep.steps.langid import LanguageFilter
from lmforge.dataprep.steps.reader import WetReader

# Real sentences, written by people (opening lines of public-domain works and common prose).
REAL_TEXT = {
    "en": "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
          "foolishness, it was the epoch of belief, it was the epoch of incredulity.",
    "fr": "Longtemps, je me suis couché de bonne heure. Parfois, à peine ma bougie éteinte, mes yeux se "
          "fermaient si vite que je n'avais pas le temps de me dire : je m'endors.",
    "de": "Als Gregor Samsa eines Morgens aus unruhigen Träumen erwachte, fand er sich in seinem Bett zu "
          "einem ungeheueren Ungeziefer verwandelt.",
    "es": "En un lugar de la Mancha, de cuyo nombre no quiero acordarme, no ha mucho tiempo que vivía un "
          "hidalgo de los de lanza en astillero, adarga antigua, rocín flaco y galgo corredor.",
    "it": "Nel mezzo del cammin di nostra vita mi ritrovai per una selva oscura, ché la diritta via era "
          "smarrita. Ahi quanto a dir qual era è cosa dura esta selva selvaggia e aspra e forte.",
    "ru": "Все счастливые семьи похожи друг на друга, каждая несчастливая семья несчастлива по-своему. "
          "Все смешалось в доме Облонских.",
    "ja": "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。何でも薄暗いじめじめした所で"
          "ニャーニャー泣いていた事だけは記憶している。",
    "pt": "Num dia de chuva, o velho pescador sentou-se à porta de casa e ficou a olhar para o mar, "
          "lembrando os anos em que saía com os irmãos antes de o sol nascer.",
}


def run_filter(config: LangIdConfig, texts: dict[str, str]):
    step = LanguageFilter(config)
    docs = [Document(i, f"https://x/{lang}", text) for i, (lang, text) in enumerate(texts.items())]
    kept = list(step.run(docs))
    return step, docs, kept


def test_each_language_is_identified():
    step, docs, _ = run_filter(LangIdConfig(languages=list(REAL_TEXT)), REAL_TEXT)
    assert {d.url.rsplit("/", 1)[1]: d.metadata["language"] for d in docs} == {k: k for k in REAL_TEXT}
    assert all(d.metadata["language_score"] >= 0.65 for d in docs)


def test_only_configured_languages_are_kept():
    step, _, kept = run_filter(LangIdConfig(languages=["en", "fr"]), REAL_TEXT)
    assert sorted(d.metadata["language"] for d in kept) == ["en", "fr"]
    assert step.stats.dropped == {"language_not_kept": len(REAL_TEXT) - 2}
    assert step.stats.counters["lang:ja"] == 1


def test_threshold_drops_low_confidence():
    mixed = {"mix": "the der la el il и の " * 5}
    step, _, kept = run_filter(LangIdConfig(languages=["en", "de", "fr", "es", "it", "ru", "ja"], threshold=0.99),
                               mixed)
    assert kept == [] and step.stats.dropped == {"language_score_too_low": 1} or \
        step.stats.dropped == {"language_not_kept": 1}


def test_real_common_crawl_record(shared_fixtures):
    # An Aragonese Wikipedia page; Common Crawl's own identifier says "spa" and so does lid.176.
    docs = list(WetReader().read(str(shared_fixtures / "whirlwind.warc.wet.gz"), 0))
    step = LanguageFilter()
    assert list(step.run(docs)) == []
    assert step.stats.dropped == {"language_not_kept": 1}
    assert docs[0].metadata["language"] == "es"
    assert docs[0].metadata["language_score"] < 0.65  # a low-confidence call, so the threshold matters
    assert list(LanguageFilter(LangIdConfig(languages=["es"], threshold=0.5)).run(docs)) == docs


def test_missing_model_is_a_config_error(tmp_path):
    step = LanguageFilter(LangIdConfig(model_path=str(tmp_path / "lid.176.bin")))
    with pytest.raises(ConfigError, match="model_path"):
        list(step.run([Document(0, "u", "hello world")]))
