"""The word lists, phrase tables and sentence templates the synthetic WET generator (wet.py) draws
from, read from the package's data files (data/english.json, data/languages.json, data/web.json)
once per process and shared by every document after.

The files' order is part of the output: the generator picks by position, so one seed gives the
same bytes only while the lists keep their entries and their order. A file that is missing, is
not JSON or lacks a field is an InputError naming the file."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from lmforge.common.errors import InputError

FOREIGN_LANGUAGES = ("fr", "de", "es", "it", "pt", "nl", "ru", "ja")  # languages.json's, in its order (checked)


@dataclass(frozen=True)
class Topic:
    name: str
    nouns: list[str]
    mass: list[str]  # uncountable: "the soil", "some soil"
    verbs: list[str]
    adjectives: list[str]


@dataclass(frozen=True)
class English:
    irregular_past: dict[str, str]
    doubled_final: frozenset[str]  # verbs that double their last consonant: plan -> planned, planning
    irregular_plural: dict[str, str]
    topics: list[Topic]
    general_verbs: list[str]
    general_adjectives: list[str]
    first_names: list[str]
    surnames: list[str]
    roles: list[str]
    groups: list[str]
    habit_times: list[str]
    past_times: list[str]
    connectors: list[str]
    adverbs: list[str]
    places: list[str]
    reasons: list[str]
    prepositions: list[str]
    landmarks: list[str]
    landmark_adjectives: list[str]  # with their trailing space; "" (twice) for none
    purposes: list[str]  # templates with {VB}, {O} and {SP}
    numbers: list[str]
    percents: list[str]
    sentence_templates: list[str]  # slots: {POOL} or {POOL2}, the pools of wet._english_pools
    title_templates: list[str]


@dataclass(frozen=True)
class Language:
    code: str  # ISO 639-1, what fastText's lid.176 reports
    warc_code: str  # ISO 639-3, as in WARC-Identified-Content-Language
    tld: str
    separator: str  # between sentences ("" in Japanese)
    templates: list[str]  # slots name the pools
    pools: dict[str, list[str]]


@dataclass(frozen=True)
class Web:
    """Site chrome, spam, personal data and the words a near-duplicate edit inserts."""

    site_words: list[str]
    site_suffixes: list[str]
    nav_items: list[str]
    cookie_notices: list[str]
    footers: list[str]  # {site}: the site's name
    spam_keywords: list[str]
    symbol_lines: list[str]
    bullets: list[str]
    bullet_items: list[str]
    teasers: list[str]
    mail_domains: list[str]
    pii_sentences: dict[str, list[str]]  # by kind (email, phone, ipv4, credit_card); {value}: the planted value
    insertable: list[str]


def _read(name: str) -> Any:
    try:
        return json.loads((resources.files("lmforge.sample_data") / "data" / name).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"sample-data vocabulary {name}: {exc}") from exc


def _build(name: str, make):
    """make() over a file's data; a missing or unknown field is an InputError naming the file."""
    try:
        return make()
    except (KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"sample-data vocabulary {name}: not the expected fields ({type(exc).__name__}: {exc})") \
            from exc


@functools.cache
def english() -> English:
    data = _read("english.json")
    return _build("english.json", lambda: English(**{
        **data,
        "doubled_final": frozenset(data["doubled_final"]),
        "topics": [Topic(**topic) for topic in data["topics"]],
    }))


@functools.cache
def languages() -> dict[str, Language]:
    """The foreign languages by code, in FOREIGN_LANGUAGES's order."""
    data = _read("languages.json")
    loaded = _build("languages.json", lambda: {entry["code"]: Language(**entry) for entry in data})
    if tuple(loaded) != FOREIGN_LANGUAGES:
        raise InputError(f"sample-data vocabulary languages.json: languages {', '.join(loaded)}, expected "
                         f"{', '.join(FOREIGN_LANGUAGES)} in that order")
    return loaded


@functools.cache
def web() -> Web:
    data = _read("web.json")
    return _build("web.json", lambda: Web(**data))
