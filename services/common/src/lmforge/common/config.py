"""Config loading: a pydantic model filled from YAML, then environment, then CLI overrides.

Precedence (last wins): model defaults < YAML file < env vars < `key.sub=value` overrides.
Env vars use a service prefix and `__` for nesting, e.g.
`LMFORGE_DATAPREP__LANGID__THRESHOLD=0.5`. Values are parsed as YAML scalars/lists.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from lmforge.common.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base for config sections: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


def _set_path(tree: dict[str, Any], dotted: list[str], value: Any) -> None:
    node = tree
    for key in dotted[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[dotted[-1]] = value


def _parse_scalar(raw: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def env_overrides(prefix: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`PREFIX__A__B=v` → {"a": {"b": v}}."""
    environ = os.environ if environ is None else environ
    tree: dict[str, Any] = {}
    marker = prefix.upper() + "__"
    for key, raw in sorted(environ.items()):
        if key.startswith(marker):
            path = [p.lower() for p in key[len(marker) :].split("__") if p]
            if path:
                _set_path(tree, path, _parse_scalar(raw))
    return tree


def cli_overrides(pairs: Iterable[str]) -> dict[str, Any]:
    """["a.b=1", "c=x"] → {"a": {"b": 1}, "c": "x"}."""
    tree: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"override {pair!r} is not of the form key=value")
        key, raw = pair.split("=", 1)
        _set_path(tree, key.strip().split("."), _parse_scalar(raw))
    return tree


def deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for item in err.errors():
        if not item["loc"]:  # a check across fields: its message names them, the input is the whole config
            lines.append(f"  {item['msg'].removeprefix('Value error, ')}")
            continue
        field = ".".join(str(p) for p in item["loc"])
        lines.append(f"  {field}: {item['msg']} (got {item.get('input')!r})")
    return "\n".join(lines)


def read_yaml(path: str | Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must contain a mapping at the top level")
    return data


def load_config(
    model: type[M],
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
    env_prefix: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> M:
    """Build `model` from defaults, an optional YAML file, env vars and CLI overrides."""
    data: dict[str, Any] = read_yaml(path) if path else {}
    if env_prefix:
        data = deep_merge(data, env_overrides(env_prefix, environ))
    data = deep_merge(data, cli_overrides(overrides))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, str(path or "defaults"))) from exc


def dump_config(config: BaseModel) -> dict[str, Any]:
    """A JSON-safe dict of the resolved config, for run directories and manifests."""
    return config.model_dump(mode="json")
