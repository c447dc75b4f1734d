"""Synthetic, Common Crawl-like WET files with planted ground truth.

`write_sample_wet(path, docs, seed)` writes a WET file whose records look like the ones
Common Crawl publishes (warcinfo first, then `conversion` records with CRLF headers; one
gzip member per record for `.gz`), filled with a known mix of documents:

- prose: distinct English articles built from topic vocabularies and sentence templates;
- foreign: the same idea in French, German, Spanish, Italian, Portuguese, Dutch, Russian
  and Japanese;
- boilerplate: English pages of a few sites sharing a navigation menu, cookie notice and footer;
- spam: keyword lists, symbol lines, bullet-only lists, "click here..." lines, very short
  pages, heavy repetition;
- exact_dup / near_dup / url_dup: copies of prose documents (same text at another URL, a
  few words edited, the same URL crawled again with new content);
- pii: English prose with e-mail addresses, phone numbers, IPv4 addresses and Luhn-valid
  card numbers in it.

The returned `SampleSummary` (optionally written as `<path>.truth.json`) says, per record,
what was planted, so that the quality, dedup and PII stages can be measured against it.
Output depends only on (docs, seed): no wall clock, no uuid4.
"""

from __future__ import annotations

import base64
import datetime as _dt
import functools
import hashlib
import ipaddress
import json
import random
import re
import uuid
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lmforge.common.storage import atomic_open, atomic_write_bytes

KINDS = ("prose", "foreign", "boilerplate", "spam", "pii", "exact_dup", "near_dup", "url_dup")
KIND_WEIGHTS = {
    "prose": 0.44,
    "foreign": 0.14,
    "boilerplate": 0.12,
    "spam": 0.10,
    "pii": 0.06,
    "exact_dup": 0.05,
    "near_dup": 0.06,
    "url_dup": 0.03,
}
DUPLICATE_KINDS = ("exact_dup", "near_dup", "url_dup")
SPAM_KINDS = ("keyword_list", "symbol_lines", "bullet_list", "ellipsis_lines", "too_short", "repetition")
NEAR_DUP_JACCARD = (0.86, 0.96)  # planted range, inside the [0.85, 0.97] the tests accept

CRAWL_NAME = "CC-MAIN-2024-22"
BASE_DATE = _dt.datetime(2024, 5, 18, 0, 0, 0, tzinfo=_dt.UTC)
GZIP_LEVEL = 6

# ====================================================================== English vocabulary

_IRREGULAR_PAST = {
    "build": "built", "buy": "bought", "bring": "brought", "catch": "caught", "choose": "chose",
    "cut": "cut", "dig": "dug", "draw": "drew", "eat": "ate", "feed": "fed", "find": "found",
    "freeze": "froze", "give": "gave", "grow": "grew", "hear": "heard", "hold": "held",
    "keep": "kept", "know": "knew", "lead": "led", "leave": "left", "lose": "lost", "make": "made",
    "meet": "met", "pay": "paid", "put": "put", "read": "read", "ride": "rode", "run": "ran",
    "see": "saw", "sell": "sold", "send": "sent", "set": "set", "sing": "sang", "spend": "spent",
    "sweep": "swept", "take": "took", "teach": "taught", "tell": "told", "throw": "threw",
    "understand": "understood", "win": "won", "write": "wrote", "light": "lit", "shake": "shook",
}
_DOUBLED_FINAL = {
    "plan", "stop", "drop", "ship", "chop", "trim", "skip", "grab", "dig", "run", "win", "set",
    "cut", "put", "shop", "map", "scan", "log", "row", "pin", "swim", "admit", "control", "tap",
}
_IRREGULAR_PLURAL = {
    "child": "children", "person": "people", "leaf": "leaves", "loaf": "loaves", "knife": "knives",
    "shelf": "shelves", "wolf": "wolves", "life": "lives", "species": "species", "sheep": "sheep",
    "deer": "deer", "fish": "fish", "tomato": "tomatoes", "potato": "potatoes", "hero": "heroes",
    "series": "series", "mouse": "mice",
}


def _plural(noun: str) -> str:
    head, _, last = noun.rpartition(" ")
    prefix = head + " " if head else ""
    if last in _IRREGULAR_PLURAL:
        return prefix + _IRREGULAR_PLURAL[last]
    if last.endswith("y") and last[-2:-1] not in "aeiou":
        return prefix + last[:-1] + "ies"
    if last.endswith(("s", "x", "z", "ch", "sh")):
        return prefix + last + "es"
    return prefix + last + "s"


def _third_person(verb: str) -> str:
    if verb.endswith("y") and verb[-2:-1] not in "aeiou":
        return verb[:-1] + "ies"
    if verb.endswith(("s", "x", "z", "ch", "sh", "o")):
        return verb + "es"
    return verb + "s"


def _past(verb: str) -> str:
    if verb in _IRREGULAR_PAST:
        return _IRREGULAR_PAST[verb]
    if verb in _DOUBLED_FINAL:
        return verb + verb[-1] + "ed"
    if verb.endswith("e"):
        return verb + "d"
    if verb.endswith("y") and verb[-2:-1] not in "aeiou":
        return verb[:-1] + "ied"
    return verb + "ed"


def _gerund(verb: str) -> str:
    if verb in _DOUBLED_FINAL:
        return verb + verb[-1] + "ing"
    if verb.endswith("ie"):
        return verb[:-2] + "ying"
    if verb.endswith("e") and not verb.endswith(("ee", "ye", "oe")):
        return verb[:-1] + "ing"
    return verb + "ing"


def _with_article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _words(text: str) -> list[str]:
    return [w.strip() for w in text.split(",") if w.strip()]


@dataclass(frozen=True)
class _Topic:
    name: str
    nouns: list[str]
    mass: list[str]
    verbs: list[str]
    adjectives: list[str]


_TOPICS = [
    _Topic(
        "gardening",
        _words("garden, seedling, tomato, rose, hedge, greenhouse, shovel, raised bed, flower bed, vegetable patch,"
               "apple tree, pumpkin, bulb, weed, watering can, compost heap, allotment, orchard, herb, trellis,"
               "sunflower, beetle, wheelbarrow, potato"),
        _words("soil, compost, mulch, rainwater, fertiliser, manure"),
        _words("plant, water, prune, harvest, dig, sow, fertilise, transplant, cover, mulch, protect, weed"),
        _words("leafy, fertile, sunny, overgrown, fragrant, sheltered, muddy, thriving"),
    ),
    _Topic(
        "cooking",
        _words("recipe, kitchen, pan, oven, onion, sauce, loaf, dumpling, pie, soup, knife, chopping board, spice,"
               "carrot, lemon, garlic clove, meal, dish, stew, pancake, cookbook, dinner party"),
        _words("flour, butter, olive oil, sugar, rice, salt"),
        _words("bake, chop, stir, season, roast, simmer, taste, grill, slice, serve, marinate, prepare"),
        _words("crispy, tender, savoury, spicy, golden, homemade, delicious, rich"),
    ),
    _Topic(
        "local history",
        _words("archive, castle, chapel, manuscript, census record, parish, mill, battle, monument, bridge,"
               "railway station, town hall, merchant, letter, diary, map, photograph, ruin, tradition, guild,"
               "coin, harbour"),
        _words("evidence, heritage, folklore, documentation, history, land"),
        _words("document, restore, excavate, record, catalogue, preserve, trace, uncover, study, interpret, date"),
        _words("medieval, ancient, forgotten, historic, crumbling, Victorian, rural, remarkable"),
    ),
    _Topic(
        "travel",
        _words("train, ticket, hostel, suitcase, passport, guidebook, mountain pass, ferry, border crossing,"
               "night bus, itinerary, village, market, beach, hiking trail, backpack, campsite, airport,"
               "souvenir, tour, postcard, hotel"),
        _words("luggage, scenery, currency, time, sunshine, traffic"),
        _words("book, pack, explore, visit, cross, reach, photograph, plan, navigate, recommend, catch, board"),
        _words("remote, crowded, scenic, affordable, overnight, coastal, unfamiliar, breathtaking"),
    ),
    _Topic(
        "technology",
        _words("server, database, laptop, program, feature, bug, update, interface, sensor, network, algorithm,"
               "spreadsheet, keyboard, password, backup, cable, router, app, website, script, release, prototype"),
        _words("software, hardware, data, code, memory, bandwidth"),
        _words("install, test, update, debug, configure, deploy, measure, replace, monitor, design, upgrade,"
               "download"),
        _words("reliable, outdated, wireless, secure, open, efficient, portable, complex"),
    ),
    _Topic(
        "personal finance",
        _words("budget, loan, mortgage, savings account, pension, invoice, receipt, salary, expense, bill,"
               "tax return, bank, investment, bond, share, insurance policy, fund, payment, interest rate,"
               "debt, paycheck, account"),
        _words("money, cash, income, inflation, credit, capital"),
        _words("save, borrow, invest, spend, track, reduce, pay, calculate, compare, review, repay, earn"),
        _words("monthly, annual, careful, modest, unexpected, expensive, affordable, steady"),
    ),
    _Topic(
        "health",
        _words("muscle, workout, doctor, patient, vitamin, habit, injury, knee, heart, stretch, routine, bicycle,"
               "treadmill, nurse, clinic, symptom, step, swimming pool, yoga class, walk, diet, blood test"),
        _words("sleep, water, protein, exercise, stress, energy"),
        _words("stretch, strengthen, train, lift, improve, monitor, treat, prevent, reduce, avoid, measure, build"),
        _words("healthy, tired, active, gentle, daily, strong, painful, balanced"),
    ),
    _Topic(
        "astronomy",
        _words("telescope, planet, star, comet, galaxy, moon, eclipse, meteor, satellite, observatory, orbit,"
               "crater, nebula, lens, constellation, astronomer, rocket, sky chart, asteroid, space probe"),
        _words("starlight, dust, gravity, radiation, darkness, space"),
        _words("observe, photograph, track, measure, discover, launch, map, spot, calculate, study, detect, point"),
        _words("distant, faint, bright, cosmic, lunar, icy, massive, rare"),
    ),
    _Topic(
        "music",
        _words("song, guitar, piano, choir, concert, album, melody, band, drum, violin, orchestra, record, lyric,"
               "rehearsal, festival, chord, microphone, studio, composer, audience, tune, stage"),
        _words("music, rhythm, harmony, jazz, noise, applause"),
        _words("play, record, practise, compose, tune, perform, rehearse, sing, arrange, mix, hear, write"),
        _words("loud, acoustic, classical, lively, soft, melancholic, catchy, rhythmic"),
    ),
    _Topic(
        "sailing",
        _words("boat, sail, harbour, wave, island, lighthouse, anchor, rope, crew, tide, storm, fishing net,"
               "coastline, voyage, compass, mast, dolphin, cliff, pier, captain, current, whale"),
        _words("seawater, wind, fog, salt, weather, driftwood"),
        _words("sail, steer, anchor, repair, navigate, tie, cross, load, row, watch, chart, spot"),
        _words("stormy, calm, salty, windy, rocky, northern, sheltered, deep"),
    ),
    _Topic(
        "architecture",
        _words("house, roof, wall, window, staircase, brick, beam, tower, courtyard, facade, door, balcony,"
               "building, architect, foundation, column, arch, floor plan, apartment, warehouse, chimney, garage"),
        _words("concrete, timber, stone, glass, steel, insulation"),
        _words("design, build, renovate, paint, measure, insulate, demolish, repair, inspect, extend, decorate,"
               "restore"),
        _words("modern, tall, spacious, narrow, elegant, wooden, sturdy, bright"),
    ),
    _Topic(
        "wildlife",
        _words("bird, nest, owl, fox, hedgehog, deer, feeder, migration, river bank, wetland, sparrow, hawk,"
               "butterfly, badger, egg, forest, meadow, heron, trail camera, species, squirrel, wolf"),
        _words("wildlife, habitat, grass, pollen, moss, birdsong"),
        _words("watch, count, feed, track, photograph, protect, spot, record, study, follow, attract, release"),
        _words("wild, shy, migratory, nocturnal, colourful, rare, endangered, native"),
    ),
    _Topic(
        "education",
        _words("school, teacher, student, lesson, classroom, exam, textbook, essay, library, lecture, course,"
               "assignment, notebook, university, professor, project, grade, curriculum, workshop, question,"
               "semester, tutor"),
        _words("homework, knowledge, research, feedback, mathematics, literature"),
        _words("teach, learn, explain, grade, study, write, read, prepare, discuss, revise, present, review"),
        _words("difficult, patient, curious, final, practical, academic, thoughtful, demanding"),
    ),
    _Topic(
        "football",
        _words("match, goal, team, player, coach, stadium, season, league, referee, ball, tournament, penalty,"
               "supporter, pitch, trophy, training session, striker, defender, fixture, jersey, scoreboard,"
               "victory"),
        _words("talent, teamwork, momentum, pressure, footage, strategy"),
        _words("win, score, train, coach, watch, defend, lose, celebrate, analyse, support, play, kick"),
        _words("competitive, famous, exhausted, young, local, determined, narrow, dramatic"),
    ),
    _Topic(
        "photography",
        _words("camera, lens, photograph, portrait, tripod, shutter, landscape, exhibition, print, darkroom,"
               "film roll, frame, studio, model, filter, flash, album, sunset, street scene, subject, snapshot,"
               "gallery"),
        _words("light, contrast, colour, film, exposure, shadow"),
        _words("photograph, frame, print, edit, develop, capture, adjust, focus, exhibit, crop, light, compose"),
        _words("sharp, blurry, grainy, vivid, dramatic, natural, candid, monochrome"),
    ),
]

_GENERAL_VERBS = _words(
    "discuss, study, describe, improve, protect, share, find, check, compare, choose, test, change, explain,"
    "prepare, repair, measure, watch, follow, keep, build, clean, carry, move, organise, sell, buy, borrow,"
    "notice, open, close, question, admire, ignore, mention, support, visit, collect, replace, finish, love"
)
_GENERAL_ADJECTIVES = _words(
    "small, large, old, new, simple, useful, important, difficult, beautiful, quiet, busy, strange, familiar,"
    "popular, ordinary, modest, practical, expensive, cheap, early, late, long, short, heavy, light, warm, cold,"
    "fresh, clean, local, public, private, honest, serious, curious, obvious, gentle, steady, sudden, common,"
    "narrow, wide, dark, clever, strong, fragile, reliable, unusual, surprising, interesting, pleasant, quick,"
    "generous, hidden, complex, elegant, humble, lively, awkward, famous, precious, ambitious, tidy, rough"
)
_FIRST_NAMES = _words(
    "Anna, Thomas, Maria, David, Sarah, James, Emma, Daniel, Laura, Michael, Olivia, Peter, Grace, Samuel,"
    "Helen, Robert, Clara, Martin, Ruth, George, Alice, Henry, Julia, Oliver, Rachel, Edward, Nora, Lucas,"
    "Frances, Arthur, Eleanor, Simon, Hannah, Victor, Irene, Benjamin, Margaret, Patrick, Sophie, Walter"
)
_SURNAMES = _words(
    "Whitfield, Morgan, Hale, Carter, Brennan, Fischer, Lindqvist, Okafor, Moreau, Patel, Novak, Sullivan,"
    "Ramsay, Keller, Duarte, Hughes, Bishop, Kowalski, Abbott, Fairbanks, Tanaka, Castillo, Holm, Mercer,"
    "Quinn, Ellison, Baxter, Harlow, Reyes, Sato"
)
_ROLES = _words(
    "my neighbour, the farmer, a retired teacher, our guide, the mayor, a local historian, the engineer,"
    "my grandmother, the head chef, a visiting scientist, the shop owner, the team captain, my younger brother,"
    "the new manager, the museum curator, a careful reader, my oldest friend, the librarian, a volunteer,"
    "the landlord, an old sailor, the night nurse, a first-year student, the village doctor, the author,"
    "my uncle, the bus driver, a young architect, the editor, a market trader, the park ranger, my colleague,"
    "the photographer, a quiet musician, the baker, the postman, my sister, a seasoned traveller,"
    "the caretaker, the treasurer"
)
_GROUPS = _words(
    "most visitors, the students, local families, many beginners, the volunteers, our readers,"
    "experienced travellers, small businesses, my parents, older residents, the neighbours, young people,"
    "most experts, city officials, the organisers, a few friends, the critics, professionals, many parents,"
    "the locals, first-time visitors, the researchers, our members, some teachers, the engineers,"
    "the children, farmers in the region, most of my friends, the authors, the journalists"
)
_HABIT_TIMES = _words(
    "in the early morning, every spring, on most weekends, at the start of the season, during the holidays,"
    "after lunch, in the autumn, once a month, every other week, throughout the year, at the weekend,"
    "on rainy days, in winter, most evenings, before sunrise, on quiet days, in the summer months,"
    "whenever possible, each year, around noon"
)
_PAST_TIMES = _words(
    "last summer, after the storm, a decade ago, by the end of the day, for several weeks, later that evening,"
    "a few years ago, on a cold afternoon, in the end, two weeks later, at first, in those days, yesterday,"
    "last year, the following morning, after a long delay, in the spring of that year, shortly after breakfast,"
    "on the first day, back in the nineties, earlier this year, last weekend, that winter, once"
)
_CONNECTORS = _words(
    "however, in addition, as a result, for this reason, of course, at the same time, still, meanwhile,"
    "in practice, on the other hand, surprisingly, not surprisingly, in many cases, above all, to be fair,"
    "in fact, for example, by contrast, even so, as expected, in short, fortunately, unfortunately,"
    "in my experience, more importantly, honestly, oddly enough, then again, as it turns out, for most people"
)
_ADVERBS = _words(
    "carefully, slowly, quietly, quickly, patiently, openly, rarely, often, gradually, easily, gently,"
    "properly, regularly, eagerly, cautiously, deliberately, happily, reluctantly, steadily, thoroughly,"
    "proudly, briefly, occasionally, confidently, usually, secretly, honestly, calmly, repeatedly, politely"
)
_PLACES = _words(
    "near the river, in the village square, behind the old station, along the northern coast,"
    "at the edge of town, in a small workshop, on the top floor, across the valley, in the back garden,"
    "next to the library, outside the town hall, in the city centre, on the far side of the lake,"
    "under the old bridge, in a rented flat, at the local market, down by the harbour,"
    "in the community centre, on the hillside, in the school hall, at the end of the lane, in a quiet corner,"
    "beside the main road, in the countryside, on the island, at the university, in the basement,"
    "near the border, in the public park, at home"
)
_REASONS = _words(
    "because the weather changed, because nobody had tried it before, because prices kept rising,"
    "so that everyone could take part, because it saves time, to keep costs down, for the sake of the children,"
    "to avoid the crowds, because the rules are unclear, in order to learn something new,"
    "out of pure curiosity, to make the most of the light, because it is simply more fun,"
    "for reasons nobody could explain, to prepare for the next season, because the old method no longer works,"
    "to meet the new standards, despite the cost, without much help, with a little patience,"
    "as a matter of habit, in spite of the rain, for the first time in years, to the surprise of many,"
    "on the advice of a friend"
)
_PREPOSITIONS = _words(
    "near, behind, beside, across from, opposite, next to, outside, in front of, not far from, around, inside,"
    "above, below, past, beyond"
)
_LANDMARKS = _words(
    "station, library, river, market, harbour, school, church, bridge, town hall, park, bakery, post office,"
    "museum, square, lake, farm, factory, hospital, cinema, stadium, castle, hotel, forest, cottage, warehouse"
)
_LANDMARK_ADJECTIVES = ["", "", "old ", "new ", "small ", "quiet ", "busy ", "main ", "empty ", "famous ", "local "]
_PURPOSES = [
    "in order to {VB} {O}",
    "so that {SP} could {VB} {O}",
    "to help {SP} {VB} {O}",
    "before {SP} could {VB} {O}",
    "so that nobody would {VB} {O}",
    "hoping to {VB} {O}",
]
_NUMBERS = _words("two, three, four, five, six, seven, ten, twelve, twenty, several, many")
_PERCENTS = _words("five, eight, ten, twelve, fifteen, twenty, thirty, forty")

_SENTENCE_TEMPLATES = [
    "{TH}, {S} {V} {O} {PL}.",
    "{C}, {S} {V} {O} {R}.",
    "{S} {ADV} {VP} {O} {PL}, and {SP} {VP2} {O2} {TP}.",
    "{P} told me that {S} {VP} {O} {R}.",
    "{SP} often {VB} {O} {PL}, but {S} {ADV} {V} {O2}.",
    "{C}, there is no {A} way to {VB} {O} without {VING} {O2} first.",
    "{TP}, {SP} {VP} {O} and {VP2} {O2} {PL}.",
    "If you want to {VB} {O}, start by {VING} {O2} {PL}.",
    "The {A} thing about {NS} is that {SP} {VB} them {ADV}.",
    "It is {A} to see how {S} {V} {O} {PL}.",
    "{S} {V} {O}, which {ADV} {V2} {O2}.",
    "{P}, who {VP} {O} {TP}, still {V} {O2} {PL}.",
    "Most experts agree that {SP} should {VB} {O} {ADV}, especially {TH}.",
    "What {SP} rarely mention is that {S} {V} {O} {R}.",
    "{C}, {NS} and {NS2} are {A} {PL}.",
    "Why does {S} {VB} {O} {PL}? The answer is {A} and {A2}.",
    "{S} {V} {O} {ADV}; {S2} {V2} {O2} {TH}.",
    "{TP}, we {VP} {O} {PL} and {VP2} {O2} for the first time.",
    "There were {A} {NS} {PL}, and {SP} {VP} them {ADV}.",
    "According to {P}, {SP} {VB} {O} more {ADV} than they used to.",
    "{AN} {N} can {VB} {O} {PL} {R}.",
    "We {VP} {O} {TP}, but {S} {VP2} {O2} {PL}.",
    "Nobody expected {S} to {VB} {O} {R}.",
    "{C}, you should {VB} {O} {ADV} and never {VB2} {O2} {PL}.",
    "Over time, {SP} learned to {VB} {O} {ADV}.",
    "One {A} {N} {VP} {O} {PL}, while {SP} {VP2} {O2}.",
    "The {A} question is not whether {S} {V} {O}, but how {ADV} {S2} {V2} {O2}.",
    "{P} {VP} {O} {TP} {R}.",
    "Instead of {VING} {O}, {SP} {VB} {O2} {PL}.",
    "It took {NUM} years before {SP} {VP} {O} {PL}.",
    "{TP}, the price of {NS} rose by {PCT} percent, and {SP} {VP} {O} {R}.",
    "{SP} who {VB} {O} {ADV} tend to {VB2} {O2} {PL}.",
    "Few people know that {S} once {VP} {O} {PL}.",
    "I asked {P} why {SP} {VB} {O} {PL}, and the answer was {A}.",
    "In my view, {VING} {O} is {A} but {A2}, and {SP} {VB} it {TH}.",
    "{S} and {S2} {VP} {O} together {TP}.",
    "Although {S} {V} {O} {TH}, {SP} {VB} {O2} {ADV}.",
    "{C}, it is {A} to {VB} {O} {PL} {R}.",
    "Every {N} needs {A} care, so {SP} {VB} {O} {ADV}.",
    "Do you remember when {S} {VP} {O} {PL}?",
    "{P} has been {VING} {O} {PL} for {NUM} years.",
    "As {P} likes to say, {NS} are only as {A} as the {NS2} around them.",
    "{TH}, you can watch {SP} {VB} {O} {PL}.",
    "The {A} {N} that {S} {VP} {TP} is still {PL}.",
    "{S} believes that {SP} {VB} {O} {R}.",
]
_TITLE_TEMPLATES = [
    "A {A} guide to {NS}",
    "Why {NS} matter more than you think",
    "How to {VB} {O} {PL}",
    "What {SP} get wrong about {NS}",
    "The {A} history of {NS}",
    "Notes on {TOPIC}: {NS} and {NS2}",
    "{NUM} lessons from a year of {TOPIC}",
    "When {S} {V} {O}",
    "In defence of {A} {NS}",
    "{TOPIC} {PL}: a {A} story",
]

_SLOT = re.compile(r"\{([A-Z]+)(\d?)\}")


def _parse_template(template: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """'{S} {V} {O2}.' -> the template and its slots as (placeholder, pool) pairs."""
    slots = tuple(dict.fromkeys((m.group(1) + m.group(2), m.group(1)) for m in _SLOT.finditer(template)))
    return template, slots


_PARSED_SENTENCES = [_parse_template(t) for t in _SENTENCE_TEMPLATES]
_PARSED_TITLES = [_parse_template(t) for t in _TITLE_TEMPLATES]
_POOL_SEED = 20240522  # the vocabulary pools are fixed; only the per-document choices depend on the seed


@functools.cache
def _english_pools(topic_index: int) -> dict[str, list[str]]:
    """Phrase pools for one topic: noun phrases with determiners, verb forms, people, times..."""
    topic = _TOPICS[topic_index]
    rng = random.Random(_POOL_SEED + topic_index)
    adjectives = topic.adjectives * 3 + _GENERAL_ADJECTIVES
    verbs = topic.verbs * 2 + _GENERAL_VERBS
    singular = _noun_phrases(rng, topic.nouns, adjectives, plural=False, count=700)
    plural = _noun_phrases(rng, topic.nouns, adjectives, plural=True, count=500)
    mass_determiners = ("the", "some", "more", "enough", "our", "their", "fresh")
    mass = [f"{det} {noun}" for det in mass_determiners for noun in topic.mass]
    people = _ROLES + _FIRST_NAMES + [f"{rng.choice(_FIRST_NAMES)} {s}" for s in _SURNAMES]
    places = _PLACES + [
        f"{rng.choice(_PREPOSITIONS)} the {rng.choice(_LANDMARK_ADJECTIVES)}{rng.choice(_LANDMARKS)}"
        for _ in range(300)
    ]
    reasons = _REASONS + [
        rng.choice(_PURPOSES).format(VB=rng.choice(verbs), O=rng.choice(singular + plural), SP=rng.choice(_GROUPS))
        for _ in range(300)
    ]
    return {
        "S": singular + people * 2,
        "SP": plural + _GROUPS * 3,
        "O": singular + plural + mass,
        "V": [_third_person(v) for v in verbs],
        "VP": [_past(v) for v in verbs],
        "VB": verbs,
        "VING": [_gerund(v) for v in verbs],
        "TH": _HABIT_TIMES,
        "TP": _PAST_TIMES,
        "C": _CONNECTORS,
        "ADV": _ADVERBS,
        "PL": sorted(set(places)),
        "R": sorted(set(reasons)),
        "A": adjectives,
        "AN": [_with_article(a) for a in adjectives],
        "N": topic.nouns,
        "NS": [_plural(n) for n in topic.nouns],
        "P": people,
        "NUM": _NUMBERS,
        "PCT": _PERCENTS,
        "TOPIC": [topic.name],
    }


def _noun_phrases(rng: random.Random, nouns: list[str], adjectives: list[str], *, plural: bool, count: int):
    determiners = (
        ("the", "these", "those", "many", "some", "several", "our", "their", "two", "a few", "most")
        if plural
        else ("the", "a", "this", "that", "every", "one", "our", "their", "my", "each", "the same")
    )
    phrases = set()
    while len(phrases) < count:
        noun = rng.choice(nouns)
        noun = _plural(noun) if plural else noun
        if rng.random() < 0.5:
            noun = f"{rng.choice(adjectives)} {noun}"
        det = rng.choice(determiners)
        phrases.add(_with_article(noun) if det == "a" else f"{det} {noun}")
    return sorted(phrases)


def _fill(rng: random.Random, parsed: tuple[str, tuple[tuple[str, str], ...]], pools: dict[str, list[str]]) -> str:
    template, slots = parsed
    uniform = rng.random  # indexing by random() is several times faster than rng.choice on this hot path
    values = {}
    for name, pool in slots:
        options = pools[pool]
        values[name] = options[int(uniform() * len(options))]
    text = template.format_map(values)
    return text[0].upper() + text[1:]


def _english_paragraphs(rng: random.Random, min_words: int, topic_index: int | None = None) -> list[str]:
    """Paragraphs of English sentences on one topic, at least `min_words` words in all."""
    if topic_index is None:
        topic_index = rng.randrange(len(_TOPICS))
    pools = _english_pools(topic_index)
    paragraphs, words = [], 0
    while words < min_words:
        sentences = [_fill(rng, rng.choice(_PARSED_SENTENCES), pools) for _ in range(rng.randint(3, 7))]
        paragraph = " ".join(sentences)
        paragraphs.append(paragraph)
        words += paragraph.count(" ") + 1
    return paragraphs


def _english_title(rng: random.Random, topic_index: int) -> str:
    return _fill(rng, rng.choice(_PARSED_TITLES), _english_pools(topic_index))


def _english_article(rng: random.Random, min_words: int | None = None) -> str:
    topic_index = rng.randrange(len(_TOPICS))
    min_words = min_words or rng.randint(380, 850)
    return "\n".join([_english_title(rng, topic_index), *_english_paragraphs(rng, min_words, topic_index)])


# ====================================================================== other languages


@dataclass(frozen=True)
class _Language:
    code: str  # ISO 639-1, what fastText's lid.176 reports
    warc_code: str  # ISO 639-3, as in WARC-Identified-Content-Language
    tld: str
    templates: list[str]
    pools: dict[str, list[str]]
    separator: str = " "  # between sentences


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n") if line.strip()]


_LANGUAGES = [
    _Language(
        "fr", "fra", "fr",
        [
            "{T}, {S} {V} {O} {PL}.",
            "{C} {S} {V} {O} {PL}.",
            "{S} {V} {O} et {S2} {V2} {O2}.",
            "Selon {S}, {S2} {V} {O} {PL}.",
            "Je pense que {S} {V} {O} {PL}.",
            "{S} {V} {O} parce que {S2} {V2} {O2}.",
            "Pourquoi est-ce que {S} {V} {O} {PL} ?",
            "Il est vrai que {S} {V} {O}, mais {S2} {V2} {O2} {PL}.",
        ],
        {
            "S": _lines("""
le boulanger\nla directrice\nmon voisin\nnotre équipe\nle maire du village\nla jeune musicienne
le professeur\nma grand-mère\nle vieux pêcheur\nla pharmacienne\nnotre guide\nle jardinier
la journaliste\nmon frère aîné\nle chef cuisinier\nla bibliothécaire\nle facteur\nsa cousine
le propriétaire du café\nla commerçante"""),
            "O": _lines("""
le marché couvert\nla maison de campagne\nles livres anciens\nla lettre de sa mère\nle jardin public
les fleurs du balcon\nla cuisine\nle nouveau projet\nla bicyclette rouge\nle journal du matin
les fenêtres\nle pain frais\nla carte de la région\nles photos de famille\nle vieux moulin
la réunion du conseil\nles légumes du potager\nle programme de la semaine\nla salle des fêtes
les comptes de l'association"""),
            "V": _lines("""
achète\nprépare\nlit\nécrit\norganise\nnettoie\nvend\ncherche\ntrouve\nouvre\nferme\nrépare
peint\nregarde\nétudie\nexplique\nprésente\nporte\nchoisit\nvisite"""),
            "PL": _lines("""
dans le centre de la ville\nprès de la rivière\nsur la place du marché\ndans son bureau
au village\nà côté de la gare\ndans la petite boutique\nau bord du lac\nchez ses parents
dans la salle de classe\nsous les arbres du parc\nà la mairie"""),
            "T": _lines("""
Le matin\nChaque dimanche\nEn été\nPendant la semaine\nTous les jours\nL'après-midi
Le week-end\nEn hiver\nAprès le travail\nAvant le dîner\nAu printemps\nLe soir"""),
            "C": _lines("""
De plus,\nCependant,\nC'est pourquoi\nEn général,\nBien sûr,\nParfois,\nFinalement,
Pendant ce temps,\nEn effet,\nPar ailleurs,"""),
        },
    ),
    _Language(
        "de", "deu", "de",
        [
            "{S} {V} {O} {PL}.",
            "{T} {V} {S} {O} {PL}.",
            "{C} {V} {S} {O} {PL}.",
            "{S} {V} {O}, weil {S2} {O2} {PL} {V2}.",
            "Ich glaube, dass {S} {O} {PL} {V}.",
            "{S} {V} {O}, und {S2} {V2} {O2}.",
            "Warum {V} {S} {O} {PL}?",
            "Es ist bekannt, dass {S} {O} {V}.",
        ],
        {
            "S": _lines("""
der Bäcker\ndie Lehrerin\nmein Nachbar\nunsere Familie\nder Bürgermeister\ndas Kind
die junge Ärztin\nder alte Fischer\nmeine Großmutter\nder Gärtner\ndie Journalistin
unser Trainer\nder Koch\ndie Bibliothekarin\nmein älterer Bruder\nder Briefträger
die Studentin\nder Besitzer des Cafés\ndie Apothekerin\nmeine Kollegin"""),
            "O": _lines("""
den Markt\ndas alte Haus\ndie Bücher\neinen langen Brief\nden Garten\ndie Blumen\ndie Küche
ein neues Projekt\ndas rote Fahrrad\ndie Zeitung\ndie Fenster\ndas frische Brot\ndie Landkarte
die Familienfotos\nden Bericht\ndas Gemüse aus dem Garten\nden Wochenplan\ndie Rechnung
einen Kuchen\ndie Einladung"""),
            "V": _lines("""
kauft\nbesucht\nliest\nschreibt\norganisiert\nputzt\nverkauft\nsucht\nfindet\nöffnet
schließt\nrepariert\nmalt\nbetrachtet\nstudiert\nerklärt\nbringt\nwählt\nbraucht\nbestellt"""),
            "PL": _lines("""
in der Stadt\nim Garten\nam Bahnhof\nauf dem Markt\nim Büro\nin der Küche\nim Dorf
an der Ecke\nim kleinen Laden\nam Ufer des Flusses\nbei ihren Eltern\nim Klassenzimmer"""),
            "T": _lines("""
Am Morgen\nJeden Tag\nIm Sommer\nAm Wochenende\nHeute\nOft\nManchmal\nIm Winter
Nach der Arbeit\nVor dem Frühstück\nJedes Jahr\nAm Abend"""),
            "C": _lines("Deshalb\nAußerdem\nTrotzdem\nDanach\nLeider\nZum Glück\nNatürlich\nMeistens"),
        },
    ),
    _Language(
        "es", "spa", "es",
        [
            "{T}, {S} {V} {O} {PL}.",
            "{C} {S} {V} {O} {PL}.",
            "{S} {V} {O} y {S2} {V2} {O2}.",
            "Según {S}, {S2} {V} {O} {PL}.",
            "Creo que {S} {V} {O} {PL}.",
            "{S} {V} {O} porque {S2} {V2} {O2}.",
            "¿Por qué {V} {S} {O} {PL}?",
            "Es verdad que {S} {V} {O}, pero {S2} {V2} {O2} {PL}.",
        ],
        {
            "S": _lines("""
el panadero\nla maestra\nmi vecino\nnuestra familia\nel alcalde del pueblo\nla joven médica
el viejo pescador\nmi abuela\nel jardinero\nla periodista\nnuestro entrenador\nel cocinero
la bibliotecaria\nmi hermano mayor\nel cartero\nla estudiante\nel dueño del bar\nla farmacéutica
mi compañera de trabajo\nel profesor de historia"""),
            "O": _lines("""
el mercado\nla casa de campo\nlos libros antiguos\nuna carta larga\nel jardín\nlas flores
la cocina\nun proyecto nuevo\nla bicicleta roja\nel periódico\nlas ventanas\nel pan del día
el mapa de la región\nlas fotos de la familia\nel informe anual\nlas verduras de la huerta
el horario de la semana\nla cuenta del restaurante\nuna tarta de manzana\nla invitación"""),
            "V": _lines("""
compra\nprepara\nlee\nescribe\norganiza\nlimpia\nvende\nbusca\nencuentra\nabre\ncierra
arregla\npinta\nrecoge\nestudia\nexplica\npresenta\nlleva\nelige\nnecesita"""),
            "PL": _lines("""
en el centro de la ciudad\ncerca del río\nen la plaza mayor\nen su oficina\nen el pueblo
junto a la estación\nen la pequeña tienda\nal lado del lago\nen casa de sus padres
en el aula\nbajo los árboles del parque\nen el ayuntamiento"""),
            "T": _lines("""
Por la mañana\nCada domingo\nEn verano\nDurante la semana\nTodos los días\nPor la tarde
Los fines de semana\nEn invierno\nDespués del trabajo\nAntes de la cena\nEn primavera\nPor la noche"""),
            "C": _lines("""
Además,\nSin embargo,\nPor eso,\nEn general,\nPor supuesto,\nA veces,\nAl final,
Mientras tanto,\nDe hecho,\nPor otra parte,"""),
        },
    ),
    _Language(
        "it", "ita", "it",
        [
            "{T}, {S} {V} {O} {PL}.",
            "{C} {S} {V} {O} {PL}.",
            "{S} {V} {O} e {S2} {V2} {O2}.",
            "Secondo {S}, {S2} {V} {O} {PL}.",
            "{S} dice che {S2} {V} {O} {PL}.",
            "{S} {V} {O} perché {S2} {V2} {O2}.",
            "Perché {S} {V} {O} {PL}?",
            "È vero che {S} {V} {O}, ma {S2} {V2} {O2} {PL}.",
        ],
        {
            "S": _lines("""
il fornaio\nla maestra\nmio fratello\nla nostra famiglia\nil sindaco del paese\nlo studente
la giovane dottoressa\nil vecchio pescatore\nmia nonna\nil giardiniere\nla giornalista
il nostro allenatore\nil cuoco\nla bibliotecaria\nil postino\nla studentessa\nil proprietario del bar
la farmacista\nla mia collega\nil professore di storia"""),
            "O": _lines("""
il mercato\nla casa di campagna\ni libri antichi\nuna lunga lettera\nil giardino\ni fiori
la cucina\nun nuovo progetto\nla bicicletta rossa\nil giornale\nle finestre\nil pane fresco
la carta della regione\nle foto di famiglia\nla relazione annuale\nle verdure dell'orto
il programma della settimana\nil conto del ristorante\nuna torta di mele\nl'invito"""),
            "V": _lines("""
compra\nprepara\nlegge\nscrive\norganizza\npulisce\nvende\ncerca\ntrova\napre\nchiude
ripara\ndipinge\nraccoglie\nstudia\nspiega\npresenta\nporta\nsceglie\nascolta"""),
            "PL": _lines("""
nel centro della città\nvicino al fiume\nin piazza\nnel suo ufficio\nin paese
accanto alla stazione\nnel piccolo negozio\nsulla riva del lago\na casa dei genitori
in classe\nsotto gli alberi del parco\nin municipio"""),
            "T": _lines("""
La mattina\nOgni domenica\nD'estate\nDurante la settimana\nTutti i giorni\nIl pomeriggio
Nel fine settimana\nD'inverno\nDopo il lavoro\nPrima di cena\nIn primavera\nLa sera"""),
            "C": _lines("""
Inoltre,\nTuttavia,\nPer questo,\nIn generale,\nNaturalmente,\nA volte,\nAlla fine,
Nel frattempo,\nInfatti,\nD'altra parte,"""),
        },
    ),
    _Language(
        "pt", "por", "pt",
        [
            "{T}, {S} {V} {O} {PL}.",
            "{C} {S} {V} {O} {PL}.",
            "{S} {V} {O} e {S2} {V2} {O2}.",
            "Segundo {S}, {S2} {V} {O} {PL}.",
            "Acho que {S} {V} {O} {PL}.",
            "{S} não {V} {O} {PL}, mas {S2} {V2} {O2}.",
            "{S} {V} {O} porque {S2} {V2} {O2}.",
            "Por que {S} {V} {O} {PL}?",
        ],
        {
            "S": _lines("""
o padeiro\na professora\no meu vizinho\na nossa família\no prefeito da cidade\no estudante
a jovem médica\no velho pescador\na minha avó\no jardineiro\na jornalista\no nosso treinador
o cozinheiro\na bibliotecária\no carteiro\na estudante\no dono do café\na farmacêutica
a minha colega\no professor de história"""),
            "O": _lines("""
o mercado\na casa de campo\nos livros antigos\numa carta comprida\no jardim\nas flores
a cozinha\num projeto novo\na bicicleta vermelha\no jornal\nas janelas\no pão fresco
o mapa da região\nas fotografias da família\no relatório anual\nos legumes da horta
o horário da semana\na conta do restaurante\num bolo de maçã\no convite"""),
            "V": _lines("""
compra\nprepara\nlê\nescreve\norganiza\nlimpa\nvende\nprocura\nencontra\nabre\nfecha
conserta\npinta\nrecolhe\nestuda\nexplica\napresenta\nleva\nescolhe\nouve"""),
            "PL": _lines("""
no centro da cidade\nperto do rio\nna praça\nno seu escritório\nna aldeia
ao lado da estação\nna pequena loja\nà beira do lago\nem casa dos pais\nna sala de aula
debaixo das árvores do parque\nna câmara municipal"""),
            "T": _lines("""
De manhã\nTodos os domingos\nNo verão\nDurante a semana\nTodos os dias\nÀ tarde
Nos fins de semana\nNo inverno\nDepois do trabalho\nAntes do jantar\nNa primavera\nÀ noite"""),
            "C": _lines("""
Além disso,\nNo entanto,\nPor isso,\nEm geral,\nÀs vezes,\nNo final,\nEnquanto isso,
De fato,\nPor outro lado,\nNa verdade,"""),
        },
    ),
    _Language(
        "nl", "nld", "nl",
        [
            "{S} {V} {O} {PL}.",
            "{T} {V} {S} {O} {PL}.",
            "{C} {V} {S} {O} {PL}.",
            "Ik denk dat {S} {O} {PL} {V}.",
            "{S} {V} {O}, omdat {S2} {O2} {V2}.",
            "{S} {V} {O} en {S2} {V2} {O2}.",
            "Volgens {S} {V} {S2} {O} {PL}.",
            "Waarom {V} {S} {O} {PL}?",
        ],
        {
            "S": _lines("""
de bakker\nde lerares\nmijn buurman\nonze familie\nde burgemeester\nhet kind\nde jonge dokter
de oude visser\nmijn grootmoeder\nde tuinman\nde journaliste\nonze trainer\nde kok
de bibliothecaris\nmijn oudere broer\nde postbode\nde studente\nde eigenaar van het café
de apotheker\nmijn collega"""),
            "O": _lines("""
de markt\nhet oude huis\nde boeken\neen lange brief\nde tuin\nde bloemen\nde keuken
een nieuw project\nde rode fiets\nde krant\nde ramen\nhet verse brood\nde kaart van de streek
de familiefoto's\nhet jaarverslag\nde groenten uit de moestuin\nhet weekrooster\nde rekening
een appeltaart\nde uitnodiging"""),
            "V": _lines("""
koopt\nbezoekt\nleest\nschrijft\norganiseert\nmaakt\nverkoopt\nzoekt\nvindt\nopent\nsluit
repareert\nschildert\nverzamelt\nbestudeert\nbekijkt\nbrengt\nkiest\nbestelt\nbetaalt"""),
            "PL": _lines("""
in het centrum van de stad\nbij de rivier\nop het plein\nin zijn kantoor\nin het dorp
naast het station\nin de kleine winkel\naan de oever van het meer\nbij haar ouders
in het klaslokaal\nonder de bomen in het park\nop het gemeentehuis"""),
            "T": _lines("""
's Ochtends\nElke zondag\nIn de zomer\nTijdens de week\nElke dag\n's Middags\nIn het weekend
In de winter\nNa het werk\nVoor het avondeten\nIn de lente\n's Avonds"""),
            "C": _lines("Daarom\nBovendien\nToch\nDaarna\nHelaas\nGelukkig\nNatuurlijk\nMeestal"),
        },
    ),
    _Language(
        "ru", "rus", "ru",
        [
            "{T} {S} {V} {O} {PL}.",
            "{C} {S} {V} {O} {PL}.",
            "Я думаю, что {S} {V} {O} {PL}.",
            "{S} {V} {O}, потому что {S2} {V2} {O2}.",
            "{S} {V} {O}, а {S2} {V2} {O2} {PL}.",
            "{S} не {V} {O} {PL}, но {S2} {V2} {O2}.",
            "Почему {S} {V} {O} {PL}?",
            "Все знают, что {S} {V} {O}.",
        ],
        {
            "S": _lines("""
мой сосед\nучительница\nпекарь\nнаша семья\nдиректор школы\nмолодой инженер\nстарый рыбак
студентка\nврач\nмэр города\nмоя бабушка\nсадовник\nжурналистка\nнаш тренер\nповар
библиотекарь\nмой старший брат\nпочтальон\nхозяин кафе\nмоя коллега"""),
            "O": _lines("""
новую книгу\nстарый дом\nписьмо\nгазету\nсвежий хлеб\nцветы\nвелосипед\nинтересный проект
большую карту\nокна\nкухню\nподарок\nбилеты на поезд\nсемейные фотографии\nгодовой отчёт
овощи из огорода\nрасписание на неделю\nсчёт в ресторане\nяблочный пирог\nприглашение"""),
            "V": _lines("""
покупает\nчитает\nпишет\nготовит\nоткрывает\nзакрывает\nремонтирует\nищет\nнаходит\nпродаёт
изучает\nобъясняет\nрисует\nнесёт\nслушает\nубирает\nпоказывает\nобсуждает\nстроит\nзаказывает"""),
            "PL": _lines("""
в центре города\nна рынке\nвозле реки\nв своём кабинете\nна площади\nв деревне
рядом с вокзалом\nв маленьком магазине\nна берегу озера\nу родителей\nв классе\nв парке"""),
            "T": _lines("""
Утром\nКаждое воскресенье\nЛетом\nЗимой\nВечером\nПо выходным\nПосле работы\nПеред ужином
Каждый день\nВесной\nОсенью\nДнём"""),
            "C": _lines("""
Кроме того,\nОднако\nПоэтому\nКонечно,\nИногда\nВ итоге\nТем временем\nКак правило,
На самом деле\nК счастью,"""),
        },
    ),
    _Language(
        "ja", "jpn", "jp",
        [
            "{T}、{S}は{PL}{O}を{V}。",
            "{C}{S}は{O}を{V}。",
            "{S}は{PL}{O}を{V}が、{S2}は{O2}を{V2}。",
            "{T}、{S}と一緒に{PL}{O}を{V}。",
            "{S}は{O}がとても好きです。",
            "{T}、{S}は{O}と{O2}を{V}。",
            "{S}はいつも{PL}{O}を{V}。",
        ],
        {
            "S": _lines("""
私の友人\n先生\n母\n近所の人\n店の主人\n若い医者\n学生たち\n祖父\n社長\n子供たち
姉\n兄\n図書館の職員\n料理人\n駅員\n私の同僚\n祖母\n父\nパン屋の主人\n新しい先生"""),
            "O": _lines("""
新しい本\n手紙\n朝ご飯\n古い写真\n地図\n花\n自転車\n新聞\n野菜\nお茶\n駅の近くの家
日本語の教科書\n昼ご飯\n赤い傘\n魚\nケーキ\n部屋\n車\n雑誌\n絵"""),
            "V": _lines("""
読みます\n書きます\n作ります\n買います\n見ます\n探します\n運びます\n直します\n売ります
選びます\n洗います\n片付けます\n準備します\n紹介します\n使います\n送ります"""),
            "PL": _lines("""
公園で\n駅の前で\n台所で\n図書館で\n市場で\n会社で\n学校で\n川の近くで\n家で
喫茶店で\n大学で\n町の中心で"""),
            "T": _lines("""
毎朝\n日曜日に\n夏には\n冬には\n仕事の後で\n夕方に\n週末に\n毎日\n春になると\n晩ご飯の前に
休みの日に\n雨の日には"""),
            "C": _lines("""
しかし、\nそれから、\nまた、\nだから、\nときどき\nもちろん、\n実は、\nその後、"""),
        },
        separator="",
    ),
]
FOREIGN_LANGUAGES = tuple(lang.code for lang in _LANGUAGES)
_LANGUAGE_BY_CODE = {lang.code: lang for lang in _LANGUAGES}
_PARSED_FOREIGN = {lang.code: [_parse_template(t) for t in lang.templates] for lang in _LANGUAGES}


def _foreign_article(rng: random.Random, code: str) -> str:
    lang = _LANGUAGE_BY_CODE[code]
    templates = _PARSED_FOREIGN[code]
    target_chars = rng.randint(1800, 4200) // (3 if lang.separator == "" else 1)
    paragraphs, chars = [], 0
    while chars < target_chars:
        sentences = [_fill(rng, rng.choice(templates), lang.pools) for _ in range(rng.randint(3, 6))]
        paragraph = lang.separator.join(sentences)
        paragraphs.append(paragraph)
        chars += len(paragraph)
    return "\n".join(paragraphs)


# ====================================================================== boilerplate sites

_SITE_WORDS = _words(
    "harbour, garden, river, north, maple, copper, lantern, meadow, summit, atlas, beacon, cedar, falcon,"
    "granite, hollow, island, juniper, kettle, linden, orchard, pine, quarry, raven, silver, thistle,"
    "valley, willow, amber, birch, cobalt"
)
_SITE_SUFFIXES = _words("Journal, Gazette, Review, Notes, Weekly, Times, Magazine, Post, Chronicle, Daily")
_NAV_ITEMS = _words(
    "Home, News, Blog, Guides, Reviews, Shop, Events, About, About us, Contact, Contact us, Careers, Help,"
    "FAQ, Newsletter, Subscribe, Log in, Sign in, Register, Search, Archive, Podcasts, Videos, Community,"
    "Forum, Deals, Topics, Opinion, Features, Local"
)
_COOKIE_NOTICES = [
    "We use cookies to give you the best experience on our website. By continuing to browse, you agree to "
    "our use of cookies. Learn more about how we use cookies in our cookie policy.\nAccept all cookies\n"
    "Manage preferences",
    "This website uses cookies to improve your experience and to show you relevant content. You can change "
    "your settings at any time.\nAccept\nReject\nCookie settings",
    "Our site relies on cookies for analytics, personalised content and ads. If you continue to use the "
    "site we will assume that you are happy with it.\nOK\nRead more",
    "We value your privacy. We and our partners store and access information on your device, such as "
    "cookies, to measure and improve our services.\nAgree and close\nShow purposes",
]
_FOOTERS = [
    "Share this article\nFacebook\nTwitter\nEmail\nRelated posts\nSubscribe to our newsletter and never "
    "miss an update.\n© 2024 {site}. All rights reserved.\nPrivacy Policy | Terms of Service | Cookie "
    "Settings | Sitemap",
    "Was this article helpful?\nYes\nNo\nLeave a comment\nYour email address will not be published.\n"
    "Copyright 2024 {site}\nImprint | Privacy | Contact | Advertise with us",
    "More from {site}\nMost read this week\nFollow us on social media\n© {site} 2009-2024. All rights "
    "reserved. Reproduction without permission is prohibited.\nTerms | Privacy | Accessibility",
]


@dataclass(frozen=True)
class _Site:
    host: str
    header: str
    footer: str


def _make_site(rng: random.Random) -> _Site:
    first, second = rng.sample(_SITE_WORDS, 2)
    name = f"{first.title()} {second.title()} {rng.choice(_SITE_SUFFIXES)}"
    nav = rng.sample(_NAV_ITEMS, rng.randint(7, 11))
    header = "\n".join([f"{name} | {rng.choice(_SITE_SUFFIXES)} of {first} and {second}", *nav,
                        rng.choice(_COOKIE_NOTICES)])
    footer = rng.choice(_FOOTERS).format(site=name)
    return _Site(f"www.{first}{second}.{rng.choice(('com', 'org', 'net', 'co.uk'))}", header, footer)


def _boilerplate_page(rng: random.Random, site: _Site) -> str:
    return "\n".join([site.header, _english_article(rng, min_words=rng.randint(260, 600)), site.footer])


# ====================================================================== spam and low quality

_SPAM_KEYWORDS = _words(
    "cheap flights, best price, buy now, discount watches, free shipping, casino bonus, online casino,"
    "weight loss pills, lose weight fast, replica bags, cheap hotels, payday loans, fast cash,"
    "bitcoin investment, crypto signals, make money online, work from home, free iphone, cheap pills,"
    "best deals 2024, top rated, limited offer, hot singles, dating site, seo services, backlinks,"
    "cheap web hosting, vpn deal, forex trading, miracle cure, anti aging cream, followers cheap,"
    "sports betting, slot machines, jackpot, free spins, loan approval, no credit check, luxury watches,"
    "designer shoes sale, outlet store, wholesale prices, best vpn, gift cards free, coupon codes,"
    "promo code, insurance quotes, car insurance cheap, mortgage rates, essay writing service"
)
_SYMBOL_LINES = [
    "★★★★★ ★★★★★ ★★★★★", "##########", "#### #### #### ####", "=========================",
    "»»»»»»»»»»", "|||||||||||||||", "~~~~~~~~~~~~~~~~~~~~", "***** ***** *****", "### ### ###",
    "<<< >>> <<< >>>", "+++++++++++++++", "••••••••••", "◆◆◆◆◆◆◆◆", "///////////////", "#1 #1 #1 #1",
]
_BULLETS = ("• ", "- ", "* ", "· ", "► ")
_BULLET_ITEMS = _words(
    "Free shipping, Money back guarantee, 24/7 support, Best price, Secure checkout, Top quality,"
    "Fast delivery, New arrivals, Gift wrapping, Easy returns, Exclusive deals, Members only,"
    "Limited stock, Bestseller, Trusted by millions, Award winning, Certified, Eco friendly, Made to order,"
    "Official store, Worldwide delivery, Lowest price, Hot deal, Save now, Order today, Special offer,"
    "Clearance sale, Flash sale, Loyalty points, Price match"
)
_TEASERS = [
    "Click here to read more", "You won't believe what happened next", "Find out more", "Continue reading",
    "See the full list", "Read the full story", "Doctors hate this one trick", "Number seven will shock you",
    "Click to see the photos", "Learn the secret", "Watch the video", "Download now", "Claim your prize",
    "Find out why", "Discover the truth", "Only today",
]


def _spam_keyword_list(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(4, 10)):
        lines.append(", ".join(rng.sample(_SPAM_KEYWORDS, rng.randint(8, 20))))
    return "\n".join([f"{rng.choice(_SPAM_KEYWORDS).title()} {rng.randint(1, 999)}", *lines])


def _spam_symbol_lines(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(15, 40)):
        if rng.random() < 0.6:
            lines.append(rng.choice(_SYMBOL_LINES))
        else:
            lines.append(f"{rng.choice(_SYMBOL_LINES)} {rng.choice(_BULLET_ITEMS).upper()} {rng.randint(1, 99)}%")
    return "\n".join(lines)


def _spam_bullet_list(rng: random.Random) -> str:
    bullet = rng.choice(_BULLETS)
    items = [f"{bullet}{rng.choice(_BULLET_ITEMS)} {rng.randint(1, 500)}" for _ in range(rng.randint(20, 45))]
    return "\n".join(items)


def _spam_ellipsis_lines(rng: random.Random) -> str:
    """A teaser page: headlines cut off with "..." and "click here..." lines."""
    pools = _english_pools(rng.randrange(len(_TOPICS)))
    lines = []
    for _ in range(rng.randint(12, 30)):
        if rng.random() < 0.25:
            lines.append(f"{rng.choice(_TEASERS)}...")
        else:
            words = _fill(rng, rng.choice(_PARSED_SENTENCES), pools).rstrip(".?").split(" ")
            lines.append(" ".join(words[: rng.randint(11, 16)]) + rng.choice(("...", "…")))
    return "\n".join(lines)


def _spam_too_short(rng: random.Random) -> str:
    pools = _english_pools(rng.randrange(len(_TOPICS)))
    sentences = [_fill(rng, rng.choice(_PARSED_SENTENCES), pools) for _ in range(rng.randint(1, 2))]
    text = " ".join(sentences)
    return " ".join(text.split(" ")[:40])


def _spam_repetition(rng: random.Random) -> str:
    pools = _english_pools(rng.randrange(len(_TOPICS)))
    line = _fill(rng, rng.choice(_PARSED_SENTENCES), pools)
    other = _fill(rng, rng.choice(_PARSED_SENTENCES), pools)
    lines = [line] * rng.randint(15, 40)
    lines.insert(rng.randrange(len(lines)), other)
    return "\n".join(lines)


_SPAM_GENERATORS: dict[str, Callable[[random.Random], str]] = {
    "keyword_list": _spam_keyword_list,
    "symbol_lines": _spam_symbol_lines,
    "bullet_list": _spam_bullet_list,
    "ellipsis_lines": _spam_ellipsis_lines,
    "too_short": _spam_too_short,
    "repetition": _spam_repetition,
}

# ====================================================================== PII

_MAIL_DOMAINS = _words("example.com, example.org, example.net, mailbox.example, inbox.test, post.example")
_PII_SENTENCES = {
    "email": [
        "If you have any questions, write to {value} and we will answer within two days.",
        "You can reach the organiser directly at {value}.",
        "Send your photos and stories to {value} before the end of the month.",
    ],
    "phone": [
        "For bookings, call {value} on weekdays between nine and five.",
        "The office can be reached by phone at {value}.",
        "Anyone who saw something should ring {value} as soon as possible.",
    ],
    "ipv4": [
        "The form was submitted from the address {value} late in the evening.",
        "Our logs show that the server at {value} handled most of the requests.",
        "Several complaints came from the same address, {value}, within an hour.",
    ],
    "credit_card": [
        "The deposit was paid with the card {value}, which has since been cancelled.",
        "Please do not share card numbers such as {value} in the comments.",
        "The receipt listed the card number {value} in full, which is a serious mistake.",
    ],
}


def _luhn_check_digit(digits: str) -> str:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 0:  # every second digit from the right, counting the check digit to come
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return str((10 - total % 10) % 10)


def luhn_valid(number: str) -> bool:
    digits = re.sub(r"[ -]", "", number)
    return digits.isdigit() and _luhn_check_digit(digits[:-1]) == digits[-1]


def _card_number(rng: random.Random) -> str:
    prefix, length = rng.choice([("4", 16), ("51", 16), ("53", 16), ("55", 16), ("37", 15), ("6011", 16)])
    body = prefix + "".join(rng.choice("0123456789") for _ in range(length - len(prefix) - 1))
    number = body + _luhn_check_digit(body)
    separator = rng.choice((" ", "-", ""))
    if length == 15:
        return separator.join((number[:4], number[4:10], number[10:]))
    return separator.join(number[i : i + 4] for i in range(0, 16, 4))


def _phone_number(rng: random.Random) -> str:
    line = rng.randint(100, 199)  # 555-0100..0199 are reserved for fiction
    area = rng.choice((212, 312, 415, 503, 617, 713))
    return rng.choice(
        (
            f"({area}) 555-0{line - 100:03d}",
            f"{area}-555-0{line - 100:03d}",
            f"+1 {area} 555 0{line - 100:03d}",
            f"+44 20 7946 0{rng.randint(0, 999):03d}",
        )
    )


def _pii_value(rng: random.Random, kind: str) -> str:
    if kind == "email":
        first, last = rng.choice(_FIRST_NAMES).lower(), rng.choice(_SURNAMES).lower()
        local = rng.choice((f"{first}.{last}", f"{first[0]}{last}", f"{first}{rng.randint(1, 99)}"))
        return f"{local}@{rng.choice(_MAIL_DOMAINS)}"
    if kind == "phone":
        return _phone_number(rng)
    if kind == "ipv4":  # a public address: private and reserved ones are not personal data (pii.py)
        while not (address := ipaddress.IPv4Address(".".join(str(rng.randint(1, 254)) for _ in range(4)))).is_global \
                or address.is_multicast:
            pass
        return str(address)
    return _card_number(rng)


def _pii_article(rng: random.Random) -> tuple[str, dict[str, list[str]]]:
    lines = _english_article(rng).split("\n")
    planted: dict[str, list[str]] = {}
    for kind in rng.sample(list(_PII_SENTENCES), rng.randint(2, 4)):
        value = _pii_value(rng, kind)
        planted.setdefault(kind, []).append(value)
        line = rng.randrange(1, len(lines))
        lines[line] += " " + rng.choice(_PII_SENTENCES[kind]).format(value=value)
    return "\n".join(lines), dict(sorted(planted.items()))


# ====================================================================== near duplicates

_INSERTABLE = _words("very, really, also, quite, still, even, just, rather, almost, certainly, perhaps, simply")


def _edit_words(rng: random.Random, text: str, edits: int) -> str:
    """Replace, insert or delete `edits` words at positions at least six words apart."""
    lines = [line.split(" ") for line in text.split("\n")]
    positions = [(li, wi) for li, words in enumerate(lines) for wi in range(len(words))]
    slots = max(1, len(positions) // 6)
    edits = min(edits, slots)
    picked = [min(slot * 6 + rng.randrange(6), len(positions) - 1) for slot in rng.sample(range(slots), edits)]
    chosen = sorted((positions[p] for p in picked), reverse=True)
    for li, wi in chosen:
        words = lines[li]
        operation = rng.choice(("replace", "insert", "delete"))
        if operation == "insert":
            words.insert(wi, rng.choice(_INSERTABLE))
        elif operation == "delete" and len(words) > 1:
            del words[wi]
        else:
            old = words[wi]
            tail = old[len(old.rstrip(".,;:?!")) :]
            words[wi] = rng.choice(_GENERAL_ADJECTIVES) + tail
    return "\n".join(" ".join(words) for words in lines)


def _near_duplicate(rng: random.Random, text: str) -> tuple[str, float]:
    """A copy with a few words changed whose 5-gram Jaccard with `text` is in NEAR_DUP_JACCARD."""
    low, high = NEAR_DUP_JACCARD
    words = text.count(" ") + text.count("\n") + 1
    target = rng.uniform(low + 0.01, high - 0.01)
    edits = max(1, round(words * (1 - target) / (5 * (1 + target))))
    for _ in range(40):
        copy = _edit_words(rng, text, edits)
        similarity = jaccard_5gram(text, copy)
        if low <= similarity <= high:
            return copy, similarity
        edits = edits + 1 if similarity > high else max(1, edits - 1)
    raise RuntimeError("could not plant a near-duplicate in the target similarity range")


def _shingles(text: str) -> set[str]:
    words = text.lower().split()
    if len(words) < 5:
        return {" ".join(words)} if words else set()
    return {" ".join(gram) for gram in zip(words, words[1:], words[2:], words[3:], words[4:])}


def jaccard_5gram(a: str, b: str) -> float:
    """Jaccard similarity of the lowercased word 5-shingle sets of two texts."""
    sa, sb = _shingles(a), _shingles(b)
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)


# ====================================================================== ground truth


@dataclass(frozen=True)
class DocTruth:
    """What was planted in one conversion record."""

    index: int  # position among the file's conversion records, 0-based
    url: str
    record_id: str
    kind: str
    language: str | None
    original_url: str | None = None  # duplicates: the URL of the record they copy
    original_index: int | None = None
    detail: str | None = None  # spam: which kind of spam
    jaccard: float | None = None  # near_dup: 5-gram Jaccard with the original
    pii: dict[str, list[str]] | None = None  # pii: the planted values by type

    def __getitem__(self, key: str):
        """Also readable like the record's JSON object: truth["kind"]."""
        if key not in self.__dataclass_fields__:
            raise KeyError(key)
        return getattr(self, key)


@dataclass
class SampleSummary:
    path: str
    docs: int
    seed: int
    gzip: bool
    size_bytes: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    records: list[DocTruth] = field(default_factory=list)

    @property
    def truth_path(self) -> Path:
        return Path(self.path + ".truth.json")

    def by_kind(self, kind: str) -> list[DocTruth]:
        return [r for r in self.records if r.kind == kind]

    def by_url(self) -> dict[str, list[DocTruth]]:
        """Records per URL, in file order (a url_dup shares its URL with the original, which comes first)."""
        out: dict[str, list[DocTruth]] = {}
        for record in self.records:
            out.setdefault(record.url, []).append(record)
        return out

    def to_dict(self) -> dict:
        return asdict(self)

    def write_json(self, path: str | Path | None = None) -> Path:
        target = Path(path) if path else self.truth_path
        atomic_write_bytes(target, json.dumps(self.to_dict(), indent=1, ensure_ascii=False).encode("utf-8"))
        return target

    @classmethod
    def read_json(cls, path: str | Path) -> SampleSummary:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        data["records"] = [DocTruth(**r) for r in data["records"]]
        return cls(**data)


# ====================================================================== planning


@dataclass
class _Planned:
    kind: str
    language: str | None
    seed: int
    url: str
    detail: str | None = None
    original: _Planned | None = None
    site: _Site | None = None
    order_key: float = 0.0
    index: int = -1  # set once the order is final
    copies_left: int = 0  # duplicates still to be written from this document's text


def _kind_counts(docs: int) -> dict[str, int]:
    """Split `docs` by KIND_WEIGHTS (largest remainder), at least one of each kind when there is room."""
    exact = {k: KIND_WEIGHTS[k] * docs for k in KINDS}
    counts = {k: int(v) for k, v in exact.items()}
    for k in sorted(KINDS, key=lambda k: exact[k] - counts[k], reverse=True)[: docs - sum(counts.values())]:
        counts[k] += 1
    if docs >= 2 * len(KINDS):
        for k in KINDS:
            if counts[k] == 0:
                counts[k] = 1
                counts["prose"] -= 1
    return counts


class _UrlMaker:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.serial = 0
        self.hosts = [f"{a}{b}.{tld}" for a, b, tld in self._host_parts(200)]

    def _host_parts(self, count: int) -> Iterator[tuple[str, str, str]]:
        seen = set()
        while len(seen) < count:
            tld = self.rng.choice(("com", "org", "net", "info", "blog"))
            parts = (self.rng.choice(_SITE_WORDS), self.rng.choice(_SITE_WORDS), tld)
            if parts[0] != parts[1] and parts not in seen:
                seen.add(parts)
                yield parts

    def make(self, host: str | None = None, tld: str | None = None) -> str:
        self.serial += 1
        if host is None:
            host = self.rng.choice(self.hosts)
            if tld:
                host = host.rsplit(".", 1)[0] + "." + tld
        topic = self.rng.choice(_TOPICS)
        slug = "-".join([self.rng.choice(topic.adjectives), *self.rng.sample(topic.nouns, 2)]).replace(" ", "-")
        section = self.rng.choice(("blog", "articles", "news", "guides", "stories", "2023", "2024"))
        return f"https://{host}/{section}/{slug.lower()}-{self.serial}"


def _plan(docs: int, seed: int) -> list[_Planned]:
    rng = random.Random(seed)
    counts = _kind_counts(docs)
    urls = _UrlMaker(rng)
    sites = [_make_site(rng) for _ in range(max(1, min(40, counts["boilerplate"] // 20)))]

    def planned(kind: str, language: str | None, **extra) -> _Planned:
        return _Planned(kind, language, rng.getrandbits(64), extra.pop("url", None) or urls.make(), **extra)

    base: list[_Planned] = []
    base += [planned("prose", "en") for _ in range(counts["prose"])]
    base += [planned("pii", "en") for _ in range(counts["pii"])]
    for i in range(counts["foreign"]):
        code = FOREIGN_LANGUAGES[i % len(FOREIGN_LANGUAGES)]
        base.append(planned("foreign", code, url=urls.make(tld=_LANGUAGE_BY_CODE[code].tld)))
    for i in range(counts["boilerplate"]):
        site = sites[i % len(sites)]
        base.append(planned("boilerplate", "en", site=site, url=urls.make(host=site.host)))
    base += [planned("spam", "en", detail=SPAM_KINDS[i % len(SPAM_KINDS)]) for i in range(counts["spam"])]
    rng.shuffle(base)
    for position, doc in enumerate(base):
        doc.order_key = position

    originals = [doc for doc in base if doc.kind == "prose"]
    duplicates = []
    if originals:
        for kind in DUPLICATE_KINDS:
            for original in _pick(rng, originals, counts[kind]):
                url = original.url if kind == "url_dup" else urls.make()
                dup = planned(kind, "en", url=url, original=original)
                # a copy comes after its original, anywhere later in the file
                dup.order_key = original.order_key + (len(base) - original.order_key) * (1.0 - rng.random())
                if kind != "url_dup":
                    original.copies_left += 1
                duplicates.append(dup)
    ordered = sorted(base + duplicates, key=lambda d: d.order_key)
    for index, doc in enumerate(ordered):
        doc.index = index
    return ordered


def _pick(rng: random.Random, population: list[_Planned], count: int) -> list[_Planned]:
    if count <= len(population):
        return rng.sample(population, count)
    return [rng.choice(population) for _ in range(count)]


# ====================================================================== text for a planned record


def _document_text(doc: _Planned, texts: dict[int, str]) -> tuple[str, dict]:
    """The text of one planned record and the extra truth fields it carries."""
    rng = random.Random(doc.seed)
    if doc.kind in ("prose", "url_dup"):
        return _english_article(rng), {}
    if doc.kind == "foreign":
        return _foreign_article(rng, doc.language), {}
    if doc.kind == "boilerplate":
        return _boilerplate_page(rng, doc.site), {}
    if doc.kind == "spam":
        return _SPAM_GENERATORS[doc.detail](rng), {"detail": doc.detail}
    if doc.kind == "pii":
        text, planted = _pii_article(rng)
        return text, {"pii": planted}
    original = texts[doc.original.index]
    if doc.kind == "exact_dup":
        return original, {}
    text, similarity = _near_duplicate(rng, original)
    return text, {"jaccard": round(similarity, 4)}


def _unique_text(doc: _Planned, texts: dict[int, str], seen: set[bytes]) -> tuple[str, dict]:
    """Base documents never collide by accident, so every exact duplicate in the file is planted."""
    for _ in range(20):
        text, extra = _document_text(doc, texts)
        digest = hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()
        if doc.kind == "exact_dup" or digest not in seen:
            seen.add(digest)
            return text, extra
        doc.seed = random.Random(doc.seed).getrandbits(64)
    raise RuntimeError(f"could not generate a unique {doc.kind} document")


# ====================================================================== WARC output


def _record_id(rng: random.Random) -> str:
    return f"<urn:uuid:{uuid.UUID(int=rng.getrandbits(128), version=4)}>"


def _block_digest(payload: bytes) -> str:
    return "sha1:" + base64.b32encode(hashlib.sha1(payload).digest()).decode("ascii")  # noqa: S324 - WARC format


def _warc_date(index: int) -> str:
    return (BASE_DATE + _dt.timedelta(seconds=3 * index)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _warc_record(headers: list[tuple[str, str]], payload: bytes) -> bytes:
    lines = ["WARC/1.0", *(f"{name}: {value}" for name, value in headers), f"Content-Length: {len(payload)}", "", ""]
    return "\r\n".join(lines).encode("utf-8") + payload + b"\r\n\r\n"


def _warcinfo_record(rng: random.Random, filename: str, docs: int, seed: int) -> bytes:
    fields = [
        "Software-Info: lmforge-sample-data",
        "Extracted-Date: Sat, 18 May 2024 00:00:00 GMT",
        f"isPartOf: {CRAWL_NAME}",
        "operator: lmforge (synthetic sample, not crawled)",
        f"description: Synthetic WET sample, docs={docs}, seed={seed}",
        "publisher: lmforge",
    ]
    payload = ("\r\n".join(fields) + "\r\n\r\n").encode("utf-8")
    headers = [
        ("WARC-Type", "warcinfo"),
        ("WARC-Date", BASE_DATE.strftime("%Y-%m-%dT%H:%M:%SZ")),
        ("WARC-Filename", filename),
        ("WARC-Record-ID", _record_id(rng)),
        ("WARC-Block-Digest", _block_digest(payload)),
        ("Content-Type", "application/warc-fields"),
    ]
    return _warc_record(headers, payload)


def _conversion_record(doc: _Planned, text: str, record_id: str, refers_to: str) -> bytes:
    payload = (text + "\n").encode("utf-8")
    headers = [
        ("WARC-Type", "conversion"),
        ("WARC-Target-URI", doc.url),
        ("WARC-Date", _warc_date(doc.index)),
        ("WARC-Record-ID", record_id),
        ("WARC-Refers-To", refers_to),
        ("WARC-Block-Digest", _block_digest(payload)),
    ]
    if doc.language and doc.kind != "spam":
        headers.append(("WARC-Identified-Content-Language", _warc_language(doc.language)))
    headers.append(("Content-Type", "text/plain"))
    return _warc_record(headers, payload)


def _warc_language(code: str) -> str:
    return "eng" if code == "en" else _LANGUAGE_BY_CODE[code].warc_code


def write_sample_wet(
    path: str | Path,
    docs: int,
    seed: int,
    *,
    gzip_output: bool | None = None,
    write_truth: bool = False,
) -> SampleSummary:
    """Write a synthetic WET file of `docs` conversion records; see the module docstring.

    gzip_output defaults to whether `path` ends in `.gz` (one gzip member per record).
    With write_truth, the summary is also written to `<path>.truth.json`."""
    if docs < 0:
        raise ValueError(f"docs must be >= 0, got {docs}")
    path = Path(path)
    use_gzip = path.name.endswith(".gz") if gzip_output is None else gzip_output
    ids = random.Random(f"record-ids:{seed}")
    plan = _plan(docs, seed)
    summary = SampleSummary(path=str(path), docs=docs, seed=seed, gzip=use_gzip)
    texts: dict[int, str] = {}  # originals whose copies are still to come
    seen: set[bytes] = set()

    def encode(record: bytes) -> bytes:
        return zlib.compress(record, GZIP_LEVEL, wbits=31) if use_gzip else record

    with atomic_open(path) as out:
        out.write(encode(_warcinfo_record(ids, path.name, docs, seed)))
        for doc in plan:
            text, extra = _unique_text(doc, texts, seen)
            record_id, refers_to = _record_id(ids), _record_id(ids)
            out.write(encode(_conversion_record(doc, text, record_id, refers_to)))
            summary.records.append(_truth(doc, record_id, extra))
            _remember_for_copies(doc, text, texts)
    summary.size_bytes = path.stat().st_size
    summary.counts = dict(Counter(r.kind for r in summary.records))
    if write_truth:
        summary.write_json()
    return summary


def _remember_for_copies(doc: _Planned, text: str, texts: dict[int, str]) -> None:
    if doc.copies_left:
        texts[doc.index] = text
    if doc.original is not None and doc.kind != "url_dup":
        doc.original.copies_left -= 1
        if doc.original.copies_left == 0:
            del texts[doc.original.index]


def _truth(doc: _Planned, record_id: str, extra: dict) -> DocTruth:
    original = doc.original
    return DocTruth(
        index=doc.index,
        url=doc.url,
        record_id=record_id,
        kind=doc.kind,
        language=doc.language,
        original_url=original.url if original else None,
        original_index=original.index if original else None,
        **extra,
    )
