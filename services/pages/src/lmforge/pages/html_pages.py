"""Renders lmforge's self-contained HTML pages from Jinja2 templates.

A page's template lives in its package's ``templates/`` folder and extends the shared layout
``pages/page.html`` (lmforge.pages' ``templates/``), which inlines the one stylesheet, so a
page needs nothing outside itself. Every value a template writes is HTML-escaped (autoescape
on for every template): the pages show crawled text, file names and PromQL. The formatters of
lmforge.pages.formatting are the templates' filters.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import jinja2

from lmforge.pages import formatting

FILTERS = {
    "count": formatting.count,
    "si": formatting.si,
    "number": formatting.number,
    "percent": formatting.percent,
    "bytes": formatting.byte_size,
    "duration": formatting.duration,
    "short_duration": formatting.short_duration,
}


@cache
def environment(package: str) -> jinja2.Environment:
    """The templates of `package` under its last name (``lmforge.dataprep`` → ``dataprep/``),
    the shared ones under ``pages/``."""
    loader = jinja2.PrefixLoader(
        {
            "pages": jinja2.PackageLoader("lmforge.pages"),
            package.rsplit(".", 1)[-1]: jinja2.PackageLoader(package),
        }
    )
    env = jinja2.Environment(
        loader=loader, autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True
    )
    env.filters.update(FILTERS)
    return env


def render(package: str, template: str, **context: Any) -> str:
    """`template` (``dataprep/report.html``) of `package`, rendered with `context`."""
    return environment(package).get_template(template).render(**context)
