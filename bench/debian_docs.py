"""Real documentation text, labeled by language, from Debian packages.

English: the Linux man-pages project (`manpages`, `manpages-dev`: system calls and C library
pages full of prototypes and code), the man pages of common tools (option tables), the
PostgreSQL reference (SQL examples, HTML and man), the Python library reference (HTML) and the
Debian Reference. Other languages: the manpages-l10n translations (`manpages-de`, `-fr`, ...,
with their `-dev` packages of system call and C library pages), `manpages-ja`, `manpages-ja-dev`,
`manpages-zh`, `manpages-tr` and the Debian Reference translations.

The packages are fetched with `apt-get download` and unpacked with `dpkg -x` into a work
folder (nothing is installed); man pages are rendered with `man -l` (groff, no hyphenation,
no justification, 80 columns, table rules dropped as on a web copy), HTML pages reduced to
their text, the Debian Reference split into its numbered sections. Every document is labeled
with its package's language.

A translated package may carry pages that are still partly or mostly English: manpages-l10n
ships a page once most of its messages are translated and leaves the rest in English, and some
pages are hardly translated at all. `english_share` measures that without any language
identifier: a line is English when it holds at least two English function words ("the", "of",
"which", ...) and more of them than of the page language's function words, and in the page's
language when it holds at least two of that language's function words and more of them than
English ones (for Cyrillic, Greek, Chinese and Japanese: at least four letters of that script).
The share is the English lines' characters over all classified lines' characters. A translated
package's page counts as that language only up to `TRANSLATED_MAX_ENGLISH`; above it the page is
`mixed`, above `UNTRANSLATED_MIN_ENGLISH` `untranslated`, and neither is scored (both are
reported apart, see `bench/langid_eval.py`).
"""

from __future__ import annotations

import gzip
import html
import json
import os
import re
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from html.parser import HTMLParser
from pathlib import Path

ENGLISH_PACKAGES = [
    "manpages", "manpages-dev", "coreutils", "util-linux", "procps", "iproute2", "systemd", "git-man",
    "openssh-client", "rsync", "curl", "tar", "gawk", "grep", "findutils", "sudo", "make", "bash", "sqlite3",
    "postgresql-client-15", "postgresql-doc-15", "python3.11-doc", "debian-reference-en",
]
# package -> lid.176 label of its language
TRANSLATED_PACKAGES = {
    "manpages-cs": "cs", "manpages-da": "da", "manpages-de": "de", "manpages-el": "el", "manpages-es": "es",
    "manpages-fi": "fi", "manpages-fr": "fr", "manpages-hu": "hu", "manpages-id": "id", "manpages-it": "it",
    "manpages-ja": "ja", "manpages-mk": "mk", "manpages-nb": "no", "manpages-nl": "nl", "manpages-pl": "pl",
    "manpages-pt-br": "pt", "manpages-ro": "ro", "manpages-ru": "ru", "manpages-sr": "sr", "manpages-sv": "sv",
    "manpages-tr": "tr", "manpages-uk": "uk", "manpages-vi": "vi", "manpages-zh": "zh",
    # the system call and C library pages (sections 2 and 3), as code-heavy as manpages-dev
    "manpages-cs-dev": "cs", "manpages-da-dev": "da", "manpages-de-dev": "de", "manpages-es-dev": "es",
    "manpages-fr-dev": "fr", "manpages-it-dev": "it", "manpages-ja-dev": "ja", "manpages-nl-dev": "nl",
    "manpages-pl-dev": "pl", "manpages-pt-br-dev": "pt", "manpages-ru-dev": "ru", "manpages-uk-dev": "uk",
    "debian-reference-de": "de", "debian-reference-es": "es", "debian-reference-fr": "fr",
    "debian-reference-id": "id", "debian-reference-it": "it", "debian-reference-ja": "ja",
    "debian-reference-pt": "pt", "debian-reference-pt-br": "pt", "debian-reference-zh-cn": "zh",
    "debian-reference-zh-tw": "zh",
}
MIN_WORDS = 50  # Gopher's minimum document length: shorter pages never reach the dataset
TRANSLATED_MAX_ENGLISH = 0.25
UNTRANSLATED_MIN_ENGLISH = 0.5
_EDGE_PUNCTUATION = "\"'“”‘’«»„‚()[]{}<>.,;:!?…—–-*•·"
# frequent function words, none of them a word of another language of the set
FUNCTION_WORDS = {
    language: frozenset(words.split())
    for language, words in {
        "en": "the of and that which with this these those from are were been has have would should when "
              "where there their they them what about into than then only other such each used using can may "
              "be it not or if as you your",
        "cs": "se na je že pro jako nebo jsou být který která které při",
        "da": "og er at det til med ikke som af på skal kan eller",
        "de": "der die das und ist nicht mit von für werden wird auf den dem eine einer sich oder zu",
        "es": "el los las del que para con una por como este son se es no",
        "fi": "ja on ei että tai kun jos ovat myös voi kanssa tämä",
        "fr": "le les des est une pour dans avec sont qui que pas sur ou du par",
        "hu": "az és hogy nem egy van ha is meg vagy mint csak",
        "id": "dan yang di untuk dengan ini dari tidak akan dapat atau",
        "it": "il che di per con una sono non del della gli è da",
        "nl": "het een van en is niet met voor zijn wordt dat die op",
        "no": "og er at det til med ikke som av på skal kan eller",
        "pl": "się nie jest na do że jak dla lub oraz to przez są być",
        "pt": "os do da que para com uma não são em por é",
        "ro": "și este în cu la pentru care sau nu un o",
        "sv": "och är att det till med inte som av på ska kan eller",
        "tr": "ve bir bu ile için olarak da gibi olan veya",
        "vi": "của và là các có không được cho trong một với này",
    }.items()
}
# languages written in another script: a line with this many letters of it is in that language
SCRIPT_LETTERS = 4
SCRIPTS = {
    "ru": re.compile(r"[\u0400-\u04ff]"), "uk": re.compile(r"[\u0400-\u04ff]"),
    "mk": re.compile(r"[\u0400-\u04ff]"), "sr": re.compile(r"[\u0400-\u04ff]"),
    "el": re.compile(r"[\u0370-\u03ff\u1f00-\u1fff]"),
    "ja": re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]"), "zh": re.compile(r"[\u4e00-\u9fff]"),
}
_SKIPPED_HTML = re.compile(r"(^|/)(genindex[^/]*|py-modindex|search|bookindex|index)\.html$")
_BLOCK_TAGS = frozenset((
    "p", "div", "br", "li", "ul", "ol", "dl", "dt", "dd", "tr", "table", "h1", "h2", "h3", "h4", "h5", "h6",
    "pre", "blockquote", "section", "article", "header", "footer", "title", "hr", "td", "th", "nav",
))
_SECTION = re.compile(r"^\d+\.\d+\. ", re.MULTILINE)
_BOX_DRAWING = re.compile(r"[\u2500-\u257f]")


@dataclass
class Doc:
    doc_id: str
    package: str
    language: str
    kind: str  # man | html | reference
    text: str

    @property
    def translation(self) -> str:
        """`original` (an English package's page), `translated`, `mixed` or `untranslated`."""
        if self.language == "en":
            return "original"
        share = english_share(self.text, self.language)
        if share <= TRANSLATED_MAX_ENGLISH:
            return "translated"
        return "mixed" if share <= UNTRANSLATED_MIN_ENGLISH else "untranslated"


def english_share(text: str, language: str) -> float:
    """Share of the characters of a page's classified lines that are on English lines."""
    english_words, own_words = FUNCTION_WORDS["en"], FUNCTION_WORDS.get(language, frozenset())
    script = SCRIPTS.get(language)
    english = own = 0
    for line in text.splitlines():
        words = [token.strip(_EDGE_PUNCTUATION).lower() for token in line.split()]
        n_english = sum(word in english_words for word in words)
        if script is not None:
            n_own = 2 if len(script.findall(line)) >= SCRIPT_LETTERS else 0
        else:
            n_own = sum(word in own_words for word in words)
        if n_own >= 2 and (script is not None or n_own > n_english):
            own += len(line.strip())
        elif n_english >= 2 and n_english > n_own:
            english += len(line.strip())
    return english / (english + own) if english + own else 0.0


def fetch_packages(packages: list[str], debs: Path) -> dict[str, Path]:
    """`apt-get download` each package not already in `debs`: {package: .deb path}."""
    debs.mkdir(parents=True, exist_ok=True)
    found = {}
    for package in packages:
        matches = sorted(debs.glob(f"{package}_*.deb"))
        if not matches:
            subprocess.run(["apt-get", "download", package], cwd=debs, check=True, capture_output=True)
            matches = sorted(debs.glob(f"{package}_*.deb"))
        found[package] = matches[-1]
    return found


def unpack(deb: Path, root: Path) -> Path:
    target = root / deb.stem
    if not (target / ".unpacked").exists():
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg", "-x", str(deb), str(target)], check=True)
        (target / ".unpacked").touch()
    return target


def render_man(path: Path) -> str | None:
    """Plain text of a man page, or None for a `.so` alias or a page man cannot render."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        head = fh.read(4096)
    first = next((line for line in head.splitlines() if line.strip() and not line.startswith(b'.\\"')), b"")
    if first.startswith(b".so "):
        return None
    env = {**os.environ, "MANWIDTH": "80", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "MAN_KEEP_FORMATTING": ""}
    try:
        result = subprocess.run(
            ["man", "--nh", "--nj", "-l", str(path)], env=env, capture_output=True, timeout=30, check=False
        )
    except subprocess.TimeoutExpired:  # a few pages send groff into a loop
        return None
    if result.returncode != 0:
        return None
    return web_text(result.stdout.decode("utf-8", "replace"))


def web_text(page: str) -> str:
    """A rendered man page as a web copy of it reads (manpages.debian.org and man7.org serve
    HTML tables): table rules drawn with box-drawing characters become spaces."""
    return "\n".join(line.rstrip() for line in _BOX_DRAWING.sub(" ", page).split("\n"))


class _HtmlText(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0
        self.pre = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style", "head"):
            self.skip += 1
        elif tag == "pre":
            self.pre += 1
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style", "head"):
            self.skip = max(0, self.skip - 1)
        elif tag == "pre":
            self.pre = max(0, self.pre - 1)
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data if self.pre else re.sub(r"\s+", " ", data))


def html_text(raw: str) -> str:
    parser = _HtmlText()
    parser.feed(raw)
    lines = (line.rstrip() for line in html.unescape("".join(parser.parts)).splitlines())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def reference_sections(path: Path) -> Iterator[tuple[str, str]]:
    """(section number, text) of each numbered section (1.1, 1.2, ...) of the Debian Reference."""
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    starts = [m.start() for m in _SECTION.finditer(text)]
    for start, end in zip(starts, starts[1:] + [len(text)]):
        section = text[start:end]
        yield section.split(" ", 1)[0], section


def package_documents(package: str, language: str, root: Path) -> Iterator[tuple[str, str, str]]:
    """(doc id, kind, text) for every document of an unpacked package."""
    man_root = root / "usr/share/man"
    if man_root.is_dir():
        pages = sorted(
            p for p in man_root.rglob("*")
            if p.is_file() and not p.is_symlink() and re.fullmatch(r"man\w+", p.parent.name)
            # English packages: only the untranslated pages (usr/share/man/manN/...)
            and (language != "en" or p.parent.parent == man_root)
        )
        with ThreadPoolExecutor(max_workers=2) as pool:
            for page, text in zip(pages, pool.map(render_man, pages)):
                if text:
                    yield f"{package}:{page.relative_to(root)}", "man", text
    for page in sorted(root.rglob("*.html")):
        rel = str(page.relative_to(root))
        if "debian-reference" in rel or _SKIPPED_HTML.search(rel) or "/_static/" in rel:
            continue
        yield f"{package}:{rel}", "html", html_text(page.read_text(encoding="utf-8", errors="replace"))
    for reference in sorted(root.rglob("debian-reference.*.txt.gz")):
        for number, text in reference_sections(reference):
            yield f"{package}:{reference.name}#{number}", "reference", text


def package_corpus(package: str, language: str, deb: Path, workdir: Path) -> tuple[list[Doc], int]:
    """One package's documents of at least MIN_WORDS words (cached per package) and how many
    shorter ones were left out."""
    cache = workdir / "docs" / f"{deb.stem}.jsonl.gz"
    if not cache.exists():
        root = unpack(deb, workdir / "unpacked")
        rows, short = [], 0
        for doc_id, kind, text in package_documents(package, language, root):
            if len(text.split()) < MIN_WORDS:
                short += 1
                continue
            rows.append(asdict(Doc(doc_id, package, language, kind, text)))
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        with gzip.open(tmp, "wt", encoding="utf-8") as fh:
            fh.write(json.dumps({"short": short}) + "\n")
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        tmp.replace(cache)
    with gzip.open(cache, "rt", encoding="utf-8") as fh:
        short = json.loads(fh.readline())["short"]
        names = Doc.__dataclass_fields__.keys()
        return [Doc(**{name: row[name] for name in names}) for row in map(json.loads, fh)], short


def build_corpus(workdir: Path) -> tuple[list[Doc], dict]:
    """Every document of at least MIN_WORDS words, and the package files and counts behind them."""
    labels = {package: "en" for package in ENGLISH_PACKAGES} | TRANSLATED_PACKAGES
    debs = fetch_packages(list(labels), workdir / "debs")
    docs: list[Doc] = []
    short = 0
    for package, language in labels.items():
        package_docs, package_short = package_corpus(package, language, debs[package], workdir)
        docs += package_docs
        short += package_short
    return docs, {"packages": {package: debs[package].name for package in labels}, "short_documents": short}
