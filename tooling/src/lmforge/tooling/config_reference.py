"""The configuration reference, docs/configuration.md: a page of Markdown tables generated from the
services' pydantic config models.

    python -m lmforge.tooling.config_reference                                  # print the page
    python -m lmforge.tooling.config_reference --write docs/configuration.md    # rewrite it (make docs)
    python -m lmforge.tooling.config_reference --check docs/configuration.md    # exit 1 when it is out of date

The whole page is generated (no hand-written part to keep), so --check is a byte comparison. The
data-prep commands it names come from the stage graph (lmforge.dataprep.stages), not from a list
written here.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from lmforge.canary.config import CanaryConfig
from lmforge.dataprep.config import DataprepConfig
from lmforge.dataprep.stages import STAGES, WORKERS
from lmforge.demo.config import DemoConfig
from lmforge.inference.config import ServeConfig
from lmforge.tooling.generated_file import generated_file_main
from lmforge.trainer.config import TrainConfig
from lmforge.uploader.config import UploaderConfig

TITLE = "# Configuration reference"
GENERATED = ("Generated from the services' pydantic config models by `make docs` "
             "(`python -m lmforge.tooling.config_reference --write docs/configuration.md`); a test fails when this "
             "page is out of date. Edit the models, not this page.")
PRECEDENCE = ("Precedence, last wins: the defaults below < the YAML file (`--config`) < environment variables "
              "< command-line values. Values are parsed as YAML (`8`, `true`, `[en, de]`, `{2: 0.2}`); an unknown "
              "or invalid field stops the program with a message naming it.")


@dataclass(frozen=True)
class Service:
    title: str
    programs: tuple[str, ...]  # the commands, shown in the heading
    page: str  # the service's page in docs/, linked from its section
    env_prefix: str
    model: type[BaseModel]
    usage: str  # how to set a field, Markdown; {example} is replaced by the example override
    example: str  # an override such as "steps.langid.threshold=0.5", also shown as an environment variable


def dataprep_config_commands() -> tuple[str, ...]:
    """The lmforge-dataprep commands that take the config: one per stage of the stage graph (`run` for
    the workers' stage, the stage's own name for each global stage), then `finalize` (every global stage)."""
    return (*("run" if s.kind == WORKERS else s.name for s in STAGES), "finalize")


SERVICES = [
    Service("Data prep", ("lmforge-dataprep",), "dataprep.md", "LMFORGE_DATAPREP", DataprepConfig,
            f"`lmforge-dataprep {'|'.join(dataprep_config_commands())}` take `--config FILE` and `--set {{example}}` "
            "(repeatable; a global stage given neither uses the config the workers recorded). Helm: "
            "`dataprep.config`; data pipeline: `dataprep_config`.",
            "steps.langid.threshold=0.5"),
    Service("Trainer", ("lmforge-train", "python -m lmforge.trainer"), "trainer.md", "LMFORGE_TRAINER",
            TrainConfig,
            "`lmforge-train run [--nproc N] [--config FILE] {example} …` or `torchrun … -m lmforge.trainer "
            "[--config FILE] key=value …`: plain `key=value` arguments, no `--set`. Helm: `training.config`; "
            "train pipeline: `train_config`.",
            "optim.lr=0.0003"),
    Service("Checkpoint uploader", ("lmforge-uploader",), "uploader.md", "LMFORGE_UPLOADER", UploaderConfig,
            "`lmforge-uploader watch|restore` take `--config FILE` and `--set {example}`. "
            "Helm: `training.uploader.config`.",
            "transfer.concurrency=16"),
    Service("Inference", ("lmforge-serve",), "inference.md", "LMFORGE_SERVE", ServeConfig,
            "`lmforge-serve` takes `--config FILE` and `--set {example}`; `--model`, `--host`, `--port` set "
            "those fields. Helm: `inference.config` (the chart sets model, host, ports, `pointer_poll_seconds` "
            "(`inference.pointerPollSeconds`), the API keys file and `api_docs`, from `inference.apiDocs`, off by "
            "default).",
            "engine.max_running=16"),
    Service("Canary", ("lmforge-canary",), "canary.md", "LMFORGE_CANARY", CanaryConfig,
            "`lmforge-canary run|make-baseline` take `--config FILE` and `--set {example}`. Helm: `canary.config`.",
            "tolerance.max_score_drop=0.1"),
    Service("Demo", ("lmforge-demo",), "demo.md", "LMFORGE_DEMO", DemoConfig,
            "`make demo DEMO_ARGS=\"--set {example}\"` (or `lmforge-demo run --set …`, `--config FILE`); "
            "`DEMO_CRAWL=CC-MAIN-…` sets `data.crawl`.",
            "train.steps=600"),
]


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


def _prose(text: str) -> str:
    """A description as Markdown: a `<` outside code spans is escaped, so `<main>` reads as text on the
    site (Python-Markdown passes raw HTML through) as it does on GitHub."""
    parts = text.split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;") for i, part in enumerate(parts))


def render_service(service: Service) -> str:
    model = service.model
    key, _, raw = service.example.partition("=")
    env = f"{service.env_prefix}__{key.upper().replace('.', '__')}={raw}"
    programs = ", ".join(f"`{p}`" for p in service.programs)
    lines = [f"## {service.title} ({programs})", "",
             f"{service.usage.format(example=service.example)} Environment: `{env}` (`__` between levels). "
             f"What the service does: [{service.title}]({service.page}).", "",
             "| field | type | default | description |", "|---|---|---|---|"]
    lines += [f"| `{_cell(path)}` | {_cell(kind)} | {_cell(default)} | {_cell(_prose(text))} |"
              for path, kind, default, text in fields(model)]
    return "\n".join(lines) + "\n"


def render(services: Sequence[Service] = tuple(SERVICES)) -> str:
    return "\n".join([TITLE + "\n", GENERATED + "\n", PRECEDENCE + "\n", *(render_service(s) for s in services)])


def main(argv: Sequence[str] | None = None) -> int:
    return generated_file_main(argv, prog="python -m lmforge.tooling.config_reference", description=__doc__,
                               what="configuration reference", render=render)


if __name__ == "__main__":
    sys.exit(main())
