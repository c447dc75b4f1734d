"""URL filter: UT1-format blocklists (a directory per category, gzip allowed), plain domain and
URL lists, an allow list, the built-in adult TLDs and banned URL words; each rule drops the URL
built for it with its reason and counts the list that matched."""

from __future__ import annotations

import gzip
import time
from collections import Counter

import pytest

from lmforge.common.errors import ConfigError
from lmforge.dataprep.config import load_dataprep_config
from lmforge.dataprep.document import Document
from lmforge.dataprep.steps.url_filter import UrlFilter, UrlFilterSettings, normalize_host

TEXT = "A page of ordinary prose about gardens."


@pytest.fixture(scope="module")
def lists(tmp_path_factory):
    """A UT1 tree (adult with plain `domains` and gzip `urls`, gambling with `domains`), a plain
    domain file, a gzip URL file and an allow-list file."""
    root = tmp_path_factory.mktemp("ut1")
    ut1 = root / "blacklists"
    (ut1 / "adult").mkdir(parents=True)
    (ut1 / "adult" / "domains").write_text("badsite.example\nwww.other-bad.example\nbücher-nackt.de\n"
                                           "allowed-child.bad.example\nbad.example\n")
    (ut1 / "adult" / "urls.gz").write_bytes(gzip.compress(b"host.example/dir\nmixed.example/a/page.html\n"))
    (ut1 / "gambling").mkdir()
    (ut1 / "gambling" / "domains").write_text("casino.example\n")
    domains = root / "spam-domains.txt"
    domains.write_text("# comment line\nspam.example\n\n")
    urls = root / "my-urls.gz"
    urls.write_bytes(gzip.compress(b"https://files.example/private/\n"))
    allow = root / "allow.txt"
    allow.write_text("allowed-child.bad.example\n")
    return ut1, domains, urls, allow


def _filter(lists, **overrides) -> UrlFilter:
    ut1, domains, urls, allow = lists
    settings = {"blocklist_dirs": [str(ut1)], "domain_files": [str(domains)], "url_files": [str(urls)],
                "allow_domain_files": [str(allow)], **overrides}
    return UrlFilter(UrlFilterSettings(**settings))


CASES = [
    # url, expected reason (None: kept), list counted
    ("https://en.wikipedia.org/wiki/Garden", None, None),
    ("https://badsite.example/index.html", "blocked_domain", "adult"),
    ("http://deep.sub.badsite.example/x", "blocked_domain", "adult"),  # subdomain of a listed domain
    ("https://other-bad.example/", "blocked_domain", "adult"),  # the list's `www.` is normalized away
    ("https://WWW.BADSITE.EXAMPLE/", "blocked_domain", "adult"),  # host case and www. normalized
    ("https://xn--bcher-nackt-thb.de/shop", "blocked_domain", "adult"),  # IDNA: list in Unicode, URL in punycode
    ("https://notbadsite.example/", None, None),  # a suffix match only at a label boundary
    ("https://spam.example/a", "blocked_domain", "spam-domains"),
    ("https://host.example/dir/page.html", "blocked_url", "adult"),  # UT1 url entry as a prefix
    ("https://host.example/dir?id=3", "blocked_url", "adult"),
    ("https://host.example/directory/page", None, None),  # not at a path boundary
    ("https://host.example/other", None, None),
    ("http://www.mixed.example/a/page.html", "blocked_url", "adult"),
    ("https://files.example/private/report.pdf", "blocked_url", "my-urls"),
    ("https://files.example/public/report.pdf", None, None),
    ("https://casino.example/", None, None),  # gambling is not among the selected categories
    ("https://allowed-child.bad.example/page", None, None),  # allow list beats the blocklists
    ("https://shop.allowed-child.bad.example/page", None, None),
    ("https://pictures.xxx/gallery", "adult_tld", "adult_tlds"),
    ("https://example.org/free-porn-videos", "banned_url_word", "banned_words"),
    ("https://example.org/hot-nude-webcam", "soft_banned_url_words", "soft_banned_words"),
    ("https://example.org/sex-education-for-teachers", None, None),  # one soft word is not enough
    ("https://bestpornsite.example.net/", "banned_url_subword", "banned_subwords"),
    ("https://example.org/pornography-essay", None, None),  # subwords are looked for in the host only
    ("not a url", None, None),
]


@pytest.fixture(scope="module")
def filtered(lists):
    step = _filter(lists)
    docs = [Document(i, url, TEXT) for i, (url, _, _) in enumerate(CASES)]
    kept = {doc.url for doc in step.run(docs)}
    return step, kept


@pytest.mark.parametrize(("url", "reason", "list_name"), CASES)
def test_each_rule_drops_the_url_built_for_it(lists, filtered, url, reason, list_name):
    _, kept = filtered
    alone = _filter(lists)
    assert alone.filter(Document(0, url, TEXT)) == (reason is None, reason)
    assert (url in kept) == (reason is None)
    if list_name:
        assert alone.stats.counters == Counter({f"list:{list_name}": 1})


def test_counts_per_reason_and_per_list(filtered):
    step, _ = filtered
    expected = Counter(reason for _, reason, _ in CASES if reason)
    assert step.stats.dropped == expected
    lists = Counter(f"list:{name}" for _, _, name in CASES if name)
    assert {k: v for k, v in step.stats.counters.items() if k.startswith("list:")} == lists
    assert step.stats.counters["allow_listed"] == 2 and step.stats.counters["no_url"] == 1


def test_categories_select_the_ut1_lists(lists):
    step = _filter(lists, categories=["adult", "gambling"])
    assert step.filter(Document(0, "https://casino.example/", TEXT)) == (False, "blocked_domain")
    assert step.stats.counters == Counter({"list:gambling": 1})
    only_gambling = _filter(lists, categories=["gambling"])
    assert only_gambling.filter(Document(0, "https://badsite.example/", TEXT)) == (True, None)


def test_builtin_rules_can_be_turned_off_or_replaced(lists):
    step = _filter(lists, adult_tlds=[], banned_words=["gardening"], soft_banned_words=[], banned_subwords=[])
    assert step.filter(Document(0, "https://pictures.xxx/gallery", TEXT)) == (True, None)
    assert step.filter(Document(0, "https://bestpornsite.example.net/", TEXT)) == (True, None)
    assert step.filter(Document(0, "https://example.org/gardening/tips", TEXT)) == (False, "banned_url_word")


def test_a_large_domain_list_loads_fast_and_matches(tmp_path):
    count = 200_000
    path = tmp_path / "domains.gz"
    path.write_bytes(gzip.compress("".join(f"site{i}.example{i % 7}.com\n" for i in range(count)).encode(),
                                   compresslevel=1))
    # CPU time (a busy machine does not inflate it as it does wall time), against the least work a
    # domain set takes, measured here: unzip, split, a set of the lowercased lines. ~2x on a quiet core.
    started = time.process_time()
    least = {line.strip().lower() for line in gzip.decompress(path.read_bytes()).decode().splitlines()}
    least_seconds = time.process_time() - started
    started = time.process_time()
    step = UrlFilter(UrlFilterSettings(domain_files=[str(path)]))
    load_seconds = time.process_time() - started
    assert len(step._domains) == len(least) == count
    assert load_seconds < 10 * least_seconds, (load_seconds, least_seconds)
    listed = f"site123456.example{123456 % 7}.com"
    assert step.filter(Document(0, f"https://a.{listed}/x", TEXT)) == (False, "blocked_domain")
    assert step.filter(Document(0, f"https://{listed}x/x", TEXT)) == (True, None)


def test_normalize_host():
    assert normalize_host("WWW.Bücher.DE.") == "xn--bcher-kva.de"
    assert normalize_host("www.example.com") == "example.com"


def test_bad_settings_fail_at_load_naming_the_step(tmp_path):
    with pytest.raises(ConfigError, match=r"steps\.url_filter.*blocklist directory not found"):
        load_dataprep_config(None, [f"steps.url_filter.blocklist_dirs=[{tmp_path / 'missing'}]"])
    (tmp_path / "ut1" / "adult").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"steps\.url_filter.*no domains or urls file"):
        load_dataprep_config(None, [f"steps.url_filter.blocklist_dirs=[{tmp_path / 'ut1'}]"])
    with pytest.raises(ConfigError, match=r"steps\.url_filter.*list file not found"):
        load_dataprep_config(None, [f"steps.url_filter.domain_files=[{tmp_path / 'nope.txt'}]"])
    with pytest.raises(ConfigError, match=r"steps\.url_filter.*soft_word_threshold"):
        load_dataprep_config(None, ["steps.url_filter.soft_word_threshold=0"])


def test_the_lists_load_once_per_process(lists):
    # a worker builds its steps again for every input: the loaded tables are shared, not reloaded
    assert _filter(lists)._domains is _filter(lists)._domains
    assert _filter(lists, categories=["gambling"])._domains is not _filter(lists)._domains
