"""`lmforge-train`: `run` and `preflight` start torchrun for you; `export` writes the serving package."""

from __future__ import annotations

import argparse
import os
import sys

from lmforge.common.errors import LmforgeError
from lmforge.common.logging import get_logger


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
    args = parser.parse_args(argv)
    if args.command in ("run", "preflight"):
        module = "lmforge.trainer" if args.command == "run" else "lmforge.trainer.preflight"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
                   "-m", module, *(["--config", args.config] if args.config else []), *args.overrides]
        os.execv(sys.executable, command)  # noqa: S606 - replaces this process with torchrun
    try:
        from lmforge.trainer.export import export as export_package

        path = export_package(args.checkpoint, args.output)
        get_logger("trainer").info("exported", checkpoint=args.checkpoint, output=str(path))
    except LmforgeError as exc:
        sys.stderr.write(f"lmforge-train export: error: {exc}\n")
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
