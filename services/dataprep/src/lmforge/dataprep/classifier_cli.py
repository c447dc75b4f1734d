"""The options of `lmforge-dataprep train-classifier`: the labelled sources, and one option per
field of ClassifierTrainingSettings (its description is the option's help)."""

from __future__ import annotations

import argparse
import typing

from lmforge.common.errors import ConfigError
from lmforge.dataprep.classifier_text import label_name
from lmforge.dataprep.classifier_training import ClassifierTrainingSettings

_SOURCES_HELP = "a .jsonl[.gz] file, a .parquet file or a data-prep output directory (local or s3://)"


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_train_classifier_options(parser: argparse.ArgumentParser) -> None:
    sources = parser.add_argument_group("examples (at least two labels)")
    sources.add_argument("--label", action="append", default=[], metavar="NAME=SOURCE",
                         help=f"examples of label NAME (repeatable, also per label); SOURCE: {_SOURCES_HELP}")
    sources.add_argument("--positive", nargs="+", default=[], metavar="SOURCE",
                         help="examples of --positive-label, e.g. a curated source")
    sources.add_argument("--negative", nargs="+", default=[], metavar="SOURCE",
                         help="examples of --negative-label, e.g. raw crawl")
    sources.add_argument("--positive-label", default="hq", help="default: hq, as DCLM's __label__hq")
    sources.add_argument("--negative-label", default="cc", help="default: cc, as DCLM's __label__cc")
    parser.add_argument("--output", required=True,
                        help="the model file (.bin), local or s3://; <name>.report.json and <name>.heldout.jsonl "
                             "(the held-out examples) are written beside it")
    training = parser.add_argument_group("training")
    for name, field in ClassifierTrainingSettings.model_fields.items():
        default = "the CPU count" if field.default_factory else field.default
        description = f"{field.description} (default: {default})"
        if field.annotation is bool:
            training.add_argument(_option(name), dest=name, action="store_true", default=None, help=description)
            continue
        if typing.get_origin(field.annotation) is typing.Literal:
            kind, choices = str, typing.get_args(field.annotation)
        else:  # int, float, str, or one of them | None
            kind = next((t for t in typing.get_args(field.annotation) if t is not type(None)), field.annotation)
            choices = None
        training.add_argument(_option(name), dest=name, default=None, choices=choices, type=kind,
                              help=description)


def sources_from_args(args: argparse.Namespace) -> dict[str, list[str]]:
    """label -> its sources, in the order given."""
    sources: dict[str, list[str]] = {}
    for item in args.label:
        name, sep, source = item.partition("=")
        if not sep or not name or not source:
            raise ConfigError(f"--label {item!r}: expected NAME=SOURCE")
        sources.setdefault(label_name(name), []).append(source)
    for label, given in ((args.positive_label, args.positive), (args.negative_label, args.negative)):
        if given:
            sources.setdefault(label_name(label), []).extend(given)
    return sources


def settings_from_args(args: argparse.Namespace) -> ClassifierTrainingSettings:
    given = {name: getattr(args, name) for name in ClassifierTrainingSettings.model_fields
             if getattr(args, name, None) is not None}
    try:
        return ClassifierTrainingSettings(**given)
    except ValueError as exc:  # pydantic's ValidationError
        problems = "; ".join(f"{_option(str(e['loc'][0]))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"train-classifier: {problems}") from None
