"""Compile the pipelines to KFP IR YAML for upload: `python -m lmforge_pipelines.compile --output DIR`
writes DIR/data.yaml and DIR/train.yaml (`make pipelines`: build/pipelines/)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kfp import compiler

from lmforge.common.cli import ServiceCli
from lmforge.dataprep.stages import DEFAULT_MAX_ROUNDS
from lmforge_pipelines.data_pipeline import build_data_pipeline
from lmforge_pipelines.train_pipeline import train_pipeline


def compile_all(output: str | Path, rounds: int = DEFAULT_MAX_ROUNDS) -> list[Path]:
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    written = []
    for name, pipeline in {"data.yaml": build_data_pipeline(rounds), "train.yaml": train_pipeline}.items():
        compiler.Compiler().compile(pipeline_func=pipeline, package_path=str(output / name))
        written.append(output / name)
    return written


def _compile(args: argparse.Namespace, _config: None) -> int:
    for path in compile_all(args.output, args.rounds):  # an output that cannot be written: one line and exit 4
        sys.stdout.write(f"wrote {path}\n")
    return 0


def build_cli() -> ServiceCli:
    cli = ServiceCli("python -m lmforge_pipelines.compile", service="pipelines", description=__doc__)
    parser = cli.command(None, _compile)
    parser.add_argument("--output", default="build/pipelines", help="directory for data.yaml and train.yaml")
    parser.add_argument("--rounds", type=int, default=DEFAULT_MAX_ROUNDS,
                        help="components rounds the data pipeline schedules: the runs' components.max_rounds "
                             "(a KFP graph is fixed when compiled)")
    return cli


CLI = build_cli()
main = CLI.main


if __name__ == "__main__":
    sys.exit(main())
