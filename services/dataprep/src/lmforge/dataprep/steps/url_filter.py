"""URL filter: domain and URL blocklists from the user's files, plus built-in adult-content TLDs
and banned words in URLs.

The lists a user provides can be UT1 blocklists (Université Toulouse 1 Capitole, the lists
RefinedWeb and FineWeb used: a directory per category, e.g. `adult/`, each holding a `domains`
and a `urls` file, one entry per line) or plain files of domains or URLs; any of them may be
gzip-compressed. A domain entry blocks the domain and every subdomain of it; a URL entry blocks
the URLs it is a prefix of (scheme left out, at a path boundary), as squidGuard reads UT1's
`urls` files. Matching a host walks its suffixes through one dict ("a.b.example.com",
"b.example.com", "example.com", "com"), so its cost does not grow with the lists.

The banned-word rules follow datatrove's URLFilter (which FineWeb ran): a hard-banned word as a
token of the URL drops it, soft-banned words drop it from `soft_word_threshold` distinct hits,
and a banned subword anywhere in the host (letters and digits only) drops it. The word lists
here are lmforge's own, short ones; extend or replace them in the settings.
"""

from __future__ import annotations

import gzip
import io
import re
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from lmforge.common.errors import InputError
from lmforge.common.storage import open_input
from lmforge.dataprep.document import Document
from lmforge.dataprep.step_base import BaseFilter
from lmforge.dataprep.step_registry import StepSettings

ADULT_TLDS = ["xxx", "adult", "porn", "sex"]
BANNED_WORDS = ["porn", "porno", "pornhub", "xvideos", "xhamster", "hentai", "bukkake", "gangbang",
                "blowjob", "camgirl", "camgirls", "milf", "nsfw"]
SOFT_BANNED_WORDS = ["adult", "amateur", "babes", "cam", "cams", "dating", "erotic", "erotica", "escort",
                     "escorts", "fetish", "hardcore", "horny", "naked", "nude", "nudes", "sex", "sexy",
                     "strip", "teen", "teens", "webcam", "xxx"]
BANNED_SUBWORDS = ["porn", "hentai", "xvideo", "xhamster", "bukkake", "sexcam", "camgirl"]

_NOT_ALNUM = re.compile(r"[^a-z0-9]+")


class UrlFilterSettings(StepSettings):
    blocklist_dirs: list[str] = Field(
        default_factory=list,
        description="UT1-format blocklist roots (local directories holding one directory per category, each "
                    "with `domains` and/or `urls` files, gzip allowed); `categories` picks the categories "
                    "(source: UT1 blacklists, dsi.ut-capitole.fr/blacklists; used by RefinedWeb and FineWeb)")
    categories: list[str] = Field(
        default_factory=lambda: ["adult"],
        description="UT1 categories to use from each blocklist directory (FineWeb and datatrove use `adult`)")
    domain_files: list[str] = Field(
        default_factory=list,
        description="files of domains to block, one a line (gzip allowed); each blocks the domain and its subdomains")
    url_files: list[str] = Field(
        default_factory=list,
        description="files of URLs to block, one a line without scheme (gzip allowed); an entry blocks the URLs "
                    "it is a prefix of at a path boundary, as UT1/squidGuard `urls` lists mean it")
    allow_domain_files: list[str] = Field(
        default_factory=list,
        description="files of domains exempt from every rule of this step (with their subdomains)")
    allow_domains: list[str] = Field(default_factory=list, description="domains exempt from every rule, inline")
    adult_tlds: list[str] = Field(
        default_factory=lambda: list(ADULT_TLDS),
        description="top-level domains dropped outright (sTLDs for adult content: .xxx, .adult, .porn, .sex; "
                    "ICANN); [] turns the rule off")
    banned_words: list[str] = Field(
        default_factory=lambda: list(BANNED_WORDS),
        description="a URL holding one of these as a token (split on non-alphanumerics) is dropped "
                    "(datatrove URLFilter's hard-banned words; lmforge's own short list)")
    soft_banned_words: list[str] = Field(
        default_factory=lambda: list(SOFT_BANNED_WORDS),
        description="a URL holding `soft_word_threshold` distinct ones of these as tokens is dropped "
                    "(datatrove URLFilter's soft-banned words; lmforge's own short list)")
    soft_word_threshold: int = Field(
        2, ge=1, description="distinct soft-banned words that drop a URL (datatrove URLFilter default: 2)")
    banned_subwords: list[str] = Field(
        default_factory=lambda: list(BANNED_SUBWORDS),
        description="dropped when found anywhere in the host with its dots and dashes removed "
                    "(datatrove URLFilter's banned subwords, which it looks for in the whole URL)")

    @field_validator("blocklist_dirs")
    @classmethod
    def _dirs_exist(cls, value: list[str]) -> list[str]:
        for path in value:
            if not Path(path).is_dir():
                raise ValueError(f"blocklist directory not found: {path}")
        return value

    @model_validator(mode="after")
    def _categories_present(self) -> UrlFilterSettings:
        for root in self.blocklist_dirs:
            if not any(_category_files(root, category) for category in self.categories):
                raise ValueError(f"blocklist directory {root} has no domains or urls file (gzip allowed) in any of "
                                 f"the categories {', '.join(self.categories)}")
        return self

    @field_validator("domain_files", "url_files", "allow_domain_files")
    @classmethod
    def _files_exist(cls, value: list[str]) -> list[str]:
        for path in value:
            if "://" not in path and not Path(path).is_file():
                raise ValueError(f"list file not found: {path}")
        return value


def normalize_host(host: str) -> str:
    """Lowercase, no trailing dot, no leading `www.`, internationalized names in punycode (IDNA)."""
    host = host.strip().lower().rstrip(".")
    if host.startswith("www."):
        host = host[4:]
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            pass  # not a valid IDN: kept as written, it can still match a list written the same way
    return host


def _split_url(url: str) -> tuple[str, str]:
    """(normalized host, the rest after the host: path and query, lowercased); ("", "") if unparsable."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
    except ValueError:
        return "", ""
    rest = parts.path or ""
    if parts.query:
        rest += "?" + parts.query
    return normalize_host(host), rest.lower()


def _normalize_url_entry(entry: str) -> str:
    """A list's URL entry as `host/path` (no scheme, host normalized, lowercase, no trailing slash)."""
    entry = entry.strip()
    if "://" in entry:
        entry = entry.split("://", 1)[1]
    host, sep, rest = entry.partition("/")
    return (normalize_host(host.split(":", 1)[0]) + sep + rest.lower()).rstrip("/")


def _read_lines(path: str) -> Iterator[str]:
    """Non-blank, non-comment lines of a list file, gzip or not (told by its magic bytes)."""
    with open_input(path) as raw:
        data = raw.read()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise InputError(f"list file {path} is not valid gzip: {exc}") from exc
    for line in io.StringIO(data.decode("utf-8", errors="replace")):
        line = line.strip()
        if line and not line.startswith("#"):
            yield line


def _host_suffixes(host: str) -> Iterator[str]:
    while host:
        yield host
        _, _, host = host.partition(".")


def _url_prefixes(host: str, rest: str) -> Iterator[str]:
    """`host/path...` cut at each path boundary, longest first: the URL entries that would match."""
    base = host + rest.split("#", 1)[0]
    yield base.rstrip("/")
    path_end = len(host) + len(rest.split("?", 1)[0].split("#", 1)[0])
    if path_end < len(base):
        yield base[:path_end].rstrip("/")
    cut = base.rfind("/", 0, path_end)
    while cut >= len(host):
        yield base[:cut].rstrip("/")
        cut = base.rfind("/", 0, cut)


class UrlFilter(BaseFilter):
    """Drops documents by their URL. Reasons, in the order checked:
    - `blocked_domain`: the host or a parent domain is on a domain list;
    - `blocked_url`: a URL list entry is a prefix of the URL (scheme left out, path boundary);
    - `adult_tld`: the host's top-level domain is in `adult_tlds`;
    - `banned_url_word`: a hard-banned word is a token of the URL;
    - `soft_banned_url_words`: `soft_word_threshold` distinct soft-banned words are tokens of the URL;
    - `banned_url_subword`: a banned subword occurs in the host (letters and digits only).
    Hosts on an allow list (or under an allowed domain) pass every rule. Each drop also counts
    `list:<name>` for the list that matched: a UT1 category's name, a file's name, or one of
    `adult_tlds`, `banned_words`, `soft_banned_words`, `banned_subwords`. Documents without a
    usable URL pass (counted as `no_url`).
    """

    type_name = "url_filter"
    Settings = UrlFilterSettings

    def __init__(self, settings: UrlFilterSettings | None = None, name: str | None = None) -> None:
        super().__init__(name)
        self.settings = settings = settings or UrlFilterSettings()
        lists = _load_blocklists(tuple(_list_files(settings)), tuple(settings.allow_domains),
                                 tuple(settings.allow_domain_files))
        self.list_names, self._domains, self._urls, self._url_hosts, self._allowed = lists
        self._adult_tlds = frozenset(tld.lower().lstrip(".") for tld in settings.adult_tlds)
        self._banned_words = frozenset(w.lower() for w in settings.banned_words)
        self._soft_words = frozenset(w.lower() for w in settings.soft_banned_words)
        subwords = sorted({_NOT_ALNUM.sub("", w.lower()) for w in settings.banned_subwords} - {""})
        self._subwords = re.compile("|".join(map(re.escape, subwords))) if subwords else None

    def _count(self, list_name: str) -> None:
        self.stats.counters[f"list:{list_name}"] += 1

    def filter(self, doc: Document) -> tuple[bool, str | None]:
        host, rest = _split_url(doc.url)
        if not host:
            self.stats.counters["no_url"] += 1
            return True, None
        if self._allowed and any(map(self._allowed.__contains__, _host_suffixes(host))):
            self.stats.counters["allow_listed"] += 1
            return True, None
        if self._domains:
            for suffix in _host_suffixes(host):
                index = self._domains.get(suffix)
                if index is not None:
                    self._count(self.list_names[index])
                    return False, "blocked_domain"
        if host in self._url_hosts:
            for prefix in _url_prefixes(host, rest):
                index = self._urls.get(prefix)
                if index is not None:
                    self._count(self.list_names[index])
                    return False, "blocked_url"
        if host.rpartition(".")[2] in self._adult_tlds:
            self._count("adult_tlds")
            return False, "adult_tld"
        tokens = set(_NOT_ALNUM.split(f"{host}{rest}"))
        if not self._banned_words.isdisjoint(tokens):
            self._count("banned_words")
            return False, "banned_url_word"
        if len(self._soft_words.intersection(tokens)) >= self.settings.soft_word_threshold:
            self._count("soft_banned_words")
            return False, "soft_banned_url_words"
        if self._subwords is not None and self._subwords.search(_NOT_ALNUM.sub("", host)):
            self._count("banned_subwords")
            return False, "banned_url_subword"
        return True, None


def _list_files(settings: UrlFilterSettings) -> Iterator[tuple[str, str, str]]:
    """(list name, "domains" or "urls", path) of every list file the settings name."""
    for root in settings.blocklist_dirs:
        for category in settings.categories:
            for kind, path in _category_files(root, category):
                yield category, kind, path
    for path in settings.domain_files:
        yield _file_list_name(path), "domains", path
    for path in settings.url_files:
        yield _file_list_name(path), "urls", path


class _Blocklists(NamedTuple):
    list_names: list[str]
    domains: dict[str, int]  # normalized domain -> index in list_names
    urls: dict[str, int]  # normalized `host/path` -> index in list_names
    url_hosts: frozenset[str]
    allowed: frozenset[str]


@lru_cache(maxsize=4)
def _load_blocklists(files: tuple[tuple[str, str, str], ...], allow_domains: tuple[str, ...],
                     allow_files: tuple[str, ...]) -> _Blocklists:
    """The lookup tables of a set of list files, loaded once per process: a worker builds its
    steps for every input, and a million-domain list takes a second or two to load."""
    names: list[str] = []
    domains: dict[str, int] = {}
    urls: dict[str, int] = {}
    for list_name, kind, path in files:
        if list_name not in names:
            names.append(list_name)
        index = names.index(list_name)
        if kind == "domains":
            domains.update(dict.fromkeys(map(normalize_host, _read_lines(path)), index))
        else:
            urls.update(dict.fromkeys(map(_normalize_url_entry, _read_lines(path)), index))
    domains.pop("", None)
    allowed = {normalize_host(domain) for domain in allow_domains}
    for path in allow_files:
        allowed.update(map(normalize_host, _read_lines(path)))
    return _Blocklists(names, domains, urls, frozenset(entry.partition("/")[0] for entry in urls), frozenset(allowed))


def _category_files(root: str, category: str) -> list[tuple[str, str]]:
    """("domains" or "urls", path) of the list files of one UT1 category (plain or .gz)."""
    found = []
    for kind in ("domains", "urls"):
        for candidate in (Path(root) / category / kind, Path(root) / category / f"{kind}.gz"):
            if candidate.is_file():
                found.append((kind, str(candidate)))
    return found


def _file_list_name(path: str) -> str:
    """A list file's name in the counters: its file name without `.gz` (and without `.txt`)."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return name.removesuffix(".gz").removesuffix(".txt")
