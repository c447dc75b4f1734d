"""Compile the pipelines to KFP IR YAML for upload: `python -m lmforge_pipelines.compile --output DIR`
writes DIR/data.yaml and DIR/train.yaml (`make pipelines`: build/pipelines/)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kfp import compiler

from lmforge.common.cli import ServiceCli
from lmforge_pipelines.data_pipeline import data_pipeline
from lmforge_pipelines.train_pipeline import train_pipeline

PIPELINES = {"data.yaml": data_pipeline, "train.yaml": train_pipeline}


def compile_all(output: str | Path) -> list[Path]:
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    written = []
    for name, pipeline in PIPELINES.items():
        compiler.Compiler().compile(pipeline_func=pipeline, package_path=str(output / name))
        written.append(output / name)
    return written


def _compile(args: argparse.Namespace, _config: None) -> int:
    for path in compile_all(args.output):  # an output that cannot be written: one line and exit 4
        sys.stdout.write(f"wrote {path}\n")
    return 0


def build_cli() -> ServiceCli:
    cli = ServiceCli("python -m lmforge_pipelines.compile", service="pipelines", description=__doc__)
    parser = cli.command(None, _compile)
    parser.add_argument("--output", default="build/pipelines", help="directory for data.yaml and train.yaml")
    return cli


CLI = build_cli()
main = CLI.main


if __name__ == "__main__":
    sys.exit(main())
