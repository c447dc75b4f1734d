import pytest
from pydantic import Field

from lmforge.common.config import StrictModel, load_config
from lmforge.common.errors import ConfigError


class Inner(StrictModel):
    threshold: float = Field(0.5, ge=0, le=1)
    names: list[str] = Field(default_factory=lambda: ["a"])


class Outer(StrictModel):
    inner: Inner = Field(default_factory=Inner)
    size: int = 3


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
