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
Output depends only on (docs, seed): no wall clock, no uuid4. The words, phrases and templates
come from the package's data files (vocabulary.py); the code here only combines them.
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

from lmforge.common.atomic_files import atomic_open, atomic_write_bytes
from lmforge.sample_data.vocabulary import FOREIGN_LANGUAGES, english, languages, web

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

# ====================================================================== English


def _plural(noun: str) -> str:
    head, _, last = noun.rpartition(" ")
    prefix = head + " " if head else ""
    irregular = english().irregular_plural
    if last in irregular:
        return prefix + irregular[last]
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
    irregular = english().irregular_past
    if verb in irregular:
        return irregular[verb]
    if verb in english().doubled_final:
        return verb + verb[-1] + "ed"
    if verb.endswith("e"):
        return verb + "d"
    if verb.endswith("y") and verb[-2:-1] not in "aeiou":
        return verb[:-1] + "ied"
    return verb + "ed"


def _gerund(verb: str) -> str:
    if verb in english().doubled_final:
        return verb + verb[-1] + "ing"
    if verb.endswith("ie"):
        return verb[:-2] + "ying"
    if verb.endswith("e") and not verb.endswith(("ee", "ye", "oe")):
        return verb[:-1] + "ing"
    return verb + "ing"


def _with_article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


_SLOT = re.compile(r"\{([A-Z]+)(\d?)\}")
Template = tuple[str, tuple[tuple[str, str], ...]]  # a template and its slots as (placeholder, pool) pairs


def _parse_template(template: str) -> Template:
    """'{S} {V} {O2}.' -> the template and its slots as (placeholder, pool) pairs."""
    slots = tuple(dict.fromkeys((m.group(1) + m.group(2), m.group(1)) for m in _SLOT.finditer(template)))
    return template, slots


@functools.cache
def _sentence_templates() -> list[Template]:
    return [_parse_template(t) for t in english().sentence_templates]


@functools.cache
def _title_templates() -> list[Template]:
    return [_parse_template(t) for t in english().title_templates]


@functools.cache
def _foreign_templates(code: str) -> list[Template]:
    return [_parse_template(t) for t in languages()[code].templates]


_POOL_SEED = 20240522  # the vocabulary pools are fixed; only the per-document choices depend on the seed


@functools.cache
def _english_pools(topic_index: int) -> dict[str, list[str]]:
    """Phrase pools for one topic: noun phrases with determiners, verb forms, people, times..."""
    vocab = english()
    topic = vocab.topics[topic_index]
    rng = random.Random(_POOL_SEED + topic_index)
    adjectives = topic.adjectives * 3 + vocab.general_adjectives
    verbs = topic.verbs * 2 + vocab.general_verbs
    singular = _noun_phrases(rng, topic.nouns, adjectives, plural=False, count=700)
    plural = _noun_phrases(rng, topic.nouns, adjectives, plural=True, count=500)
    mass_determiners = ("the", "some", "more", "enough", "our", "their", "fresh")
    mass = [f"{det} {noun}" for det in mass_determiners for noun in topic.mass]
    people = vocab.roles + vocab.first_names + [f"{rng.choice(vocab.first_names)} {s}" for s in vocab.surnames]
    places = vocab.places + [
        f"{rng.choice(vocab.prepositions)} the {rng.choice(vocab.landmark_adjectives)}{rng.choice(vocab.landmarks)}"
        for _ in range(300)
    ]
    reasons = vocab.reasons + [
        rng.choice(vocab.purposes).format(VB=rng.choice(verbs), O=rng.choice(singular + plural),
                                          SP=rng.choice(vocab.groups))
        for _ in range(300)
    ]
    return {
        "S": singular + people * 2,
        "SP": plural + vocab.groups * 3,
        "O": singular + plural + mass,
        "V": [_third_person(v) for v in verbs],
        "VP": [_past(v) for v in verbs],
        "VB": verbs,
        "VING": [_gerund(v) for v in verbs],
        "TH": vocab.habit_times,
        "TP": vocab.past_times,
        "C": vocab.connectors,
        "ADV": vocab.adverbs,
        "PL": sorted(set(places)),
        "R": sorted(set(reasons)),
        "A": adjectives,
        "AN": [_with_article(a) for a in adjectives],
        "N": topic.nouns,
        "NS": [_plural(n) for n in topic.nouns],
        "P": people,
        "NUM": vocab.numbers,
        "PCT": vocab.percents,
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


def _fill(rng: random.Random, parsed: Template, pools: dict[str, list[str]]) -> str:
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
        topic_index = rng.randrange(len(english().topics))
    pools = _english_pools(topic_index)
    paragraphs, words = [], 0
    while words < min_words:
        sentences = [_fill(rng, rng.choice(_sentence_templates()), pools) for _ in range(rng.randint(3, 7))]
        paragraph = " ".join(sentences)
        paragraphs.append(paragraph)
        words += paragraph.count(" ") + 1
    return paragraphs


def _english_title(rng: random.Random, topic_index: int) -> str:
    return _fill(rng, rng.choice(_title_templates()), _english_pools(topic_index))


def _english_article(rng: random.Random, min_words: int | None = None) -> str:
    topic_index = rng.randrange(len(english().topics))
    min_words = min_words or rng.randint(380, 850)
    return "\n".join([_english_title(rng, topic_index), *_english_paragraphs(rng, min_words, topic_index)])


# ====================================================================== other languages


def _foreign_article(rng: random.Random, code: str) -> str:
    lang = languages()[code]
    templates = _foreign_templates(code)
    target_chars = rng.randint(1800, 4200) // (3 if lang.separator == "" else 1)
    paragraphs, chars = [], 0
    while chars < target_chars:
        sentences = [_fill(rng, rng.choice(templates), lang.pools) for _ in range(rng.randint(3, 6))]
        paragraph = lang.separator.join(sentences)
        paragraphs.append(paragraph)
        chars += len(paragraph)
    return "\n".join(paragraphs)


# ====================================================================== boilerplate sites


@dataclass(frozen=True)
class _Site:
    host: str
    header: str
    footer: str


def _make_site(rng: random.Random) -> _Site:
    words = web()
    first, second = rng.sample(words.site_words, 2)
    name = f"{first.title()} {second.title()} {rng.choice(words.site_suffixes)}"
    nav = rng.sample(words.nav_items, rng.randint(7, 11))
    header = "\n".join([f"{name} | {rng.choice(words.site_suffixes)} of {first} and {second}", *nav,
                        rng.choice(words.cookie_notices)])
    footer = rng.choice(words.footers).format(site=name)
    return _Site(f"www.{first}{second}.{rng.choice(('com', 'org', 'net', 'co.uk'))}", header, footer)


def _boilerplate_page(rng: random.Random, site: _Site) -> str:
    return "\n".join([site.header, _english_article(rng, min_words=rng.randint(260, 600)), site.footer])


# ====================================================================== spam and low quality


def _spam_keyword_list(rng: random.Random) -> str:
    keywords = web().spam_keywords
    lines = []
    for _ in range(rng.randint(4, 10)):
        lines.append(", ".join(rng.sample(keywords, rng.randint(8, 20))))
    return "\n".join([f"{rng.choice(keywords).title()} {rng.randint(1, 999)}", *lines])


def _spam_symbol_lines(rng: random.Random) -> str:
    words = web()
    lines = []
    for _ in range(rng.randint(15, 40)):
        if rng.random() < 0.6:
            lines.append(rng.choice(words.symbol_lines))
        else:
            symbols, item = rng.choice(words.symbol_lines), rng.choice(words.bullet_items)
            lines.append(f"{symbols} {item.upper()} {rng.randint(1, 99)}%")
    return "\n".join(lines)


def _spam_bullet_list(rng: random.Random) -> str:
    words = web()
    bullet = rng.choice(words.bullets)
    items = [f"{bullet}{rng.choice(words.bullet_items)} {rng.randint(1, 500)}" for _ in range(rng.randint(20, 45))]
    return "\n".join(items)


def _spam_ellipsis_lines(rng: random.Random) -> str:
    """A teaser page: headlines cut off with "..." and "click here..." lines."""
    pools = _english_pools(rng.randrange(len(english().topics)))
    lines = []
    for _ in range(rng.randint(12, 30)):
        if rng.random() < 0.25:
            lines.append(f"{rng.choice(web().teasers)}...")
        else:
            words = _fill(rng, rng.choice(_sentence_templates()), pools).rstrip(".?").split(" ")
            lines.append(" ".join(words[: rng.randint(11, 16)]) + rng.choice(("...", "…")))
    return "\n".join(lines)


def _spam_too_short(rng: random.Random) -> str:
    pools = _english_pools(rng.randrange(len(english().topics)))
    sentences = [_fill(rng, rng.choice(_sentence_templates()), pools) for _ in range(rng.randint(1, 2))]
    text = " ".join(sentences)
    return " ".join(text.split(" ")[:40])


def _spam_repetition(rng: random.Random) -> str:
    pools = _english_pools(rng.randrange(len(english().topics)))
    line = _fill(rng, rng.choice(_sentence_templates()), pools)
    other = _fill(rng, rng.choice(_sentence_templates()), pools)
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
        first, last = rng.choice(english().first_names).lower(), rng.choice(english().surnames).lower()
        local = rng.choice((f"{first}.{last}", f"{first[0]}{last}", f"{first}{rng.randint(1, 99)}"))
        return f"{local}@{rng.choice(web().mail_domains)}"
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
    for kind in rng.sample(list(web().pii_sentences), rng.randint(2, 4)):
        value = _pii_value(rng, kind)
        planted.setdefault(kind, []).append(value)
        line = rng.randrange(1, len(lines))
        lines[line] += " " + rng.choice(web().pii_sentences[kind]).format(value=value)
    return "\n".join(lines), dict(sorted(planted.items()))


# ====================================================================== near duplicates


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
            words.insert(wi, rng.choice(web().insertable))
        elif operation == "delete" and len(words) > 1:
            del words[wi]
        else:
            old = words[wi]
            tail = old[len(old.rstrip(".,;:?!")) :]
            words[wi] = rng.choice(english().general_adjectives) + tail
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
            parts = (self.rng.choice(web().site_words), self.rng.choice(web().site_words), tld)
            if parts[0] != parts[1] and parts not in seen:
                seen.add(parts)
                yield parts

    def make(self, host: str | None = None, tld: str | None = None) -> str:
        self.serial += 1
        if host is None:
            host = self.rng.choice(self.hosts)
            if tld:
                host = host.rsplit(".", 1)[0] + "." + tld
        topic = self.rng.choice(english().topics)
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
        base.append(planned("foreign", code, url=urls.make(tld=languages()[code].tld)))
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
    return "eng" if code == "en" else languages()[code].warc_code


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
