"""`lmforge-train`: `run` and `preflight` start torchrun for you; `export` writes the serving package;
`report` draws a run's report.html from its metrics.jsonl."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from lmforge.common.cli import ServiceCli
from lmforge.common.errors import InputError
from lmforge.common.logging import get_logger

TORCHRUN_MODULES = {"run": "lmforge.trainer", "preflight": "lmforge.trainer.preflight"}


def cmd_torchrun(args: argparse.Namespace, _config: None) -> int:
    """Replace this process with torchrun running the command's module; the config options go
    through as they were given (each rank loads the config)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
               "-m", TORCHRUN_MODULES[args.command], *(["--config", args.config] if args.config else []),
               *args.overrides]
    os.execv(sys.executable, command)  # noqa: S606 - replaces this process with torchrun


def cmd_export(args: argparse.Namespace, _config: None) -> int:
    from lmforge.trainer.export import export as export_package

    path = export_package(args.checkpoint, args.output)
    get_logger("trainer").info("exported", checkpoint=args.checkpoint, output=str(path))
    return 0


def cmd_report(args: argparse.Namespace, _config: None) -> int:
    from lmforge.trainer.report_html import write_report

    run_dir = Path(args.run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        raise InputError(f"{args.run_dir} has no metrics.jsonl: not a run directory, or the run logged nothing yet")
    path = write_report(run_dir, Path(args.output) if args.output else None)
    get_logger("trainer").info("report_written", path=str(path))
    return 0


def build_cli() -> ServiceCli:
    # Training's own style: plain key=value overrides (no --set), which torchrun passes through.
    cli = ServiceCli("lmforge-train", service="trainer", description=__doc__, set_help=None)
    run = cli.command("run", cmd_torchrun, config="pass",
                      help="torchrun --standalone --nproc_per_node N -m lmforge.trainer …")
    run.add_argument("--nproc", type=int, default=1)
    preflight = cli.command("preflight", cmd_torchrun, config="pass",
                            config_help="YAML config file (the training one works; no data needed)",
                            help="check every rank's device and time an all-reduce, under torchrun")
    preflight.add_argument("--nproc", type=int, default=1)
    export = cli.command("export", cmd_export,
                         help="a committed checkpoint → model.safetensors, config.json, tokenizer.json")
    export.add_argument("--checkpoint", required=True)
    export.add_argument("--output", required=True)
    report = cli.command("report", cmd_report, help="RUN_DIR/metrics.jsonl → a self-contained report.html (the "
                                                    "trainer also writes it at each checkpoint and at the end)")
    report.add_argument("--run-dir", required=True)
    report.add_argument("--output", help="default: RUN_DIR/report.html")
    return cli


CLI = build_cli()
main = CLI.main


if __name__ == "__main__":
    sys.exit(main())
