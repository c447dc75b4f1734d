"""A clone of the repository alone has everything: no file points outside it, every relative link
in the docs resolves inside it, the reference data in tests/ is what its READMEs say, and the
docs' kubectl/helm commands use one namespace."""

import hashlib
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", "build", "demo-output", "__pycache__", ".pytest_cache", ".ruff_cache", "out",
             ".venv-datatrove", "crds", "fixtures", "locks"}
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".tpl", ".txt", ".toml", ".ini", ".sh", ".json", ".cfg", ""}
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(REPO.glob("*/README.md"))]


def text_files() -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        found += [Path(folder, name) for name in files if Path(name).suffix in TEXT_SUFFIXES]
    return found


def test_nothing_points_outside_the_repository():
    outside = re.compile(r"\.\./shared|/ \"shared\"|parent / \"shared\"|/work/shared")
    hits = []
    for path in text_files():
        if path == Path(__file__):
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if outside.search(line):
                hits.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not hits, "\n".join(hits)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves_inside_the_repository(doc):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if not path.exists() or not path.is_relative_to(REPO):
            broken.append(target)
    assert not broken, f"{doc.relative_to(REPO)}: {broken}"


@pytest.mark.parametrize("folder", ["tests/fixtures", "tests/crds"])
def test_reference_data_is_what_its_readme_lists(folder):
    listed = dict(re.findall(r"^\| `([^`]+)` \| \d+ \| `([0-9a-f]{64})` \|$", (REPO / folder / "README.md").read_text(),
                             re.M))
    present = {p.name for p in (REPO / folder).iterdir() if p.name != "README.md" and p.is_file()}
    assert listed and set(listed) == present
    sets = [p for p in (REPO / folder).iterdir() if p.is_dir()]  # a data set of its own: its README says what
    assert all((p / "README.md").read_text().strip() for p in sets)
    for name, digest in listed.items():
        assert hashlib.sha256((REPO / folder / name).read_bytes()).hexdigest() == digest, name


def test_the_docs_commands_use_the_readmes_namespace():
    (namespace,) = set(re.findall(r"^helm install lmforge \./helm/lmforge -n (\S+)", (REPO / "README.md").read_text(),
                                  re.M))
    option = re.compile(r"(?:kubectl|helm)\b[^\n`]*?(?:-n|--namespace)[ =]([A-Za-z0-9$<>{}_.-]+)")
    used: dict[str, list[str]] = {}
    for doc in DOCS:
        for found in option.findall(doc.read_text()):
            used.setdefault(found, []).append(doc.name)
    assert set(used) == {namespace}, {name: sorted(set(docs)) for name, docs in used.items()}
    assert len(used[namespace]) > 20
