"""The configuration reference: Markdown tables generated from the services' pydantic config models.

    python -m lmforge.common.config_reference                     # print the Markdown
    python -m lmforge.common.config_reference --readme README.md  # rewrite the README's section (make docs)
    python -m lmforge.common.config_reference --check README.md   # exit 1 when that section is out of date

The section is the text between BEGIN and END in the README. The services are found by
"module:Class" through importlib, so lmforge.common imports none of them.
"""

from __future__ import annotations

import importlib
import shutil
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from lmforge.common.errors import ConfigError
from lmforge.common.generated_file import generated_file_main
from lmforge.common.storage import atomic_path

BEGIN = "<!-- config-reference:begin -->"
END = "<!-- config-reference:end -->"
PRECEDENCE = ("Precedence, last wins: the defaults below < the YAML file (`--config`) < environment variables "
              "< command-line values. Values are parsed as YAML (`8`, `true`, `[en, de]`, `{2: 0.2}`); an unknown "
              "or invalid field stops the program with a message naming it.")


@dataclass(frozen=True)
class Service:
    title: str
    programs: tuple[str, ...]  # the commands, shown in the heading
    env_prefix: str
    model: str  # "module:Class"
    usage: str  # how to set a field, Markdown; {example} is replaced by the example override
    example: str  # an override such as "steps.langid.threshold=0.5", also shown as an environment variable


SERVICES = [
    Service("Data prep", ("lmforge-dataprep",), "LMFORGE_DATAPREP", "lmforge.dataprep.config:DataprepConfig",
            "`lmforge-dataprep run|dedup|cluster|tokenizer|tokenize|shards|report|finalize` take `--config FILE` "
            "and `--set {example}` (repeatable). Helm: `dataprep.config`; data pipeline: `dataprep_config`.",
            "steps.langid.threshold=0.5"),
    Service("Trainer", ("lmforge-train", "python -m lmforge.trainer"), "LMFORGE_TRAINER",
            "lmforge.trainer.config:TrainConfig",
            "`lmforge-train run [--nproc N] [--config FILE] {example} …` or `torchrun … -m lmforge.trainer "
            "[--config FILE] key=value …`: plain `key=value` arguments, no `--set`. Helm: `training.config`; "
            "train pipeline: `train_config`.",
            "optim.lr=0.0003"),
    Service("Checkpoint uploader", ("lmforge-uploader",), "LMFORGE_UPLOADER", "lmforge.uploader.config:UploaderConfig",
            "`lmforge-uploader watch|restore` take `--config FILE` and `--set {example}`. "
            "Helm: `training.uploader.config`.",
            "transfer.concurrency=16"),
    Service("Inference", ("lmforge-serve",), "LMFORGE_SERVE", "lmforge.inference.config:ServeConfig",
            "`lmforge-serve` takes `--config FILE` and `--set {example}`; `--model`, `--host`, `--port` set "
            "those fields. Helm: `inference.config` (the chart sets model, host, ports, `pointer_poll_seconds` "
            "(`inference.pointerPollSeconds`), the API keys file and `api_docs`, from `inference.apiDocs`, off by "
            "default).",
            "engine.max_running=16"),
    Service("Canary", ("lmforge-canary",), "LMFORGE_CANARY", "lmforge.canary.config:CanaryConfig",
            "`lmforge-canary run|make-baseline` take `--config FILE` and `--set {example}`. Helm: `canary.config`.",
            "tolerance.max_score_drop=0.1"),
    Service("Demo", ("lmforge-demo",), "LMFORGE_DEMO", "lmforge.demo.config:DemoConfig",
            "`make demo DEMO_ARGS=\"--set {example}\"` (or `lmforge-demo run --set …`, `--config FILE`); "
            "`DEMO_CRAWL=CC-MAIN-…` sets `data.crawl`.",
            "train.steps=600"),
]


def load_model(spec: str) -> type[BaseModel]:
    module_name, _, class_name = spec.partition(":")
    try:
        model = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load config model {spec} ({exc}); is its service installed? (make setup)") from exc
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise ConfigError(f"{spec} is not a pydantic model")
    return model


def _model_in(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(the model a field holds, whether it holds a list of them), or (None, False) for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) in (Union, types.UnionType) and len(args) == 1:
        return _model_in(args[0])
    if get_origin(annotation) is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return args[0], True
    return None, False


def type_name(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    if origin is Literal:
        return " | ".join(_value(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]" if args else origin.__name__
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(field: FieldInfo) -> str:
    signs = {Ge: ("≥", "ge"), Gt: (">", "gt"), Le: ("≤", "le"), Lt: ("<", "lt"), MinLen: ("length ≥", "min_length")}
    parts = [f"{signs[type(m)][0]} {_value(getattr(m, signs[type(m)][1]))}" for m in field.metadata
             if type(m) in signs]
    return f", {', '.join(parts)}" if parts else ""


def _value(value: Any) -> str:
    """A default as it would be written in the YAML file (flow style, strings quoted)."""
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_value(k)}: {_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def fields(model: type[BaseModel], prefix: str = "", defaults: BaseModel | None = None) -> Iterator[tuple[str, ...]]:
    """(dotted path, type, default, description) of every leaf field, nested sections flattened.
    `defaults` is the parent's default instance of this section, whose values win over the class's."""
    for name, field in model.model_fields.items():
        path = prefix + name
        if defaults is not None:
            required, default = False, getattr(defaults, name)
        else:
            required = field.is_required()
            default = None if required else field.get_default(call_default_factory=True)
        inner, is_list = _model_in(field.annotation)
        if inner is not None and not is_list:
            yield from fields(inner, path + ".", default if isinstance(default, BaseModel) else None)
            continue
        type_text = type_name(field.annotation)
        if is_list:
            type_text = f"list[{inner.__name__}]"
        shown = "required" if required else f"`{_value(default)}`"
        yield path, f"`{type_text}`{_bounds(field)}", shown, field.description or ""
        if is_list:
            yield from fields(inner, path + "[].")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_service(service: Service) -> str:
    model = load_model(service.model)
    key, _, raw = service.example.partition("=")
    env = f"{service.env_prefix}__{key.upper().replace('.', '__')}={raw}"
    programs = ", ".join(f"`{p}`" for p in service.programs)
    lines = [f"### {service.title} ({programs})", "",
             f"{service.usage.format(example=service.example)} Environment: `{env}` (`__` between levels).", "",
             "| field | type | default | description |", "|---|---|---|---|"]
    lines += [f"| `{_cell(path)}` | {_cell(kind)} | {_cell(default)} | {_cell(text)} |"
              for path, kind, default, text in fields(model)]
    return "\n".join(lines) + "\n"


def render(services: Sequence[Service] = tuple(SERVICES)) -> str:
    return "\n".join([PRECEDENCE + "\n", *(render_service(s) for s in services)])


def _split(text: str, path: Path) -> tuple[str, str, str]:
    """(before the section, the section, after it) of a README."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ConfigError(f"{path}: needs exactly one {BEGIN} line followed by one {END} line, around the "
                          "configuration reference")
    head, rest = text.split(BEGIN, 1)
    body, tail = rest.split(END, 1)
    return head + BEGIN, body, END + tail


def section(markdown: str) -> str:
    return "\n\n" + markdown.rstrip("\n") + "\n\n"


def update_readme(path: Path, markdown: str) -> bool:
    """Rewrite the section of `path` (atomically, keeping its mode); False when it was up to date."""
    head, body, tail = _split(path.read_text(encoding="utf-8"), path)
    if body == section(markdown):
        return False
    with atomic_path(path) as tmp:
        tmp.write_text(head + section(markdown) + tail, encoding="utf-8")
        shutil.copymode(path, tmp)
    return True


def is_current(path: Path, markdown: str) -> bool:
    return _split(path.read_text(encoding="utf-8"), path)[1] == section(markdown)


def main(argv: Sequence[str] | None = None) -> int:
    return generated_file_main(argv, prog="python -m lmforge.common.config_reference", description=__doc__,
                               what="configuration reference", render=render, update=update_readme,
                               is_current=is_current, write_flag="--readme",
                               write_help="rewrite the section between the markers")


if __name__ == "__main__":
    sys.exit(main())
