"""lmforge-demo: the whole platform on one machine (`make demo`), and `stop` for what a killed
demo left running (`make demo-stop`).

    lmforge-demo run [--config demo.yaml] [--set train.steps=300] [--no-hold]
    lmforge-demo stop [--workdir demo-output]

Exit codes: 0 done (after the summary, Ctrl-C ends it), 2 bad configuration, 1 a stage failed
(its log's tail is printed), 4 the workdir cannot be written (a file in its place, a full disk),
130 interrupted before the summary (everything it started is stopped, no stage's output is left
half-written)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path

from lmforge.common.cli import EXIT_INTERRUPTED, ServiceCli
from lmforge.common.errors import LmforgeError, as_lmforge_error
from lmforge.demo.config import DemoConfig, load_demo_config
from lmforge.demo.processes import StepFailed, stop_recorded
from lmforge.demo.staging import discard_staging

# What "a stage failed" (exit 1) covers; any other OSError is the workdir's (storage, exit 4).
STEP_FAILURES = (StepFailed, LmforgeError, RuntimeError, TimeoutError, FileNotFoundError)


def _say(log, program: str, exc, **context) -> int:
    """The demo's failure line: stdout is its progress display, so no JSON log line."""
    error = as_lmforge_error(exc)
    sys.stderr.write(f"\nlmforge-demo: {error}\n")
    return error.exit_code


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def cmd_stop(args: argparse.Namespace, _config: None) -> int:
    workdir = Path(args.workdir)
    stopped = stop_recorded(workdir)
    discard_staging(workdir)
    print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    return 0


def cmd_run(args: argparse.Namespace, config: DemoConfig) -> int:
    if args.no_hold:
        config.hold = False
    from lmforge.demo.platform import LocalPlatform

    signal.signal(signal.SIGTERM, _interrupt)
    demo = LocalPlatform(config)
    try:
        demo.run()
    except KeyboardInterrupt:
        sys.stderr.write("\nlmforge-demo: interrupted; stopping everything it started\n")
        return EXIT_INTERRUPTED
    except STEP_FAILURES as exc:
        sys.stderr.write(f"\nlmforge-demo: {exc}\n")
        return 1
    else:
        if config.hold:
            with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the way a finished demo ends
                demo.hold()
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        demo.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)


def build_cli() -> ServiceCli:
    cli = ServiceCli("lmforge-demo", service=None, description=__doc__, load_config=load_demo_config,
                     config_help="YAML config file (lmforge.demo.config.DemoConfig)", report=_say)
    run = cli.command("run", cmd_run, config="load",
                      help="run the seven stages, print the summary, keep the servers up until Ctrl-C")
    run.add_argument("--no-hold", action="store_true", help="stop the servers after the summary")
    stop = cli.command("stop", cmd_stop, help="stop the processes a demo in WORKDIR left running")
    stop.add_argument("--workdir", default=DemoConfig.model_fields["workdir"].default)
    return cli


CLI = build_cli()
main = CLI.main
