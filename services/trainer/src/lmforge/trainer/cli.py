"""`lmforge-train`: `run` and `preflight` start torchrun for you; `export` writes the serving package;
`report` draws a run's report.html from its metrics.jsonl; `plan` plans a run's cluster layout;
`presets` prints the model presets' sizes; `eval-checkpoint` evaluates a weights checkpoint
(lmforge.trainer.checkpoint_eval)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lmforge.common.cli import ServiceCli
from lmforge.common.errors import InputError
from lmforge.common.logging import get_logger
from lmforge.trainer.checkpoint_eval import add_arguments as add_eval_arguments
from lmforge.trainer.planner.command import add_arguments as add_plan_arguments
from lmforge.trainer.process_exit import frozen_exit

TORCHRUN_MODULES = {"run": "lmforge.trainer", "preflight": "lmforge.trainer.preflight"}


def cmd_torchrun(args: argparse.Namespace, _config: None) -> int:
    """torchrun, in this process, running the command's module; the config options go through as
    they were given (each rank loads the config). Exits with the first failed rank's code."""
    from lmforge.trainer.launch import torchrun

    return torchrun(TORCHRUN_MODULES[args.command], args.nproc, args.config, args.overrides)


def cmd_export(args: argparse.Namespace, _config: None) -> int:
    from lmforge.trainer.export import export as export_package

    path = export_package(args.checkpoint, args.output, package_format=args.format)
    get_logger("trainer").info("exported", checkpoint=args.checkpoint, output=str(path), format=args.format)
    return 0


def cmd_eval_checkpoint(args: argparse.Namespace, _config: None) -> int:
    from lmforge.trainer.checkpoint_eval import main_from_args

    return main_from_args(args)


def cmd_report(args: argparse.Namespace, _config: None) -> int:
    from lmforge.trainer.report_html import write_report

    run_dir = Path(args.run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        raise InputError(f"{args.run_dir} has no metrics.jsonl: not a run directory, or the run logged nothing yet")
    path = write_report(run_dir, Path(args.output) if args.output else None)
    get_logger("trainer").info("report_written", path=str(path))
    return 0


def cmd_plan(args: argparse.Namespace, _config: None) -> int:
    from lmforge.trainer.planner.command import run as run_plan

    return run_plan(args)


def cmd_presets(args: argparse.Namespace, _config: None) -> int:
    from lmforge.model.sizes import format_preset_sizes, preset_sizes, preset_sizes_json

    sizes = preset_sizes()
    sys.stdout.write(json.dumps(preset_sizes_json(sizes), indent=1) + "\n" if args.json
                     else format_preset_sizes(sizes) + "\n")
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
    export.add_argument("--format", choices=("lmforge", "hf"), default="lmforge",
                        help="hf: a Hugging Face transformers directory (AutoModelForCausalLM, vLLM, lm-eval; "
                             "lmforge-serve loads it too); a model no transformers architecture matches exactly "
                             "is refused (exit 2)")
    evaluation = cli.command("eval-checkpoint", cmd_eval_checkpoint,
                             help="evaluate a weights checkpoint's package: held-out loss per source and "
                                  "lm-evaluation-harness tasks → a result JSON and lmforge_eval_* gauges (exit 2 "
                                  "config, 3 input, 4 store, 70 bug)")
    add_eval_arguments(evaluation)
    report = cli.command("report", cmd_report, help="RUN_DIR/metrics.jsonl → a self-contained report.html (the "
                                                    "trainer also writes it at each checkpoint and at the end)")
    report.add_argument("--run-dir", required=True)
    report.add_argument("--output", help="default: RUN_DIR/report.html")
    plan = cli.command("plan", cmd_plan, help="capacity plan: memory, communication, step time and cost of each "
                                               "parallel layout on a cluster, and the recommended one as chart values")
    add_plan_arguments(plan)
    presets = cli.command("presets", cmd_presets,
                          help="every model preset's shape, parameter count and KV-cache size")
    presets.add_argument("--json", action="store_true", help="a JSON list instead of the table")
    return cli


CLI = build_cli()
main = CLI.main


if __name__ == "__main__":
    sys.exit(frozen_exit(main()))
