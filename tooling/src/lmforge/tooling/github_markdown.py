"""The docs' GitHub Markdown, read the same on the documentation site: an MkDocs hook (mkdocs.yml).

The docs are written for GitHub, which the site's Python-Markdown reads differently in two places:

- lists: GitHub lets a list start right after a paragraph line and nests an item under its
  parent's text (2 spaces under `- `, 3 under `1. `); Python-Markdown wants a blank line before a
  list and 4 spaces per level, and otherwise prints the items as one paragraph;
- a `|` inside code in a table: GitHub needs it escaped (`\\|`) and shows the `|`; Python-Markdown
  already keeps code whole and would show the backslash.

`to_python_markdown` rewrites a page in those two places only, before MkDocs renders it; the files
are not changed, and every other line (fenced code included) comes back as it was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ITEM = re.compile(r"^( *)([-*+]|\d{1,9}[.)])( +|$)")
FENCE = re.compile(r"^( *)(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
STEP = 4  # Python-Markdown's indentation per list level


@dataclass
class _Item:
    content_column: int  # where the item's text starts in the source (GitHub's nesting rule)
    indent: int  # the indentation its marker is given in the output


def _interrupts_paragraph(marker: str) -> bool:
    """GitHub lets a list start right after a paragraph line: a bullet list, or an ordered one from 1."""
    return marker[0] in "-*+" or marker[:-1] == "1"


def _reindent(line: str, stack: list[_Item]) -> str:
    """An indented line inside a list: moved with the deepest item whose text it is indented under."""
    spaces = len(line) - len(line.lstrip(" "))
    owners = [item for item in stack if spaces >= item.content_column]
    if not owners:
        return line
    owner = owners[-1]
    return " " * (owner.indent + STEP + spaces - owner.content_column) + line[spaces:]


def _unescape_code_pipes(row: str) -> str:
    return CODE_SPAN.sub(lambda m: m[1] + m[2].replace("\\|", "|") + m[1], row)


def to_python_markdown(markdown: str) -> str:
    out: list[str] = []
    stack: list[_Item] = []  # the open list items, outermost first
    fence: tuple[str, int, int] | None = None  # (marker, source indent, output indent) of an open fence
    previous = ""
    for line in markdown.split("\n"):
        if fence is not None:
            marker, source, target = fence
            stripped = line.strip()
            if stripped.startswith(marker) and not stripped.strip(marker[0]):
                fence = None
            out.append(" " * target + line[source:] if not line[:source].strip() else line)
            previous = line
            continue
        item = ITEM.match(line)
        if not line.strip():
            out.append(line)
        elif item and (stack or not previous.strip() or _interrupts_paragraph(item[2])):
            spaces, marker = len(item[1]), item[2]
            if not stack and previous.strip():
                out.append("")
            while stack and spaces < stack[-1].content_column:
                stack.pop()
            indent = stack[-1].indent + STEP if stack else 0
            stack.append(_Item(spaces + len(marker) + max(len(item[3]), 1), indent))
            out.append(" " * indent + line[spaces:])
        elif stack and line.startswith(" "):
            out.append(_reindent(line, stack))
        else:
            if not previous.strip() or line.startswith("#"):
                stack.clear()  # a line at the margin after a blank line, or a heading, ends the list
            out.append(line)
        if out[-1].lstrip().startswith("|"):
            out[-1] = _unescape_code_pipes(out[-1])
        opening = FENCE.match(line)
        if opening:
            fence = (opening[2], len(opening[1]), len(out[-1]) - len(out[-1].lstrip(" ")))
        previous = line
    return "\n".join(out)


def on_page_markdown(markdown: str, **_kwargs) -> str:
    """The MkDocs hook (mkdocs.yml `hooks:`)."""
    return to_python_markdown(markdown)
