"""The generated configuration reference, docs/configuration.md: in sync with the models, every field listed,
the data-prep commands it names those of the stage graph, --write / --check."""

import re
import subprocess
import sys
from pathlib import Path

from pydantic import Field

from lmforge.common.config import StrictModel
from lmforge.tooling import config_reference as ref

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "configuration.md"
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
    return ref.Service("Small", ("small",), "small.md", "SMALL", model, "`small --set {example}`.",
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


def test_configuration_page_is_in_sync():
    result = subprocess.run([sys.executable, "-m", "lmforge.tooling.config_reference", "--check",
                             "docs/configuration.md"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert PAGE.read_text() == ref.render()


def test_every_field_of_every_service_is_listed():
    markdown = ref.render()
    sections = re.split(r"^## ", markdown, flags=re.M)[1:]
    assert [s.split(" (", 1)[0] for s in sections] == [s.title for s in ref.SERVICES]
    for text, svc in zip(sections, ref.SERVICES, strict=True):
        model = svc.model
        assert set(table(text)) == schema_paths(model), svc.title
        key = svc.example.split("=", 1)[0]
        assert key in table(text), f"{svc.title}: example {svc.example} is not a field"
        assert f"`{svc.env_prefix}__{key.upper().replace('.', '__')}=" in text
        assert f"]({svc.page})" in text and (REPO / "docs" / svc.page).is_file(), svc.page
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


def test_check_fails_on_a_stale_page_and_write_fixes_it(tmp_path, capsys):
    page = tmp_path / "configuration.md"
    assert ref.main(["--check", str(page)]) == 1  # missing
    page.write_text("# Configuration reference\n\nold table\n")
    page.chmod(0o640)
    assert ref.main(["--check", str(page)]) == 1
    assert f"{page} configuration reference is out of date: run `make docs`" in capsys.readouterr().err
    assert ref.main(["--write", str(page)]) == 0
    assert "configuration reference updated" in capsys.readouterr().out
    text = page.read_text()
    assert text == ref.render() and "old table" not in text and "| `minhash.num_perm` |" in text
    assert page.stat().st_mode & 0o777 == 0o640  # the file's own mode kept
    assert ref.main(["--check", str(page)]) == 0
    assert ref.main(["--write", str(page)]) == 0
    assert "up to date" in capsys.readouterr().out
    # Stale in one default only.
    page.write_text(text.replace("| `minhash.num_perm` | `int`, ≥ 16 | `128` |", "| `minhash.num_perm` | "
                                 "`int`, ≥ 16 | `256` |"))
    assert ref.main(["--check", str(page)]) == 1


def test_a_page_that_cannot_be_written_is_one_line_and_leaves_nothing(tmp_path, capsys):
    (tmp_path / "docs").write_text("a file where the folder should be\n")
    assert ref.main(["--write", str(tmp_path / "docs" / "configuration.md")]) == 3
    err = capsys.readouterr().err
    assert err.startswith("python -m lmforge.tooling.config_reference: error:") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs"]
    assert (tmp_path / "docs").read_text() == "a file where the folder should be\n"


def test_dataprep_commands_are_the_stage_graphs():
    from lmforge.dataprep.cli import build_cli
    from lmforge.dataprep.stages import GLOBAL_STAGES

    commands = ref.dataprep_config_commands()
    assert commands == ("run", *(s.name for s in GLOBAL_STAGES), "finalize")
    assert f"`lmforge-dataprep {'|'.join(commands)}` take `--config FILE`" in ref.render()
    parser = build_cli().parser
    for command in commands:  # each is a command of lmforge-dataprep that takes the config
        args = parser.parse_args([command, "--output", "out", "--config", "dataprep.yaml",
                                  *(["--input", "in.warc.wet.gz"] if command == "run" else [])])
        assert (args.command, args.config) == (command, "dataprep.yaml")


def test_print_without_flags(capsys):
    assert ref.main([]) == 0
    assert capsys.readouterr().out == ref.render()
