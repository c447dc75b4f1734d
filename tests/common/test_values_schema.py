"""The chart's values.schema.json, generated: in sync with its sources, self-contained draft-07, each
service's `config:` section the schema of the service's model (fields, bounds, defaults, no extras)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import BaseModel, Field
from pydantic_core import to_jsonable_python

from lmforge.canary.config import CanaryConfig
from lmforge.common.config import StrictModel
from lmforge.dataprep.config import DataprepConfig
from lmforge.inference.config import ServeConfig
from lmforge.tooling import values_schema
from lmforge.tooling.generated_file import write_if_changed
from lmforge.trainer.config import TrainConfig
from lmforge.uploader.config import UploaderConfig

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "helm" / "lmforge" / "values.schema.json"
VALUES = REPO / "helm" / "lmforge" / "values.yaml"
SECTIONS = {  # where each service's config sits in the chart's values
    ("dataprep", "config"): DataprepConfig,
    ("training", "config"): TrainConfig,
    ("training", "uploader", "config"): UploaderConfig,
    ("inference", "config"): ServeConfig,
    ("canary", "config"): CanaryConfig,
}


class Inner(StrictModel):
    depth: int = Field(3, ge=1, description="how deep")
    ratio: float | None = Field(None, gt=0, le=1)


class Small(StrictModel):
    inner: Inner = Field(default_factory=Inner)
    pair: tuple[float, float] = (0.9, 0.95)
    names: list[str] = Field(default_factory=lambda: ["en"])
    shares: dict[int, float] = Field(default_factory=lambda: {2: 0.2})
    required: str = Field(description="no default")


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return values_schema.build()


def section(schema: dict, path: tuple[str, ...]) -> dict:
    for key in path:
        schema = schema["properties"][key]
    return schema


def keywords(node: Any) -> set[str]:
    """Every keyword used anywhere in a schema (not the names under `properties`)."""
    if isinstance(node, list):
        return set().union(*(keywords(n) for n in node)) if node else set()
    if not isinstance(node, dict):
        return set()
    found = set(node)
    for key, value in node.items():
        if key == "properties":
            found |= set().union(*(keywords(v) for v in value.values())) if value else set()
        elif key in ("items", "additionalProperties", "anyOf", "oneOf", "allOf"):
            found |= keywords(value)
    return found


def test_checked_in_schema_is_current():
    result = subprocess.run([sys.executable, "-m", "lmforge.tooling.values_schema", "--check", str(SCHEMA)],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr  # stale after a model or chart_values change: `make docs`


def test_write_then_check(tmp_path):
    target = tmp_path / "values.schema.json"
    assert values_schema.main(["--check", str(target)]) == 1  # missing
    assert values_schema.main(["--write", str(target)]) == 0
    assert values_schema.main(["--check", str(target)]) == 0
    assert json.loads(target.read_text(encoding="utf-8")) == values_schema.build()
    assert not write_if_changed(target, values_schema.render())  # up to date: left alone
    target.write_text(target.read_text(encoding="utf-8").replace('"minimum": 1', '"minimum": 2', 1))
    assert values_schema.main(["--check", str(target)]) == 1


def test_schema_is_self_contained_draft07_and_accepts_the_chart_defaults(schema):
    jsonschema.Draft7Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft-07/schema#"
    assert not {"$ref", "$defs", "definitions", "prefixItems", values_schema.SERVICE_CONFIG} & keywords(schema)
    assert "title" not in keywords(schema["properties"])
    jsonschema.Draft7Validator(schema).validate(yaml.safe_load(VALUES.read_text(encoding="utf-8")))


def test_a_service_schema_inlines_sections_keeps_defaults_and_refuses_extras():
    small = values_schema.service_schema(Small)
    props = small["properties"]
    assert small["additionalProperties"] is False and small["required"] == ["required"]
    inner = props["inner"]
    assert inner["additionalProperties"] is False and "default" not in inner  # its fields carry theirs
    assert inner["properties"]["depth"] == {"type": "integer", "description": "how deep", "default": 3, "minimum": 1}
    assert props["names"]["default"] == ["en"] and props["shares"]["default"] == {"2": 0.2}  # factories too
    assert props["pair"]["default"] == [0.9, 0.95] and len(props["pair"]["items"]) == 2  # a tuple, draft-07 style
    validator = jsonschema.Draft7Validator(small)
    assert validator.is_valid({"required": "x", "inner": {"ratio": "0.5"}, "pair": ["0.8", 0.9]})
    assert validator.is_valid({"required": "x", "inner": {"ratio": None}, "shares": {"3": "1e-2"}})
    for bad in ({"inner": {"ratio": 2}}, {"inner": {"ratio": "half"}}, {"inner": {"depth": "3"}},
                {"inner": {"deep": 1}}, {"pair": [1.0]}, {"extra": 1}, {}):
        assert not validator.is_valid({"required": "x", **bad} if bad else bad), bad


def _model_in(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _assert_matches(model: type[BaseModel], node: dict, where: str) -> None:
    """Every field of `model` is in `node` with the model's default; nothing else is allowed, except
    in a model that takes extra keys (the data-prep steps: a user's own step ids)."""
    assert node["additionalProperties"] is (model.model_config.get("extra") == "allow"), where
    assert list(node["properties"]) == list(model.model_fields), where
    assert node.get("required", []) == [n for n, f in model.model_fields.items() if f.is_required()], where
    for name, field in model.model_fields.items():
        prop, inner = node["properties"][name], _model_in(field.annotation)
        if inner is not None:
            _assert_matches(inner, prop, f"{where}.{name}")
        elif not field.is_required():
            default = to_jsonable_python(field.get_default(call_default_factory=True))
            assert prop["default"] == default, f"{where}.{name}"


@pytest.mark.parametrize("path", sorted(SECTIONS), ids=".".join)
def test_each_service_config_section_is_its_models_schema(schema, path):
    node = section(schema, path)
    _assert_matches(SECTIONS[path], node, ".".join(path))
    assert node["description"]  # the chart's words about the section


def test_service_number_fields_take_numeric_strings_as_helm_set_gives_them(schema):
    """`helm --set dataprep.config.steps.langid.threshold=0.5` makes 0.5 a string; the service reads a number."""
    validator = jsonschema.Draft7Validator(schema)
    base = yaml.safe_load(VALUES.read_text(encoding="utf-8"))

    def valid(config: dict) -> bool:
        return validator.is_valid({**base, "dataprep": {**base["dataprep"], "config": config}})

    assert valid({"steps": {"langid": {"threshold": "0.5"}}}) and valid({"steps": {"langid": {"threshold": 0.5}}})
    assert not valid({"steps": {"langid": {"threshold": "lots"}}})
    assert not valid({"steps": {"langid": {"threshold": 1.5}}})
    assert not valid({"steps": {"langid": {"treshold": 0.5}}})
    assert not valid({"minhash": {"num_perm": "128"}})  # integers come through --set as integers
