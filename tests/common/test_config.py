from __future__ import annotations

import pytest
from pydantic import Field, model_validator

from lmforge.common.config import StrictModel, load_config
from lmforge.common.errors import ConfigError


class Inner(StrictModel):
    threshold: float = Field(0.5, ge=0, le=1)
    names: list[str] = Field(default_factory=lambda: ["a"])


class Outer(StrictModel):
    inner: Inner = Field(default_factory=Inner)
    size: int = 3


class Required(StrictModel):
    need: int


class Range(StrictModel):
    low: float = 0.0
    high: float = 1.0
    label: str = ""

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        return self


class UnnamedRange(Range):
    @model_validator(mode="after")
    def _ordered(self) -> UnnamedRange:
        if self.low > self.high:
            raise ValueError("out of order")
        return self


def test_defaults_then_yaml_then_env_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("size: 5\ninner:\n  threshold: 0.7\n")
    env = {"LMF__INNER__THRESHOLD": "0.8", "LMF__SIZE": "6"}
    config = load_config(Outer, path, ["size=9"], env_prefix="LMF", environ=env)
    assert config.inner.threshold == 0.8  # env beats YAML
    assert config.size == 9  # CLI beats env
    assert config.inner.names == ["a"]


def test_env_values_parse_as_yaml(tmp_path):
    config = load_config(Outer, None, [], env_prefix="LMF", environ={"LMF__INNER__NAMES": "[en, fr]"})
    assert config.inner.names == ["en", "fr"]


def test_invalid_value_names_the_field():
    with pytest.raises(ConfigError, match=r"inner\.threshold"):
        load_config(Outer, None, ["inner.threshold=3"])


def test_unknown_field_is_an_error():
    with pytest.raises(ConfigError, match=r"inner\.treshold"):
        load_config(Outer, None, ["inner.treshold=0.1"])


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(Outer, tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("size: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(Outer, bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(Outer, listy)


def test_override_without_equals_sign():
    with pytest.raises(ConfigError, match="key=value"):
        load_config(Outer, None, ["size"])


def test_an_invalid_config_names_where_the_bad_value_came_from(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("size: big\ninner:\n  threshold: 0.7\n")
    with pytest.raises(ConfigError, match=rf"^invalid configuration \({path}\):\n  size: "):
        load_config(Outer, path)
    with pytest.raises(ConfigError, match=r"^invalid configuration \(environment LMF__INNER__THRESHOLD\):\n"):
        load_config(Outer, None, env_prefix="LMF", environ={"LMF__INNER__THRESHOLD": "3"})
    with pytest.raises(ConfigError, match=r"^invalid configuration \(argument inner\.treshold=0\.1\):\n"):
        load_config(Outer, path, ["size=4", "inner.treshold=0.1"])  # not the file that set inner
    with pytest.raises(ConfigError, match=r"^invalid configuration \(argument inner=\{threshold: 2\}\):\n"):
        load_config(Outer, path, ["size=4", "inner={threshold: 2}"])  # set above the field
    with pytest.raises(ConfigError, match=rf"^invalid configuration \({path}, argument inner\.threshold=3\):\n"):
        load_config(Outer, path, ["inner.threshold=3"])  # one error from each
    assert load_config(Outer, path, ["size=4"], env_prefix="LMF", environ={"LMF__SIZE": "x"}).size == 4
    with pytest.raises(ConfigError, match=r"^invalid configuration \(defaults\):\n  need: Field required"):
        load_config(Required)



def test_a_check_across_fields_names_the_sources_of_the_fields_its_message_names(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("label: x\n")
    with pytest.raises(ConfigError, match=r"^invalid configuration \(argument low=2\):\n  low \(2\.0\) must not"):
        load_config(Range, path, ["low=2"])  # not the file, which set only the label
    path.write_text("label: x\nhigh: 0.5\n")
    with pytest.raises(ConfigError, match=rf"^invalid configuration \({path}, argument low=0\.9\):\n"):
        load_config(Range, path, ["low=0.9"])
    with pytest.raises(ConfigError, match=rf"^invalid configuration \({path}, argument low=0\.9\):\n  out of order"):
        load_config(UnnamedRange, path, ["low=0.9"])  # a message naming no field: every source



def test_yaml_document_names_what_is_missing_or_not_yaml(tmp_path):
    from lmforge.common.config import yaml_document

    listed = tmp_path / "stages.yaml"
    listed.write_text("- {start_tokens: 0}\n")
    assert yaml_document(listed) == [{"start_tokens": 0}]  # any document, not only a mapping
    with pytest.raises(ConfigError, match="--schedule: file not found: .*absent.yaml"):
        yaml_document(tmp_path / "absent.yaml", "--schedule: file")
    broken = tmp_path / "broken.yaml"
    broken.write_text("- {a: 1\n")
    with pytest.raises(ConfigError, match=r"config file .*broken.yaml is not valid YAML: \S") as error:
        yaml_document(broken)
    assert "\n" not in str(error.value)
