"""Config loading: a pydantic model filled from YAML, then environment, then CLI overrides.

Precedence (last wins): model defaults < YAML file < env vars < `key.sub=value` overrides.
Env vars use a service prefix and `__` for nesting, e.g.
`LMFORGE_DATAPREP__LANGID__THRESHOLD=0.5`. Values are parsed as YAML scalars/lists. An invalid
configuration's error names where its bad values came from: the file, the variable, the override.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
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


# Values from one place (the YAML file, one variable, one override) and the place, as an error names it.
Layer = tuple[str, dict[str, Any]]


def _tree(path: list[str], value: Any) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    _set_path(tree, path, value)
    return tree


def _merged(layers: Iterable[Layer]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for _, values in layers:
        tree = deep_merge(tree, values)
    return tree


def env_layers(prefix: str, environ: Mapping[str, str] | None = None) -> list[Layer]:
    """`PREFIX__A__B=v` → ("environment PREFIX__A__B", {"a": {"b": v}}), in the order they apply."""
    environ = os.environ if environ is None else environ
    marker = prefix.upper() + "__"
    layers = []
    for key, raw in sorted(environ.items()):
        if key.startswith(marker):
            path = [p.lower() for p in key[len(marker) :].split("__") if p]
            if path:
                layers.append((f"environment {key}", _tree(path, _parse_scalar(raw))))
    return layers


def override_layers(pairs: Iterable[str]) -> list[Layer]:
    """"a.b=1" → ("argument a.b=1", {"a": {"b": 1}}), in the order they apply."""
    layers = []
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"override {pair!r} is not of the form key=value")
        key, raw = pair.split("=", 1)
        layers.append((f"argument {pair}", _tree(key.strip().split("."), _parse_scalar(raw))))
    return layers


def env_overrides(prefix: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`PREFIX__A__B=v` → {"a": {"b": v}}."""
    return _merged(env_layers(prefix, environ))


def cli_overrides(pairs: Iterable[str]) -> dict[str, Any]:
    """["a.b=1", "c=x"] → {"a": {"b": 1}, "c": "x"}."""
    return _merged(override_layers(pairs))


def sources_of(err: ValidationError, layers: list[Layer]) -> str:
    """Where the values an error is about came from, in the order they apply: "defaults" (also for
    a required field left out), the file, variables, overrides."""
    found = [source_of(item["loc"], layers, item["msg"]) for item in err.errors()]
    named = {source for sources in found for source in sources}
    return ", ".join(dict.fromkeys([*(["defaults"] if [] in found else []), *(s for s, _ in layers if s in named)]))


def source_of(loc: tuple[str | int, ...], layers: list[Layer], message: str = "") -> list[str]:
    """Where the value at `loc` (a validation error's location) came from: the last layer that set
    it or something under it; none when no layer did (a default, or a required field left out).
    A check across the whole config (empty loc) names its fields in its message: the layers that
    set a field it names, else every layer."""
    if not loc:
        named = [source for source, values in layers if any(_names(message, path) for path in _leaves(values))]
        return named or [source for source, values in layers if values]
    for source, values in reversed(layers):
        node: Any = values
        for key in loc:
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
            if not isinstance(node, dict):  # this layer set the value at or above loc
                return [source]
        else:
            return [source]  # this layer set something under loc
    return []


def _leaves(tree: dict[str, Any], above: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, (*above, key))
        else:
            yield (*above, key)


def _names(message: str, path: tuple[str, ...]) -> bool:
    """Whether `message` names the field at `path`, whole or by its last parts (`n_embd`)."""
    names = (".".join(map(str, path[i:])) for i in range(len(path)))
    return any(re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", message) for name in names)


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


def yaml_document(path: str | Path, what: str = "config file") -> Any:
    """A YAML file's document; ConfigError naming `what` when it is missing or not YAML."""
    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{what} not found: {path}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {path} is not valid YAML: {' '.join(str(exc).split())}") from exc


def read_yaml(path: str | Path) -> dict[str, Any]:
    data = yaml_document(path)
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
    layers: list[Layer] = [(str(path), read_yaml(path))] if path else []
    if env_prefix:
        layers += env_layers(env_prefix, environ)
    layers += override_layers(overrides)
    try:
        return model.model_validate(_merged(layers))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, sources_of(exc, layers))) from exc


def dump_config(config: BaseModel) -> dict[str, Any]:
    """A JSON-safe dict of the resolved config, for run directories and manifests."""
    return config.model_dump(mode="json")
