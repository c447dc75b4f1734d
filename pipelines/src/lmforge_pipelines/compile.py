"""Compile the pipelines to KFP IR YAML for upload: `python -m lmforge_pipelines.compile --output DIR`
writes DIR/data.yaml and DIR/train.yaml (`make pipelines`: build/pipelines/)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from kfp import compiler

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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmforge_pipelines.compile", description=__doc__)
    parser.add_argument("--output", default="build/pipelines", help="directory for data.yaml and train.yaml")
    args = parser.parse_args(argv)
    try:
        written = compile_all(args.output)
    except OSError as exc:  # an output that cannot be written: one line and exit 4, like every lmforge CLI
        from lmforge.common.errors import report_failure
        from lmforge.common.logging import get_logger

        return report_failure(get_logger("pipelines"), parser.prog, exc)
    for path in written:
        sys.stdout.write(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
