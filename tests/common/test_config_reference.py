"""The generated configuration reference: README.md in sync, every field listed, --readme / --check."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import Field

from lmforge.common import config_reference as ref
from lmforge.common.config import StrictModel

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
ROW = re.compile(r"^\| `([^`]+)` \| (.*?) \| (.*?) \| (.*) \|$")


class Limits(StrictModel):
    depth: int = Field(3, ge=1, description="how deep")


class Source(StrictModel):
    path: str = Field(description="where")
    weight: float = 1.0


class Small(StrictModel):
    limits: Limits = Field(default_factory=lambda: Limits(depth=5))
    sources: list[Source] = Field(default_factory=list)
    mode: str = "fast"


class SmallChanged(StrictModel):
    limits: Limits = Field(default_factory=Limits)
    sources: list[Source] = Field(default_factory=list)
    mode: str = "fast"
    retries: int = 2


def service(model: type) -> ref.Service:
    return ref.Service("Small", ("small",), "SMALL", f"{__name__}:{model.__name__}", "`small --set {example}`.",
                       "limits.depth=2")


def table(markdown: str) -> dict[str, tuple[str, str, str]]:
    rows = (ROW.match(line) for line in markdown.splitlines())
    return {m[1]: (m[2], m[3], m[4]) for m in rows if m}


def schema_paths(model: type) -> set[str]:
    """Every field path, walked through the model's JSON schema (not the generator's code)."""
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})

    def ref_of(prop: dict) -> str | None:
        for candidate in [prop, *prop.get("allOf", []), *prop.get("anyOf", [])]:
            if "$ref" in candidate:
                return candidate["$ref"].rsplit("/", 1)[-1]
        return None

    def walk(node: dict, prefix: str) -> set[str]:
        paths = set()
        for name, prop in node["properties"].items():
            if ref_of(prop):
                paths |= walk(defs[ref_of(prop)], f"{prefix}{name}.")
                continue
            paths.add(prefix + name)
            items = prop.get("items", {})
            if prop.get("type") == "array" and ref_of(items):
                paths |= walk(defs[ref_of(items)], f"{prefix}{name}[].")
        return paths

    return walk(schema, "")


def test_readme_reference_is_in_sync():
    result = subprocess.run([sys.executable, "-m", "lmforge.common.config_reference", "--check", "README.md"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_every_field_of_every_service_is_listed():
    markdown = ref.render()
    sections = re.split(r"^### ", markdown, flags=re.M)[1:]
    assert [s.split(" (", 1)[0] for s in sections] == [s.title for s in ref.SERVICES]
    for text, svc in zip(sections, ref.SERVICES, strict=True):
        model = ref.load_model(svc.model)
        assert set(table(text)) == schema_paths(model), svc.title
        key = svc.example.split("=", 1)[0]
        assert key in table(text), f"{svc.title}: example {svc.example} is not a field"
        assert f"`{svc.env_prefix}__{key.upper().replace('.', '__')}=" in text
    rows = table(markdown)
    assert rows["minhash.num_perm"] == ("`int`, ≥ 16", "`128`", "")
    assert rows["data.sources[].path"][1] == "required"
    assert rows["data.sources[].weight"][1] == "`1.0`"
    assert rows["optim.schedule"][0] == '`"cosine" \\| "wsd"`'
    assert rows["steps.langid.languages"][1] == '`["en"]`'  # a default_factory, evaluated
    assert rows["engine.max_running"][1] == "`64`"


def test_a_changed_model_changes_the_output():
    before = ref.render([service(Small)])
    rows = table(before)
    assert rows["limits.depth"] == ("`int`, ≥ 1", "`5`", "how deep")  # the parent's default wins
    assert rows["sources[].path"] == ("`str`", "required", "where")
    assert rows["sources"][:2] == ("`list[Source]`", "`[]`")
    assert "`SMALL__LIMITS__DEPTH=2`" in before
    after = ref.render([service(SmallChanged)])
    assert after != before
    assert table(after)["limits.depth"][1] == "`3`"
    assert table(after)["retries"] == ("`int`", "`2`", "")


def test_check_fails_on_a_stale_readme_and_readme_fixes_it(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{ref.BEGIN}\n\nold table\n\n{ref.END}\n\nafter\n")
    assert ref.main(["--check", str(readme)]) == 1
    assert f"{readme} configuration reference is out of date: run `make docs`" in capsys.readouterr().err
    assert ref.main(["--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith(f"# x\n\n{ref.BEGIN}\n\n") and text.endswith(f"{ref.END}\n\nafter\n")
    assert "old table" not in text and "| `minhash.num_perm` |" in text
    assert ref.main(["--check", str(readme)]) == 0
    # Stale in one default only.
    readme.write_text(text.replace("| `minhash.num_perm` | `int`, ≥ 16 | `128` |", "| `minhash.num_perm` | "
                                   "`int`, ≥ 16 | `256` |"))
    assert ref.main(["--check", str(readme)]) == 1


@pytest.mark.parametrize("text", ["# no markers\n", f"only {ref.BEGIN}\n", f"{ref.END}\n{ref.BEGIN}\n"])
def test_readme_without_markers_is_refused_and_left_unchanged(tmp_path, capsys, text):
    readme = tmp_path / "README.md"
    readme.write_text(text)
    assert ref.main(["--readme", str(readme)]) != 0
    assert "config-reference:begin" in capsys.readouterr().err
    assert readme.read_text() == text
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]  # no temp file left behind


def test_print_without_flags(capsys):
    assert ref.main([]) == 0
    assert capsys.readouterr().out == ref.render()
