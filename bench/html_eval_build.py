"""Build the HTML extraction evaluation set: real documentation text inside realistic boilerplate.

    python bench/html_eval_build.py            # writes tests/fixtures/html_extraction/

The main content of every page is real documentation from Debian packages (fetched with
`apt-get download`, unpacked with `dpkg -x` into a work folder, nothing installed):
- python3.11-doc: the Python 3.11 documentation (PSF License Version 2; its code examples
  also under the Zero-Clause BSD license), Sphinx HTML;
- postgresql-doc-15: the PostgreSQL 15 documentation (the PostgreSQL License, BSD-style),
  DocBook HTML, table-heavy.
Both are in Debian main (DFSG-free) and under permissive licenses.

A page's main content is one section of a source page as published (classes and nesting kept, less
scripts, images and DocBook TOCs; Sphinx's in-page contents lists and permalinks stay but are
not main text), cut at a block boundary to at most MAX_MAIN_CHARS
characters of text. It is wrapped in one of six
templates modelled on real sites, whose boilerplate is navigation menus, sidebars with link
lists, in-page tables of contents (repeating the page's own headings), breadcrumbs, footers,
cookie banners, related-article blocks with teasers (real sentences from other pages),
comments and newsletter boxes:
- sphinx: Sphinx's classic theme (div.related bars, div.sphinxsidebar, div.body role=main);
- rtd: the Read the Docs theme (nav side menu, breadcrumbs, version flyout), code-heavy pages;
- mkdocs: Material for MkDocs (md-header, md-tabs, md-sidebar primary/secondary, <main>, consent);
- blog: a WordPress blog (masthead menu, <article> with entry meta, related posts, comments,
  widget sidebar, cookie notice);
- news: an old div-based news layout with no semantic landmarks and unconventional class names
  (what boilerplate removal must find by itself);
- pgdocs: the postgresql.org documentation site with its table-based navheader/navfooter
  inside the content area, table-heavy pages.

The known main text of a page is the text of the main content placed in it, rendered with
block elements as line breaks (see `render_text`); tokens are whitespace-separated words.
"""

from __future__ import annotations

import argparse
import html
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import lxml.html
from lxml import etree

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "html_extraction"
PACKAGES = ["python3.11-doc", "postgresql-doc-15"]
MAX_MAIN_CHARS = 9000
PY = "usr/share/doc/python3.11/html"
PG = "usr/share/doc/postgresql-doc-15/html"

# (template, package dir, page, XPath of the main element, index of the match)
SOURCES = [
    ("sphinx", PY, "library/json.html", "//div[@class='body']", 0),
    ("sphinx", PY, "tutorial/controlflow.html", "//div[@class='body']", 0),
    ("sphinx", PY, "howto/sorting.html", "//div[@class='body']", 0),
    ("sphinx", PY, "library/textwrap.html", "//div[@class='body']", 0),
    ("sphinx", PY, "tutorial/errors.html", "//div[@class='body']", 0),
    ("rtd", PY, "library/itertools.html", "//div[@class='body']", 0),
    ("rtd", PY, "library/collections.html", "//div[@class='body']", 0),
    ("rtd", PY, "library/argparse.html", "//div[@class='body']", 0),
    ("rtd", PY, "library/re.html", "//div[@class='body']", 0),
    ("rtd", PY, "library/functools.html", "//div[@class='body']", 0),
    ("mkdocs", PY, "howto/logging.html", "//div[@class='body']", 0),
    ("mkdocs", PY, "tutorial/datastructures.html", "//div[@class='body']", 0),
    ("mkdocs", PY, "library/pathlib.html", "//div[@class='body']", 0),
    ("mkdocs", PY, "howto/unicode.html", "//div[@class='body']", 0),
    ("mkdocs", PY, "library/csv.html", "//div[@class='body']", 0),
    ("blog", PY, "faq/design.html", "//div[@class='body']", 0),
    ("blog", PG, "tutorial-transactions.html", "//div[@class='sect1']", 0),
    ("blog", PY, "howto/functional.html", "//div[@class='body']", 0),
    ("blog", PG, "backup-dump.html", "//div[@class='sect1']", 0),
    ("blog", PY, "tutorial/appetite.html", "//div[@class='body']", 0),
    ("news", PY, "faq/general.html", "//div[@class='body']", 0),
    ("news", PG, "mvcc-intro.html", "//div[@class='sect1']", 0),
    ("news", PY, "howto/sockets.html", "//div[@class='body']", 0),
    ("news", PY, "using/unix.html", "//div[@class='body']", 0),
    ("news", PY, "tutorial/floatingpoint.html", "//div[@class='body']", 0),
    ("pgdocs", PG, "datatype-numeric.html", "//div[@class='sect1']", 0),
    ("pgdocs", PG, "functions-string.html", "//div[@class='sect1']", 0),
    ("pgdocs", PG, "runtime-config-resource.html", "//div[@class='sect1']", 0),
    ("pgdocs", PG, "datatype-datetime.html", "//div[@class='sect1']", 0),
    ("pgdocs", PG, "app-psql.html", "//div[@class='refsect1']", 1),
]
LICENSES = {
    PY: "python3.11-doc 3.11.2: PSF License Version 2 (code examples also Zero-Clause BSD)",
    PG: "postgresql-doc-15 15.x: PostgreSQL License",
}
BLOCK_TAGS = {"h1", "h2", "h3", "h4", "h5", "h6", "p", "pre", "table", "tr", "ul", "ol", "li", "dl", "dt", "dd",
              "blockquote", "div", "caption", "thead", "tbody", "tfoot", "br", "section", "article", "header",
              "figure", "figcaption", "hr", "main", "address"}
CELL_TAGS = {"td", "th"}
CONTAINER_TAGS = {"div", "section", "article", "dl", "ul", "ol", "blockquote"}  # truncate() may cut inside


# ---------------------------------------------------------------- sources


def unpack(workdir: Path) -> Path:
    root = workdir / "x"
    if root.exists():
        return root
    subprocess.run(["apt-get", "download", *PACKAGES], cwd=workdir, check=True, capture_output=True)
    for deb in workdir.glob("*.deb"):
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    return root


def clean_main(element) -> etree._Element:
    """The section as published, less scripts, images and in-content TOCs. Classes, ids and
    nesting stay (code blocks keep their highlight <div>s and <span>s, admonitions their
    classes); the permalink anchors (`a.headerlink`, "¶") and the page's own contents list
    (nav.contents) stay in the page but are not main text."""
    for bad in element.xpath(".//script|.//style|.//img|.//iframe|.//form|.//comment()"
                             "|.//div[contains(@class,'toc')]|.//div[@class='navheader']|.//div[@class='navfooter']"):
        bad.drop_tree()
    for node in element.iter():
        if isinstance(node.tag, str):
            for name in [a for a in node.attrib if a.startswith("on") or a == "style"]:
                del node.attrib[name]
    element.tag = "div"
    element.attrib.clear()
    return element


def truncate(element, budget: int = MAX_MAIN_CHARS) -> int:
    """Keep whole blocks while the text stays under `budget` characters, descending into a
    container (div, list, definition list) that does not fit whole; returns the characters kept."""
    used = 0
    for child in list(element):
        size = len(render_text(child))
        if used + size <= budget:
            used += size
        elif used < budget and child.tag in CONTAINER_TAGS and len(child):
            used += truncate(child, budget - used)
            budget = used  # nothing after a cut container
        else:
            element.remove(child)
    return used


def render_text(element) -> str:
    """Text as a browser lays it out: block elements on their own lines, cells apart, inline runs joined."""
    parts: list[str] = []

    def walk(node):
        tag = node.tag if isinstance(node.tag, str) else ""
        if tag == "nav" or (tag and "headerlink" in (node.get("class") or "")):
            return  # the page's own contents list (Sphinx's nav.contents) and permalinks: boilerplate
        if tag in BLOCK_TAGS:
            parts.append("\n")
        elif tag in CELL_TAGS:
            parts.append("\t")
        if node.text and tag:
            parts.append(node.text if tag == "pre" or node.xpath("ancestor::pre") else re.sub(r"\s+", " ", node.text))
        for child in node:
            walk(child)
            if child.tail:
                in_pre = bool(child.xpath("ancestor::pre"))
                parts.append(child.tail if in_pre else re.sub(r"\s+", " ", child.tail))
        if tag in BLOCK_TAGS:
            parts.append("\n")

    walk(element)
    lines = [line.strip() for line in "".join(parts).split("\n")]
    return "\n".join(line for line in lines if line)


def page_title(doc) -> str:
    title = doc.findtext(".//title") or ""
    return re.sub(r"\s+", " ", title).strip()


def collect(root: Path):
    pages = []
    titles: list[str] = []
    teasers: list[str] = []
    for rel_dir, pattern in ((PY, "library/*.html"), (PY, "howto/*.html"), (PG, "sql-*.html"), (PG, "tutorial-*.html")):
        for path in sorted((root / rel_dir).glob(pattern))[:60]:
            doc = lxml.html.parse(str(path)).getroot()
            title = page_title(doc).split(" — ")[0].split(": ")[-1]
            if title:
                titles.append(title)
            for p in doc.xpath("//p")[2:4]:
                sentence = re.sub(r"\s+", " ", p.text_content()).strip().split(". ")[0]
                if 60 < len(sentence) < 220:
                    teasers.append(sentence + ".")
    for template, rel_dir, page, xpath, index in SOURCES:
        doc = lxml.html.parse(str(root / rel_dir / page)).getroot()
        main = clean_main(doc.xpath(xpath)[index])
        truncate(main)
        headings = [render_text(h) for h in main.xpath(".//h1|.//h2|.//h3")]
        pages.append({"template": template, "source": f"{rel_dir.split('/')[3]}/{page}", "license": LICENSES[rel_dir],
                      "title": page_title(doc), "main_html": etree.tostring(main, encoding="unicode", method="html"),
                      "main_text": render_text(main), "headings": headings})
    return pages, titles, teasers


# ---------------------------------------------------------------- boilerplate


COOKIE_TEXTS = [
    "We use cookies to improve your experience on our site, to analyse traffic and to personalise content. "
    "By clicking Accept all, you agree to the storing of cookies on your device.",
    "This website uses cookies. Some of them are essential, while others help us improve this site and your "
    "experience. You can change your preferences at any time in the cookie settings.",
    "Our partners and we store and access information on your device, such as cookies, and process personal data "
    "such as unique identifiers for personalised ads and content, ad and content measurement and audience insights.",
]
COMMENTS = [
    "Thanks for this write-up, it saved me an afternoon of digging through the manual.",
    "Does this still work on the latest release? I get a different result on my machine.",
    "Great explanation. I would add that the defaults changed a couple of versions ago.",
    "I have been using this approach in production for two years without any trouble.",
]
FOOTER_LINKS = ["About us", "Contact", "Privacy policy", "Terms of use", "Cookie settings", "Accessibility",
                "Sitemap", "Careers", "Press", "Advertise with us", "Help center", "Status"]


def links(items, rng, n, cls=None):
    chosen = rng.sample(items, min(n, len(items)))
    attr = f' class="{cls}"' if cls else ""
    return "\n".join(f'<li{attr}><a href="/{slug(t)}/">{html.escape(t)}</a></li>' for t in chosen)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "page"


def toc(headings):
    return "\n".join(f'<li><a href="#{slug(h)}">{html.escape(h)}</a></li>' for h in headings[1:])


def sphinx(page, ctx, rng):
    title = html.escape(page["title"])
    related = ('<div class="related" role="navigation" aria-label="related navigation"><h3>Navigation</h3><ul>'
               '<li class="right"><a href="/genindex.html">index</a></li><li class="right"><a href="/py-modindex.html">'
               'modules</a> |</li><li class="right"><a href="../next.html">next</a> |</li><li class="right">'
               '<a href="../prev.html">previous</a> |</li><li><a href="/">Python</a> &#187;</li>'
               '<li><a href="/3.11/">3.11.2 Documentation</a> &#187;</li>'
               '<li class="nav-item"><a href="/library/">The Python Standard Library</a> &#187;</li></ul></div>')
    sidebar = ('<div class="sphinxsidebar" role="navigation" aria-label="main navigation">'
               '<div class="sphinxsidebarwrapper">'
               f'<h3><a href="#">Table of Contents</a></h3><ul>{toc(page["headings"])}</ul>'
               '<h4>Previous topic</h4><p class="topless"><a href="../prev.html">'
               f'{html.escape(rng.choice(ctx["titles"]))}</a></p>'
               '<h4>Next topic</h4><p class="topless"><a href="../next.html">'
               f'{html.escape(rng.choice(ctx["titles"]))}</a></p>'
               '<div role="note" aria-label="source link"><h3>This Page</h3><ul class="this-page-menu">'
               '<li><a href="/bugs.html">Report a Bug</a></li><li><a href="_sources/page.rst.txt">Show Source</a></li>'
               '</ul></div><div id="searchbox" role="search"><h3>Quick search</h3><form class="search" '
               'action="/search.html">'
               '<input type="text" name="q"><input type="submit" value="Go"></form></div></div></div>')
    footer = ('<div class="footer">&copy; <a href="/copyright.html">Copyright</a> 2001-2023, '
              'Python Software Foundation.'
              '<br> This page is licensed under the Python Software Foundation License Version 2. <br> Examples, '
              'recipes,'
              ' and other code in the documentation are additionally licensed under the Zero Clause BSD License. <br>'
              ' See <a href="/license.html">History and License</a> for more information.<br><br> The Python Software'
              ' Foundation is a non-profit corporation. <a href="https://www.python.org/psf/donations/">Please '
              'donate.</a>'
              '<br><br> Last updated on Mar 14, 2023. <a href="/bugs.html">Found a bug</a>? <br> Created using '
              '<a href="https://www.sphinx-doc.org/">Sphinx</a> 5.3.0.</div>')
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            '<link rel="stylesheet" href="_static/pydoctheme.css"><script src="_static/doctools.js"></script></head>'
            '<body>'
            '<div class="mobile-nav"><input type="checkbox" id="menuToggler" class="toggler__input"><nav '
            'class="nav-content" '
            f'role="navigation"><a href="/" class="nav-logo">Python</a><div class="version_switcher_placeholder"></div>'
            '<form role="search" class="search" action="/search.html"><input placeholder="Quick search" name="q">'
            '</form>'
            f'</nav></div>{related}<div class="document"><div class="documentwrapper"><div class="bodywrapper">'
            f'<div class="body" role="main">{page["main_html"]}</div></div></div>{sidebar}<div class="clearer"></div>'
            '</div>'
            f'{related}{footer}</body></html>')


def rtd(page, ctx, rng):
    title = html.escape(page["title"])
    menu = "\n".join(f'<li class="toctree-l1"><a class="reference internal" href="/{slug(t)}.html">'
                     f'{html.escape(t)}</a></li>'
                     for t in rng.sample(ctx["titles"], 24))
    return (f'<!DOCTYPE html><html class="writer-html5" lang="en"><head><meta charset="utf-8"><title>{title} &mdash; '
            'Project 2.4 documentation</title><script>window.dataLayer=window.dataLayer||[];</script></head>'
            '<body class="wy-body-for-nav"><div class="wy-grid-for-nav"><nav data-toggle="wy-nav-shift" '
            'class="wy-nav-side">'
            '<div class="wy-side-scroll"><div class="wy-side-nav-search"><a href="/" class="icon icon-home">Project</a>'
            '<div class="version">2.4</div><div role="search"><form id="rtd-search-form" class="wy-form" '
            'action="/search.html">'
            '<input type="text" name="q" placeholder="Search docs"></form></div></div>'
            '<div class="wy-menu wy-menu-vertical" data-spy="affix" role="navigation" aria-label="Navigation menu">'
            '<p class="caption" role="heading"><span class="caption-text">Contents:</span></p><ul class="current">'
            f'{menu}</ul>'
            '</div></div></nav><section data-toggle="wy-nav-shift" class="wy-nav-content-wrap"><nav class="wy-nav-top" '
            'aria-label="Mobile navigation menu"><a href="/">Project</a></nav><div class="wy-nav-content"><div '
            'class="rst-content">'
            '<div role="navigation" aria-label="Page navigation"><ul class="wy-breadcrumbs"><li><a href="/" '
            'class="icon '
            f'icon-home"></a> &raquo;</li><li><a href="/api/">API Reference</a> &raquo;</li><li>{title}</li>'
            '<li class="wy-breadcrumbs-aside"><a href="https://github.com/example/project/blob/main/docs/page.rst" '
            'class="fa fa-github"> Edit on GitHub</a></li></ul><hr></div><div role="main" class="document" '
            'itemscope="itemscope"'
            ' itemtype="http://schema.org/Article"><div itemprop="articleBody">'
            f'{page["main_html"]}</div></div><footer><div class="rst-footer-buttons" role="navigation" '
            'aria-label="Footer">'
            f'<a href="prev.html" class="btn btn-neutral float-left" accesskey="p" rel="prev"><span class="fa '
            f'fa-arrow-circle-left"></span> {html.escape(rng.choice(ctx["titles"]))}</a><a href="next.html" class="btn '
            f'btn-neutral float-right" accesskey="n" rel="next">{html.escape(rng.choice(ctx["titles"]))} <span '
            'class="fa '
            'fa-arrow-circle-right"></span></a></div><hr><div role="contentinfo"><p>&#169; Copyright 2019-2024, the '
            'Project '
            'developers. Revision <span class="commit"><code>4f2a9c1</code></span>.</p></div>Built with '
            '<a href="https://www.sphinx-doc.org/">Sphinx</a> using a <a '
            'href="https://github.com/readthedocs/sphinx_rtd_theme">'
            'theme</a> provided by <a href="https://readthedocs.org">Read the Docs</a>.</footer></div></div>'
            '</section></div>'
            '<div class="rst-versions" data-toggle="rst-versions" role="note" aria-label="Versions"><span '
            'class="rst-current-version"'
            ' data-toggle="rst-current-version"><span class="fa fa-book"> Read the Docs</span> v: stable </span>'
            '<div class="rst-other-versions"><dl><dt>Versions</dt><dd><a href="/en/latest/">latest</a></dd><dd><a '
            'href="/en/stable/">stable</a></dd><dd><a href="/en/2.3/">2.3</a></dd></dl><dl><dt>Downloads</dt><dd><a '
            'href="#">PDF'
            '</a></dd><dd><a href="#">HTML</a></dd><dd><a href="#">Epub</a></dd></dl><dl><dt>On Read the Docs</dt>'
            '<dd><a '
            'href="#">Project Home</a></dd><dd><a href="#">Builds</a></dd></dl></div></div></body></html>')


def mkdocs(page, ctx, rng):
    title = html.escape(page["title"])
    tabs = links(ctx["titles"], rng, 6, "md-tabs__item")
    primary = links(ctx["titles"], rng, 20, "md-nav__item")
    return (f'<!doctype html><html lang="en" class="no-js"><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width,initial-scale=1"><title>{title} - Project Docs</title></head>'
            '<body dir="ltr" data-md-color-scheme="default"><input class="md-toggle" data-md-toggle="drawer" '
            'type="checkbox" '
            'id="__drawer"><a href="#content" class="md-skip">Skip to content</a><header class="md-header '
            'md-header--shadow" '
            'data-md-component="header"><nav class="md-header__inner md-grid" aria-label="Header"><a href="/" '
            'title="Project Docs"'
            ' class="md-header__button md-logo">Project Docs</a><div class="md-header__title"><span '
            'class="md-ellipsis">'
            f'{title}</span></div><div class="md-search" data-md-component="search" role="dialog"><form '
            'class="md-search__form">'
            '<input type="text" class="md-search__input" name="query" placeholder="Search"></form></div>'
            '<div class="md-header__source"><a href="https://github.com/example/project" class="md-source">'
            'example/project '
            '<ul class="md-source__facts"><li class="md-source__fact">v2.4.1</li><li>1.2k stars</li><li>210 '
            'forks</li></ul>'
            f'</a></div></nav></header><div class="md-container" data-md-component="container"><nav class="md-tabs" '
            f'aria-label="Tabs"><ul class="md-tabs__list">{tabs}</ul></nav><main class="md-main" '
            'data-md-component="main">'
            '<div class="md-main__inner md-grid"><div class="md-sidebar md-sidebar--primary" '
            'data-md-component="sidebar">'
            '<div class="md-sidebar__scrollwrap"><div class="md-sidebar__inner"><nav class="md-nav md-nav--primary" '
            'aria-label="Navigation"><label class="md-nav__title">Project Docs</label><ul class="md-nav__list">'
            f'{primary}</ul>'
            '</nav></div></div></div><div class="md-sidebar md-sidebar--secondary" data-md-component="sidebar"><div '
            'class="md-sidebar__scrollwrap"><div class="md-sidebar__inner"><nav class="md-nav md-nav--secondary" '
            'aria-label="Table of contents"><label class="md-nav__title">Table of contents</label><ul '
            'class="md-nav__list">'
            f'{toc(page["headings"])}</ul></nav></div></div></div><div class="md-content" data-md-component="content">'
            '<article class="md-content__inner md-typeset"><a '
            'href="https://github.com/example/project/edit/main/docs/page.md" '
            f'title="Edit this page" class="md-content__button md-icon">Edit this page</a>{page["main_html"]}'
            '<aside class="md-source-file"><span class="md-source-file__fact">Last update: March 3, 2024</span>'
            '<span class="md-source-file__fact">Created: June 12, 2021</span></aside></article></div></div>'
            '<button type="button" class="md-top md-icon" data-md-component="top" hidden>Back to top</button></main>'
            '<footer class="md-footer"><nav class="md-footer__inner md-grid" aria-label="Footer"><a href="../prev/" '
            'class="md-footer__link md-footer__link--prev"><div class="md-footer__title"><span '
            'class="md-footer__direction">'
            f'Previous</span><div class="md-ellipsis">{html.escape(rng.choice(ctx["titles"]))}</div></div></a><a '
            'href="../next/" '
            'class="md-footer__link md-footer__link--next"><div class="md-footer__title"><span '
            'class="md-footer__direction">'
            f'Next</span><div class="md-ellipsis">{html.escape(rng.choice(ctx["titles"]))}</div></div></a></nav>'
            '<div class="md-footer-meta md-typeset"><div class="md-footer-meta__inner md-grid"><div '
            'class="md-copyright">'
            'Copyright &copy; 2021 - 2024 The Project Authors. Made with <a '
            'href="https://squidfunk.github.io/mkdocs-material/">'
            'Material for MkDocs</a></div></div></div></footer></div><div class="md-dialog" '
            'data-md-component="dialog"><div '
            'class="md-dialog__inner md-typeset"></div></div><div class="md-consent" data-md-component="consent" '
            'id="__consent">'
            '<div class="md-consent__overlay"></div><aside class="md-consent__inner"><form class="md-consent__form '
            'md-grid '
            f'md-typeset" name="consent"><h4>Cookie consent</h4><p>{rng.choice(COOKIE_TEXTS)}</p><div '
            'class="md-consent__controls">'
            '<button class="md-button md-button--primary">Accept</button><button type="reset" class="md-button">'
            'Manage settings'
            '</button></div></form></aside></div><script src="assets/javascripts/bundle.js"></script></body></html>')


def blog(page, ctx, rng):
    title = html.escape(page["title"].split(" — ")[0])
    related = "\n".join(f'<div class="related-post"><h4><a href="/{slug(t)}/">{html.escape(t)}</a></h4>'
                        f'<p>{html.escape(x)}</p>'
                        '</div>' for t, x in zip(rng.sample(ctx["titles"], 3), rng.sample(ctx["teasers"], 3)))
    comments = "\n".join('<li class="comment"><article class="comment-body"><footer class="comment-meta">'
                         '<b class="fn">'
                         f'{name}</b> <time>March {d}, 2024 at {h}:15 pm</time></footer><div class="comment-content">'
                         f'<p>{c}</p></div><div class="reply"><a class="comment-reply-link" href="#">Reply</a></div>'
                         '</article></li>'
                         for name, d, h, c in zip(["Anna", "Marc", "Priya"], [4, 6, 9], [2, 7, 9],
                                                  rng.sample(COMMENTS, 3)))
    return (f'<!DOCTYPE html><html lang="en-US"><head><meta charset="UTF-8"><title>{title} &#8211; Notes from the '
            'Terminal</title></head><body class="post-template-default single single-post"><div id="page" class="site">'
            '<a class="skip-link screen-reader-text" href="#primary">Skip to content</a><header id="masthead" '
            'class="site-header">'
            '<div class="site-branding"><p class="site-title"><a href="/" rel="home">Notes from the Terminal</a></p><p '
            'class="site-description">Linux, Python and everything in between</p></div><nav id="site-navigation" '
            'class="main-navigation"><button class="menu-toggle">Menu</button><ul id="primary-menu" class="menu">'
            '<li><a href="/">Home</a></li><li><a href="/category/linux/">Linux</a></li><li><a '
            'href="/category/python/">Python'
            '</a></li><li><a href="/category/databases/">Databases</a></li><li><a href="/about/">About</a></li><li>'
            '<a href="/contact/">Contact</a></li></ul></nav></header><div id="content" class="site-content"><div '
            'id="primary" '
            'class="content-area"><main id="main" class="site-main"><article id="post-1412" class="post type-post '
            'status-publish">'
            '<header class="entry-header"><div class="entry-meta"><span class="posted-on">Posted on <time '
            'class="entry-date '
            'published">March 2, 2024</time></span><span class="byline"> by <span class="author vcard"><a '
            'href="/author/editor/">'
            f'The Editor</a></span></span></div></header><div class="entry-content">{page["main_html"]}</div>'
            '<footer class="entry-footer"><span class="cat-links">Posted in <a href="/category/linux/" rel="category '
            'tag">Linux'
            '</a></span><span class="tags-links">Tagged <a href="/tag/debian/" rel="tag">debian</a>, <a '
            'href="/tag/howto/" '
            'rel="tag">howto</a></span></footer></article><div class="sharedaddy sd-sharing-enabled"><h3 '
            'class="sd-title">'
            'Share this:</h3><ul><li><a href="#">Twitter</a></li><li><a href="#">Facebook</a></li><li><a href="#">'
            'Email</a>'
            f'</li></ul></div><div id="jp-relatedposts" class="jp-relatedposts"><h3 class="jp-relatedposts-headline">'
            f'<em>Related</em></h3>{related}</div><div id="comments" class="comments-area"><h2 '
            'class="comments-title">3 thoughts '
            f'on &ldquo;{title}&rdquo;</h2><ol class="comment-list">{comments}</ol><div id="respond" '
            'class="comment-respond">'
            '<h3 id="reply-title" class="comment-reply-title">Leave a Reply</h3><form action="/wp-comments-post.php" '
            'method="post" id="commentform"><p class="comment-notes">Your email address will not be published. '
            'Required fields '
            'are marked *</p><p><label for="comment">Comment</label><textarea id="comment" name="comment"></textarea>'
            '</p>'
            '<p><input name="submit" type="submit" value="Post Comment"></p></form></div></div></main></div>'
            '<aside id="secondary" class="widget-area"><section class="widget widget_search"><form role="search" '
            'class="search-form">'
            '<label>Search for: <input type="search" class="search-field" name="s"></label><input type="submit" '
            'value="Search">'
            '</form></section><section class="widget widget_recent_entries"><h2 class="widget-title">Recent '
            'Posts</h2><ul>'
            f'{links(ctx["titles"], rng, 5)}</ul></section><section class="widget widget_archive"><h2 '
            'class="widget-title">'
            'Archives</h2><ul><li><a href="/2024/03/">March 2024</a></li><li><a href="/2024/02/">February 2024</a>'
            '</li><li>'
            '<a href="/2024/01/">January 2024</a></li><li><a href="/2023/12/">December 2023</a></li></ul></section>'
            '<section '
            'class="widget widget_categories"><h2 class="widget-title">Categories</h2><ul><li><a '
            'href="/category/databases/">'
            'Databases</a></li><li><a href="/category/linux/">Linux</a></li><li><a href="/category/python/">'
            'Python</a></li></ul>'
            '</section></aside></div><footer id="colophon" class="site-footer"><div class="site-info"><a '
            'href="https://wordpress.org/">'
            'Proudly powered by WordPress</a><span class="sep"> | </span>Theme: Twenty Nineteen.</div></footer></div>'
            '<div id="cookie-notice" role="dialog" class="cookie-notice-hidden cookie-revoke-hidden '
            'cn-position-bottom" '
            'aria-label="Cookie Notice"><div class="cookie-notice-container"><span id="cn-notice-text" '
            'class="cn-text-container">'
            f'{rng.choice(COOKIE_TEXTS)}</span><span id="cn-notice-buttons" class="cn-buttons-container"><a href="#" '
            'id="cn-accept-cookie" class="cn-set-cookie cn-button">Ok</a><a href="/privacy-policy/" '
            'class="cn-privacy-policy-link '
            'cn-link">Privacy policy</a></span></div></div></body></html>')


def news(page, ctx, rng):
    title = html.escape(page["title"].split(" — ")[0])
    sections = ["World", "Business", "Technology", "Science", "Health", "Sport", "Culture", "Opinion", "Travel"]
    most_read = "\n".join(f'<li><span class="n">{i + 1}</span><a href="/story/{slug(t)}">{html.escape(t)}</a></li>'
                          for i, t in enumerate(rng.sample(ctx["titles"], 5)))
    more = "\n".join(f'<div class="card"><a href="/story/{slug(t)}"><span class="kicker">Technology</span>'
                     '<span class="hl">'
                     f'{html.escape(t)}</span></a><p class="dek">{html.escape(x)}</p></div>'
                     for t, x in zip(rng.sample(ctx["titles"], 4), rng.sample(ctx["teasers"], 4)))
    return ('<html><head><meta http-equiv="Content-Type" content="text/html; charset=utf-8">'
            f'<title>{title} | The Daily '
            'Bulletin</title></head><body><div id="wrap"><div class="hd"><div class="logo"><a href="/">The Daily '
            'Bulletin</a>'
            '</div><div class="date">Saturday, 2 March 2024</div><div class="acct"><a href="/login">Sign in</a> | <a '
            f'href="/subscribe">Subscribe from $1 a week</a></div></div><div class="secnav"><ul>'
            + "".join(f'<li><a href="/{s.lower()}">{s}</a></li>' for s in sections)
            + '</ul></div><div class="trail"><a href="/">Home</a> &gt; <a href="/technology">Technology</a> &gt; <a '
            f'href="/technology/software">Software</a></div><div class="cols"><div class="col-a"><div class="story-hd">'
            '<span class="kicker">Technology</span><div class="byl">By Staff Reporter &middot; 6 min read &middot; '
            'Updated '
            f'11:42 GMT</div></div><div class="story-body">{page["main_html"]}</div><div class="tags">Topics: <a '
            'href="/t/linux">'
            'Linux</a> <a href="/t/software">Software</a> <a href="/t/open-source">Open source</a></div><div '
            'class="nl-box">'
            '<b>Get the Tech Bulletin</b><p>The week\'s most important technology stories, '
            'in your inbox every Friday.</p>'
            '<input type="email" placeholder="Your email address"><button>Sign up</button></div><div class="more"><b>'
            'More '
            f'from Technology</b>{more}</div></div><div class="col-b"><div class="box"><b>Most read</b><ol>'
            f'{most_read}</ol>'
            '</div><div class="box ad-slot"><span class="adlabel">Advertisement</span></div><div class="box"><b>'
            'Follow us'
            '</b><ul><li><a href="#">Facebook</a></li><li><a href="#">X</a></li><li><a href="#">LinkedIn</a></li><li>'
            '<a href="#">RSS</a></li></ul></div></div></div><div class="ftr"><ul>'
            + "".join(f'<li><a href="/{slug(t)}">{t}</a></li>' for t in FOOTER_LINKS)
            + '</ul><p>&copy; 2024 The Daily Bulletin Ltd. All rights reserved. '
            'The Daily Bulletin is not responsible for the '
            'content of external sites. Read about our approach to external linking.</p></div></div><div id="cc-box" '
            f'class="notice-bar"><p>{rng.choice(COOKIE_TEXTS)}</p><a href="#" class="btn">Accept all</a> <a href="#" '
            'class="btn">Reject all</a> <a href="/privacy">Manage preferences</a></div></body></html>')


def pgdocs(page, ctx, rng):
    title = html.escape(page["title"])
    side = links(ctx["titles"], rng, 18)
    navheader = ('<div class="navheader"><table width="100%" summary="Navigation header"><tr><th colspan="5" '
                 f'align="center">{title}</th></tr><tr><td width="10%" align="left"><a accesskey="p" '
                 'href="prev.html">Prev'
                 '</a>&nbsp;</td><td width="10%" align="left"><a accesskey="u" href="datatype.html">Up</a></td><th '
                 'width="60%"'
                 ' align="center">Chapter 8. Data Types</th><td width="10%" align="right"><a accesskey="h" '
                 'href="index.html">'
                 'Home</a></td><td width="10%" align="right">&nbsp;<a accesskey="n" href="next.html">Next</a></td></tr>'
                 '</table><hr></div>')
    navfooter = ('<div class="navfooter"><hr><table width="100%" summary="Navigation footer"><tr>'
                 '<td width="40%" align="left">'
                 '<a accesskey="p" href="prev.html">Prev</a>&nbsp;</td><td width="20%" align="center"><a accesskey="u" '
                 'href="datatype.html">Up</a></td><td width="40%" align="right">&nbsp;<a accesskey="n" '
                 'href="next.html">Next'
                 '</a></td></tr><tr><td width="40%" align="left" valign="top">'
                 f'{html.escape(rng.choice(ctx["titles"]))}&nbsp;</td>'
                 '<td width="20%" align="center"><a accesskey="h" href="index.html">Home</a></td><td width="40%" '
                 'align="right" '
                 f'valign="top">&nbsp;{html.escape(rng.choice(ctx["titles"]))}</td></tr></table></div>')
    return ('<!doctype html><html lang="en"><head><title>PostgreSQL: Documentation: 15: ' + title + '</title><meta '
            'http-equiv="Content-Type" content="text/html; charset=utf-8"></head><body><div class="container-fluid">'
            '<div class="row justify-content-md-center"><div class="col"><nav class="navbar navbar-expand-lg" '
            'role="navigation">'
            '<a class="navbar-brand" href="/">PostgreSQL</a><ul class="navbar-nav"><li><a href="/about/">About</a>'
            '</li><li>'
            '<a href="/download/">Download</a></li><li><a href="/docs/">Documentation</a></li><li><a '
            'href="/community/">'
            'Community</a></li><li><a href="/developer/">Developers</a></li><li><a href="/support/">Support</a></li>'
            '<li>'
            '<a href="/about/donate/">Donate</a></li><li><a href="/account/">Your account</a></li></ul><form '
            'role="search" '
            'method="get" action="/search/"><input type="text" name="q" placeholder="Search for..."></form></nav>'
            '</div></div>'
            '<div class="row"><div class="col-lg-3 d-none d-lg-block"><div class="pg-docs-sidebar"><h2>'
            'Documentation</h2><ul>'
            f'{side}</ul></div></div><div class="col-lg-9"><div id="pgContentWrap"><div id="docContent"><div '
            'class="doc-header"><p>Supported Versions: <a href="/docs/current/">Current</a> (17) / <a '
            'href="/docs/16/">16</a>'
            ' / <a href="/docs/15/">15</a> / <a href="/docs/14/">14</a> / <a href="/docs/13/">13</a></p><p>Development '
            'Versions: <a href="/docs/devel/">devel</a></p><p>Unsupported versions: <a href="/docs/12/">12</a> / <a '
            f'href="/docs/11/">11</a> / <a href="/docs/10/">10</a></p></div>{navheader}{page["main_html"]}{navfooter}'
            '<div id="comments"><h2>Submit correction</h2><p>If you see anything in the documentation that is not '
            'correct, '
            'does not match your experience with the particular feature or requires further clarification, please use '
            '<a href="/account/comments/new/15/">this form</a> to report a documentation issue.</p></div></div></div>'
            '</div>'
            '</div><footer id="footer" class="row"><div class="col"><p><a href="/about/policies/">Policies</a> | <a '
            'href="/about/policies/coc/">Code of Conduct</a> | <a href="/about/">About PostgreSQL</a> | <a '
            'href="/about/contact/">'
            'Contact</a></p><p>Copyright &copy; 1996-2024 The PostgreSQL Global Development Group</p></div></footer>'
            '</div>'
            f'<div class="cookie-consent" id="cookie-banner"><p>{rng.choice(COOKIE_TEXTS)}</p><button>Accept</button>'
            '</div>'
            '</body></html>')


TEMPLATES = {"sphinx": sphinx, "rtd": rtd, "mkdocs": mkdocs, "blog": blog, "news": news, "pgdocs": pgdocs}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", help="where the packages are fetched and unpacked (default: a temporary folder)")
    parser.add_argument("--output", default=str(OUT))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        pages, titles, teasers = collect(unpack(workdir))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("*.html"), *out.glob("*.txt")]:
        old.unlink()
    rng = random.Random(20)
    ctx = {"titles": sorted(set(titles)), "teasers": sorted(set(teasers))}
    rows = []
    for i, page in enumerate(pages):
        name = f"{i:02d}-{page['template']}-{slug(Path(page['source']).stem)}"
        (out / f"{name}.html").write_text(TEMPLATES[page["template"]](page, ctx, rng), encoding="utf-8")
        (out / f"{name}.txt").write_text(page["main_text"] + "\n", encoding="utf-8")
        rows.append(f"| `{name}` | {page['template']} | {page['source']} | {len(page['main_text'].split())} |")
    readme = (__doc__.split("\n\n", 2)[2].rstrip()
              + "\n\nRebuild: `python bench/html_eval_build.py` (needs apt-get and "
              "dpkg). Licenses: " + "; ".join(LICENSES.values()) + ". Boilerplate text is written for this set.\n\n"
              "| Page | Template | Main content from | Words |\n| --- | --- | --- | --- |\n" + "\n".join(rows) + "\n")
    (out / "README.md").write_text("# HTML extraction evaluation set\n\n" + readme, encoding="utf-8")
    print(f"wrote {len(pages)} pages to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
