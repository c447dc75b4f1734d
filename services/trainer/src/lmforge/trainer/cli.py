"""`lmforge-train`: `run` and `preflight` start torchrun for you; `export` writes the serving package;
`report` draws a run's report.html from its metrics.jsonl; `presets` prints the model presets' sizes."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from lmforge.common.errors import CLI_ERRORS, InputError, report_failure
from lmforge.common.logging import get_logger
from lmforge.trainer.planner.command import add_arguments as add_plan_arguments
from lmforge.trainer.planner.command import run as run_plan
from lmforge.trainer.report_html import write_report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="lmforge-train")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="torchrun --standalone --nproc_per_node N -m lmforge.trainer …")
    run.add_argument("--nproc", type=int, default=1)
    run.add_argument("--config")
    run.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    preflight = sub.add_parser("preflight", help="check every rank's device and time an all-reduce, under torchrun")
    preflight.add_argument("--nproc", type=int, default=1)
    preflight.add_argument("--config", help="YAML config file (the training one works; no data needed)")
    preflight.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    export = sub.add_parser("export", help="a committed checkpoint → model.safetensors, config.json, tokenizer.json")
    export.add_argument("--checkpoint", required=True)
    export.add_argument("--output", required=True)
    export.add_argument("--format", choices=("lmforge", "hf"), default="lmforge",
                        help="hf: a Hugging Face transformers directory (AutoModelForCausalLM, vLLM, lm-eval; "
                             "lmforge-serve loads it too); a model no transformers architecture matches exactly "
                             "is refused (exit 2)")
    report = sub.add_parser("report", help="RUN_DIR/metrics.jsonl → a self-contained report.html (the trainer "
                                           "also writes it at each checkpoint and at the end)")
    report.add_argument("--run-dir", required=True)
    report.add_argument("--output", help="default: RUN_DIR/report.html")
    plan = sub.add_parser("plan", help="capacity plan: memory, communication, step time and cost of each parallel "
                                       "layout on a cluster, and the recommended one as chart values")
    add_plan_arguments(plan)
    presets = sub.add_parser("presets", help="every model preset's shape, parameter count and KV-cache size")
    presets.add_argument("--json", action="store_true", help="a JSON list instead of the table")
    args = parser.parse_args(argv)
    if args.command == "plan":
        return run_plan(args)
    if args.command == "report":
        return _report(args.run_dir, args.output)
    if args.command == "presets":
        return _presets(args.json)
    if args.command in ("run", "preflight"):
        module = "lmforge.trainer" if args.command == "run" else "lmforge.trainer.preflight"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
                   "-m", module, *(["--config", args.config] if args.config else []), *args.overrides]
        os.execv(sys.executable, command)  # noqa: S606 - replaces this process with torchrun
    try:
        from lmforge.trainer.export import export as export_package

        path = export_package(args.checkpoint, args.output, package_format=args.format)
        get_logger("trainer").info("exported", checkpoint=args.checkpoint, output=str(path), format=args.format)
    except CLI_ERRORS as exc:
        return report_failure(get_logger("trainer"), "lmforge-train export", exc)
    return 0


def _presets(as_json: bool) -> int:
    import json

    from lmforge.common.model_sizes import format_preset_sizes, preset_sizes, preset_sizes_json

    sizes = preset_sizes()
    print(json.dumps(preset_sizes_json(sizes), indent=1) if as_json else format_preset_sizes(sizes))
    return 0


def _report(run_dir: str, output: str | None) -> int:
    try:
        if not (Path(run_dir) / "metrics.jsonl").is_file():
            raise InputError(f"{run_dir} has no metrics.jsonl: not a run directory, or the run logged nothing yet")
        path = write_report(Path(run_dir), Path(output) if output else None)
    except CLI_ERRORS as exc:
        return report_failure(get_logger("trainer"), "lmforge-train report", exc)
    get_logger("trainer").info("report_written", path=str(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
