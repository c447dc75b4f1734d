"""The WET generator's word lists, read from the package's data files: they load (once), every
template's slots name a pool the generator fills, and a small file generated from them is the
same bytes it was when the lists were still code."""

from __future__ import annotations

import hashlib
import re

import pytest

from lmforge.common.errors import InputError
from lmforge.sample_data import vocabulary, wet
from lmforge.sample_data.vocabulary import FOREIGN_LANGUAGES, english, languages, web

# sha256 of write_sample_wet(".../sample.warc.wet", 60, 5), recorded before the word lists moved
# out of wet.py (uncompressed: a gzip stream may differ between zlib builds). 60 documents plant
# every kind, every spam kind and every foreign language, so every list and template is drawn from.
GOLDEN_60_5 = "ceb971df81ee51e85ae51d9d8d8d8d1e4f2096f8531e37f8de895dd166b03207"
SLOT = re.compile(r"\{([A-Z]+)\d?\}")


def test_the_word_lists_load_once_and_are_filled():
    assert english() is english() and languages() is languages() and web() is web()
    vocab = english()
    assert len(vocab.topics) == 15
    for topic in vocab.topics:
        assert topic.name and topic.nouns and topic.mass and topic.verbs and topic.adjectives, topic.name
    assert "plan" in vocab.doubled_final and vocab.irregular_past["teach"] == "taught"
    assert tuple(languages()) == FOREIGN_LANGUAGES
    assert languages()["ja"].separator == "" and languages()["de"].warc_code == "deu"
    assert set(web().pii_sentences) == {"email", "phone", "ipv4", "credit_card"}
    assert all("{site}" in footer for footer in web().footers)


def test_every_template_slot_names_a_pool():
    english_pools = set(wet._english_pools(0))
    for template in english().sentence_templates + english().title_templates:
        assert set(SLOT.findall(template)) <= english_pools, template
    for purpose in english().purposes:
        assert set(SLOT.findall(purpose)) <= {"VB", "O", "SP"}, purpose
    for code, language in languages().items():
        for template in language.templates:
            assert set(SLOT.findall(template)) <= set(language.pools), (code, template)


def test_a_small_generation_is_the_same_bytes_as_before_the_lists_moved(tmp_path):
    first = wet.write_sample_wet(tmp_path / "a" / "sample.warc.wet", 60, 5)
    second = wet.write_sample_wet(tmp_path / "b" / "sample.warc.wet", 60, 5)
    data = (tmp_path / "a" / "sample.warc.wet").read_bytes()
    assert data == (tmp_path / "b" / "sample.warc.wet").read_bytes()
    assert first.to_dict()["records"] == second.to_dict()["records"]
    assert set(first.counts) == set(wet.KINDS)
    assert hashlib.sha256(data).hexdigest() == GOLDEN_60_5, (
        "the generator's output changed for the same seed: if that is intended (a list or a template "
        "edited), record the new digest here")


def test_a_missing_data_file_is_an_input_error_naming_it():
    with pytest.raises(InputError, match="sample-data vocabulary absent.json"):
        vocabulary._read("absent.json")
