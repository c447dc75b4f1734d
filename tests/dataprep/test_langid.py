"""Language ID with the official lid.176 model on real text."""

from pathlib import Path

import pytest

from lmforge.common.errors import ConfigError
from lmforge.dataprep.document import Document
from lmforge.dataprep.steps.langid import LangIdConfig, LanguageFilter, prose_sample, prose_text
from lmforge.dataprep.steps.reader import WetReader

# Whole documentation pages from Debian packages (sources and licenses: doc_excerpts/SOURCES.md)
EXCERPTS = Path(__file__).parent / "doc_excerpts"
CODE_HEAVY_ENGLISH = sorted(EXCERPTS.glob("en_*.txt"))
CODE_HEAVY_JAPANESE = sorted(EXCERPTS.glob("ja_*.txt"))

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


def test_real_common_crawl_record(fixtures_dir):
    # An Aragonese Wikipedia page that opens with Spanish menus; Common Crawl's own identifier says "spa"
    # and so does lid.176, on the first 2,000 characters as on the whole text, with low confidence.
    docs = list(WetReader().read(str(fixtures_dir / "whirlwind.warc.wet.gz"), 0))
    step = LanguageFilter()
    assert list(step.run(docs)) == []
    assert step.stats.dropped == {"language_not_kept": 1}
    assert docs[0].metadata["language"] == "es"
    assert docs[0].metadata["language_score"] < 0.7  # a low-confidence call, so the threshold matters
    strict = LanguageFilter(LangIdConfig(languages=["es"], threshold=0.7))
    assert list(strict.run(docs)) == [] and strict.stats.dropped == {"language_score_too_low": 1}
    assert list(LanguageFilter(LangIdConfig(languages=["es"], threshold=0.6)).run(docs)) == docs
    whole_text = LanguageFilter(LangIdConfig(languages=["es"], sample_chars=0))
    assert whole_text.identify(docs[0].text)[1] < 0.6


def test_missing_model_is_a_config_error(tmp_path):
    step = LanguageFilter(LangIdConfig(model_path=str(tmp_path / "lid.176.bin")))
    with pytest.raises(ConfigError, match="model_path"):
        list(step.run([Document(0, "u", "hello world")]))


def identify(step: LanguageFilter, text: str) -> tuple[tuple[bool, str | None], dict]:
    doc = Document(0, "https://x/page", text)
    return step.filter(doc), doc.metadata


@pytest.mark.parametrize("page", CODE_HEAVY_ENGLISH, ids=lambda path: path.stem)
def test_code_heavy_english_pages_are_kept(page):
    # SQL sessions, prototypes, column tables: identified whole, lid.176 scores these English
    # pages under 0.65 and the filter dropped them; their prose lines are plainly English
    text = page.read_text(encoding="utf-8")
    verdict, metadata = identify(LanguageFilter(LangIdConfig(prose_lines=False)), text)
    assert verdict == (False, "language_score_too_low") and metadata["language"] == "en"
    verdict, metadata = identify(LanguageFilter(), text)
    assert verdict == (True, None)
    assert metadata["language"] == "en" and metadata["language_score"] >= 0.65


@pytest.mark.parametrize("page", CODE_HEAVY_JAPANESE, ids=lambda path: path.stem)
def test_code_heavy_non_english_pages_stay_non_english(page):
    text = page.read_text(encoding="utf-8")
    step = LanguageFilter(LangIdConfig(languages=["en", "ja"]))
    verdict, metadata = identify(step, text)
    assert verdict == (True, None) and metadata["language"] == "ja" and metadata["language_score"] >= 0.65
    assert identify(LanguageFilter(), text)[0] == (False, "language_not_kept")
    # and so are its prose lines alone
    assert LanguageFilter().predict(prose_text(text))[0] == "ja"


def test_prose_lines_are_the_sentences_not_the_code():
    text = (EXCERPTS / "en_sql_update_tutorial.txt").read_text(encoding="utf-8")
    prose = prose_text(text)
    assert "You can update existing rows using the UPDATE command." in prose
    assert "Look at the new state of the data:" in prose
    for code in ("SET temp_hi", "WHERE date > '1994-11-28';", "San Francisco", "1994-11-29", "(3 rows)"):
        assert code in text and code not in prose
    japanese = prose_text((EXCERPTS / "ja_man_bstring.txt").read_text(encoding="utf-8"))
    assert "これらの関数はヌル終端する必要のない文字列 (バイト配列) の操作を行う。" in japanese
    assert "size_t" not in japanese


def test_unbounded_the_prose_lines_decide_only_when_the_whole_text_is_unsure():
    step = LanguageFilter(LangIdConfig(sample_chars=0))
    page = (EXCERPTS / "en_sql_update_tutorial.txt").read_text(encoding="utf-8")
    whole, prose = step.predict(page), step.predict(prose_text(page))
    assert whole[1] < 0.65 <= prose[1]
    assert step.identify(page) == prose
    assert LanguageFilter(LangIdConfig(threshold=whole[1], sample_chars=0)).identify(page) == whole  # sure enough
    assert LanguageFilter(LangIdConfig(prose_lines=False, sample_chars=0)).identify(page) == whole


def test_unbounded_a_page_with_too_little_prose_is_identified_whole():
    page = (EXCERPTS / "en_sql_update_tutorial.txt").read_text(encoding="utf-8")
    step = LanguageFilter(LangIdConfig(min_prose_chars=len(prose_text(page)) + 1, sample_chars=0))
    assert step.identify(page) == step.predict(page)
    code_only = "\n".join(line for line in page.splitlines() if line.strip() not in prose_text(page))
    assert len(prose_text(code_only)) < LangIdConfig().min_prose_chars
    assert step.predict(code_only)[1] < 0.65  # unsure, and no prose to retry on
    assert LanguageFilter(LangIdConfig(sample_chars=0)).identify(code_only) == step.predict(code_only)


def test_the_sample_is_the_first_sentences_not_the_code():
    page = (EXCERPTS / "en_sql_update_tutorial.txt").read_text(encoding="utf-8")
    sample = prose_sample(page, 300)
    assert sample.startswith("You can update existing rows using the UPDATE command.")
    assert len(sample) <= 300 and sample in prose_text(page)  # not the heading "Chapter 2. The SQL Language"
    step = LanguageFilter()
    assert step.identify(page) == step.predict(prose_sample(page, LangIdConfig().sample_chars))
    assert step.identify(page)[0] == "en" and step.identify(page)[1] >= 0.65


def test_only_a_bounded_head_of_the_text_is_read():
    english = REAL_TEXT["en"] + "\n"
    french = REAL_TEXT["fr"] + "\n"
    step = LanguageFilter(LangIdConfig(sample_chars=200))
    # the language of the first sentences decides, however much of the rest is in another language
    assert step.identify(english * 2 + french * 5000)[0] == "en"
    # prose further than 16 samples into the text is not read: a page that opens with a long code
    # block is identified on its first characters, as one without prose
    code = "".join(f"x{i} = compute(x{i - 1}, 0x{i:04x});\n" for i in range(1, 200))
    assert len(code) > 16 * 200 and prose_sample(code + english * 3, 200) == ""
    assert step.identify(code + english * 3) == step.predict(code[:200])
    short_code = "".join(code.splitlines(keepends=True)[:30])
    assert prose_sample(short_code + english * 3, 200).startswith("It was the best of times")
