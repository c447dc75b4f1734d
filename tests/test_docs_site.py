"""The documentation site (mkdocs.yml): it builds with `mkdocs build --strict` and without the
network, every page in docs/ is in it, and a broken link, a broken anchor or a page left out of the
nav fails the build. Also the hook that makes the docs' GitHub Markdown read the same there
(lmforge.tooling.github_markdown), through the site's real Markdown renderer."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import markdown
import pytest

from lmforge.dataprep.stages import GLOBAL_STAGES
from lmforge.tooling.github_markdown import to_python_markdown

REPO = Path(__file__).resolve().parents[1]
HOOK = Path("tooling/src/lmforge/tooling/github_markdown.py")
# Any HTTP(S) request a build made would go to a closed port and fail.
NO_NETWORK = {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
              "ALL_PROXY": "http://127.0.0.1:9", "NO_PROXY": "", "no_proxy": ""}


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, **NO_NETWORK, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(root / "mkdocs.yml"), "--site-dir", str(site)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def copy_of_the_docs(tmp_path: Path) -> Path:
    """What the build reads, and only that: mkdocs.yml, docs/, the README (the home page's picture), the hook."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "docs", root / "docs")
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    shutil.copy(REPO / "README.md", root / "README.md")
    (root / HOOK).parent.mkdir(parents=True)
    shutil.copy(REPO / HOOK, root / HOOK)
    return root


def test_the_site_builds_strict_and_offline(tmp_path):
    site = tmp_path / "site"
    result = build(REPO, site)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "WARNING" not in result.stderr, result.stderr[-4000:]
    built = {p.name for p in site.glob("*.html")}
    assert {f"{p.stem}.html" for p in (REPO / "docs").glob("*.md")} <= built
    html = {name: (site / name).read_text() for name in built}
    assert "flowchart LR" in html["index.html"]  # the README's picture, taken from the README
    assert "<td><code>minhash.num_perm</code></td>" in html["configuration.html"]
    stage_commands = ["run", *(stage.name for stage in GLOBAL_STAGES), "finalize"]  # the CLI's, from the stage list
    assert "|".join(stage_commands) in html["configuration.html"]
    # GitHub's anchors (a link works on both; the alerts' runbook links point at GitHub's): "python -m" keeps both
    # dashes, where MkDocs' own slugs would merge them.
    assert 'id="trainer-lmforge-train-python--m-lmforgetrainer"' in html["configuration.html"]
    assert 'id="lmforgecanaryregression"' in html["operations.html"]
    for name, text in html.items():  # no web fonts or other assets fetched when the page is read
        assert "fonts.googleapis.com" not in text and "fonts.gstatic.com" not in text, name


@pytest.mark.parametrize("break_it, named", [
    (lambda docs: (docs / "orphan.md").write_text("# Orphan\n"), "orphan.md"),
    (lambda docs: (docs / "demo.md").write_text((docs / "demo.md").read_text() + "\n[gone](no-such-page.md)\n"),
     "no-such-page.md"),
    (lambda docs: (docs / "demo.md").write_text((docs / "demo.md").read_text() + "\n[x](operations.md#no-anchor)\n"),
     "no-anchor"),
], ids=["page-not-in-nav", "broken-link", "broken-anchor"])
def test_a_broken_site_fails_the_strict_build(tmp_path, break_it, named):
    root = copy_of_the_docs(tmp_path)
    break_it(root / "docs")
    result = build(root, tmp_path / "site")
    assert result.returncode != 0
    assert named in result.stderr, result.stderr[-4000:]


def test_the_front_page_stays_a_front_page():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    assert "make demo" in readme and "make test" in readme
    for target in ("docs/getting-started.md", "docs/kubernetes.md", "docs/configuration.md", "docs/benchmarks.md"):
        assert f"]({target})" in readme, target


def render(text: str) -> str:
    """The page as the site renders it (mkdocs.yml's list, table and fence extensions), blanks at line starts
    dropped (they mean nothing in HTML)."""
    html = markdown.markdown(to_python_markdown(text), extensions=["tables", "sane_lists", "pymdownx.superfences"])
    return re.sub(r"\n +", "\n", html)


def test_a_list_right_after_a_paragraph_is_a_list():
    assert render("Symptoms:\n- one\n- two\n") == "<p>Symptoms:</p>\n<ul>\n<li>one</li>\n<li>two</li>\n</ul>"
    assert render("Next:\n1. first\n2. second\n").endswith("<ol>\n<li>first</li>\n<li>second</li>\n</ol>")
    # As on GitHub, only an ordered list that starts at 1 interrupts a paragraph.
    assert render("In\n2026. a year\n") == "<p>In\n2026. a year</p>"


def test_nesting_by_the_parents_text_is_kept():
    html = render("- a\n  - b\n    still b\n- c\n\n1. one\n   - under one\n2. two\n")
    assert html == ("<ul>\n<li>a<ul>\n<li>b\nstill b</li>\n</ul>\n</li>\n<li>c</li>\n</ul>\n"
                    "<ol>\n<li>one<ul>\n<li>under one</li>\n</ul>\n</li>\n<li>two</li>\n</ol>")


def test_code_fences_are_left_alone_and_move_with_their_item():
    top = "```\n- not a list\n  - nor this\n| `a \\| b` |\n```\n"
    assert to_python_markdown(top) == top
    html = render("- item\n  ```bash\n  echo hi\n  ```\n- next\n")
    # the code block inside the first item, not a paragraph of backticks after the list
    assert re.fullmatch(r'<ul>\n<li>item\n<div class="highlight"><pre>.*</code></pre></div></li>\n<li>next</li>\n</ul>',
                        html, re.S), html
    assert "```" not in html


def test_a_pipe_in_a_tables_code_is_shown_without_its_backslash():
    html = render('| type | note |\n|---|---|\n| `"a" \\| "b"` | a \\| b |\n')
    assert '<td><code>"a" | "b"</code></td>' in html
    assert "<td>a | b</td>" in html  # outside code Python-Markdown unescapes it itself
